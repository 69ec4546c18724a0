#!/usr/bin/env bash
# `pip install ./python` as README.md ("From PyTorch") says, into a fresh virtual environment that sees
# Debian's packages, then strata imported from that environment and one store step run, from a folder
# outside the source tree (the CTest test python_pip_install). Lean: the package is the module of
# the build tree BUILD_DIR (setup.py's STRATA_CMAKE_BUILD_DIR, which it builds as it is configured), so
# nothing is compiled again; --no-index: nothing may be downloaded.
#
#   pip_install.sh PYTHON SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
[ $# -eq 4 ] || { echo "usage: pip_install.sh PYTHON SOURCE_DIR BUILD_DIR WORK_DIR" >&2; exit 2; }
python=$1 src=$2 build=$3 work=$4
rm -rf "$work"
mkdir -p "$work"
# --without-pip: the environment's pip is Debian's own (python3-pip, seen through the system site
# packages), as the one venv would copy in is; copying it takes seconds.
"$python" -m venv --system-site-packages --without-pip "$work/venv"
STRATA_CMAKE_BUILD_DIR=$build "$work/venv/bin/python" -m pip install --no-build-isolation --no-index -q "$src/python"
cd "$work"
"$work/venv/bin/python" - "$work/venv" <<'PY'
import sys
import numpy as np
import strata

venv = sys.argv[1]
assert strata.__file__.startswith(venv), f"strata imported from {strata.__file__}, not from {venv}"
store = strata.Store({"threads": 1, "tables": [{"name": "user", "rows": 100, "dim": 4,
                                                 "optimizer": {"kind": "adagrad", "learning_rate": 0.1}}]})
before = store.read_rows("user", 17, 1)[0].copy()
store.submit(0, {"user": {"keys": np.array([17, 42, 17]), "lengths": np.array([2, 1])}})
out = store.forward(0)[0]
store.backward(0, [np.ones((2, 4), np.float32)])
assert out.shape == (2, 4) and store.step == 1
assert not np.array_equal(before, store.read_rows("user", 17, 1)[0]), "the step updated no row"
print(f"pip-installed strata {strata.__file__}: one store step, step {store.step}")
PY
