#!/usr/bin/env bash
# The `gpu_rehearsal` ctest (tests/gpu/CMakeLists.txt): `strata.sh gpu --rehearse` on a CI machine,
# skipped (exit 77, the test's SKIP_RETURN_CODE) for reasons that are not the code's: a machine that
# is not Debian 12 (the bundle is Debian 12's packages), or packages that cannot be fetched even
# after an apt-get update. The source tree's .gpu-bundle is used when it is complete (no download).
#
# usage: tools/gpu/rehearsal_test.sh REHEARSAL_DIR BUDGET_S
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$1 budget=$2
skip() { echo "gpu_rehearsal: SKIPPED: $*"; exit 77; }

case "$(cat /etc/debian_version 2>/dev/null)" in
  12.*) ;;
  *) skip "not Debian 12 (/etc/debian_version: $(cat /etc/debian_version 2>/dev/null || echo none)); the bundle is Debian 12's packages" ;;
esac
bundle=$work/bundle
if "$root/tools/gpu/bundle.sh" --check --dir "$root/.gpu-bundle"; then
  bundle=$root/.gpu-bundle
  echo "gpu_rehearsal: using the source tree's bundle $bundle"
else
  "$root/tools/gpu/bundle.sh" --dir "$bundle"
  rc=$?
  [ "$rc" = 3 ] && skip "the bundle's packages cannot be fetched (tools/gpu/bundle.sh exit 3, see above)"
  [ "$rc" = 0 ] || exit "$rc"
fi
exec bash "$root/strata.sh" gpu --rehearse --bundle "$bundle" --build "$work/build" --out "$work/out" --budget "$budget"
