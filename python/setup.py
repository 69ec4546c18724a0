"""Builds the package strata with CMake, for pip (python/pyproject.toml; README.md, "From PyTorch").

The extension strata._strata is Strata's CMake target strata_python, built for the Python that runs
pip (Python3_EXECUTABLE) from the repository around this folder; the pure-Python modules are
python/strata/*.py. Environment:

  CMAKE_ARGS              more arguments for the CMake configure, e.g. "-DSTRATA_NATIVE=ON" (a
                          module for this machine's CPU only) or "-DSTRATA_CUDA=OFF"
  STRATA_CMAKE_BUILD_DIR  the CMake build folder (default: one under setuptools' build folder). When
                          it is already configured it is built as it is, not configured again: a
                          build tree (build/default) packages the module it builds, which must be for
                          this Python.
  CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default: every core)
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent  # the repository: its top-level CMakeLists.txt


def version():
    text = (ROOT / "CMakeLists.txt").read_text()
    m = re.search(r"project\(strata VERSION ([0-9.]+)", text)
    if not m:
        sys.exit(f"setup.py: no 'project(strata VERSION x.y.z' in {ROOT / 'CMakeLists.txt'}")
    return m.group(1)


def run(cmd):
    print("+ " + " ".join(shlex.quote(str(c)) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True)


def cmake_build_dir(default):
    given = os.environ.get("STRATA_CMAKE_BUILD_DIR")
    return Path(given).resolve() if given else default


def setuptools_options():
    """With STRATA_CMAKE_BUILD_DIR, setuptools' own build folder and metadata go under it too, so that
    nothing is written into the source tree (else python/build/ and python/strata.egg-info/)."""
    if not os.environ.get("STRATA_CMAKE_BUILD_DIR"):
        return {}
    base = cmake_build_dir(None) / "python" / "setuptools"
    base.mkdir(parents=True, exist_ok=True)
    return {"build": {"build_base": str(base)}, "egg_info": {"egg_base": str(base)}}


class CMakeBuild(build_ext):
    """Configures (unless already configured) and builds the target strata_python, then copies the
    module into the package."""

    def build_extension(self, ext):
        build_dir = cmake_build_dir(Path(self.build_temp).resolve() / "cmake")
        if not (build_dir / "CMakeCache.txt").exists():
            generator = ["-G", "Ninja"] if shutil.which("ninja") else []
            run(["cmake", "-S", ROOT, "-B", build_dir, *generator, "-DCMAKE_BUILD_TYPE=Release",
                 "-DSTRATA_PYTHON=ON", f"-DPython3_EXECUTABLE={sys.executable}", "-DSTRATA_BUILD_TESTS=OFF",
                 "-DSTRATA_BUILD_BENCH=OFF", "-DSTRATA_BUILD_EXAMPLES=OFF", "-DSTRATA_INSTALL=OFF",
                 *shlex.split(os.environ.get("CMAKE_ARGS", ""))])
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        run(["cmake", "--build", build_dir, "--target", "strata_python", "--parallel", jobs])
        name = "_strata" + sysconfig.get_config_var("EXT_SUFFIX")
        built = build_dir / "python" / "strata" / name
        if not built.exists():
            found = sorted(p.name for p in (build_dir / "python" / "strata").glob("_strata*"))
            sys.exit(f"setup.py: {build_dir} built no {name} for {sys.executable} (it has: {found or 'none'}; "
                     "expected a build folder configured with STRATA_PYTHON on for this Python)")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target)


setup(version=version(), ext_modules=[Extension("strata._strata", sources=[])], cmdclass={"build_ext": CMakeBuild},
      options=setuptools_options())
