#!/usr/bin/env python3
"""Checks that a build made by tools/gpu/run.sh took its dependencies from the bundle alone, not
from the packages installed on the machine (on ours they all are: a build that quietly used them
would pass here and fail on the GPU machine).

usage: tools/gpu/check_isolation.py --build DIR --bundle DIR [--cache-only]

Three looks, each naming what it found:
  1. the CMake cache: every path that a find_* or pkg-config result holds (TBB_DIR, GTest_DIR,
     STRATA_HWLOC_LINK_LIBRARIES, pkgcfg_lib_*, ...) lies in the bundle, the CUDA toolkit or NCCL's
     folder, never under /usr/include, /usr/lib, /usr/share or /usr/local;
  2. the headers the compilers read (ninja -t deps): none of a bundled package's comes from the
     system (/usr/include/tbb, /usr/include/hwloc.h, /usr/include/gtest, ...);
  3. the programs (ldd, without LD_LIBRARY_PATH): oneTBB, hwloc, jemalloc and Google Benchmark
     load from the bundle.
--cache-only does the first alone (it needs no build). Exit status 1 when any look fails.
"""

import argparse
import os
import re
import subprocess
import sys

SYSTEM = ("/usr/include", "/usr/lib", "/usr/share", "/usr/local/include", "/usr/local/lib", "/usr/local/share",
          "/lib", "/lib64")
# The headers and libraries of the bundled packages (tools/gpu/bundle.sh), as the system has them.
PACKAGE_HEADERS = re.compile(r"^/usr(/local)?/include/(tbb/|oneapi/|hwloc|nlohmann/|gtest/|gmock/|benchmark/|CLI/|"
                             r"jemalloc/)")
PACKAGE_LIBS = re.compile(r"lib(tbb|tbbmalloc|hwloc|jemalloc|benchmark|gtest|gmock)[._]")


def cache_entries(build):
    entries = {}
    for line in open(os.path.join(build, "CMakeCache.txt"), errors="replace"):
        m = re.match(r"^([^#/][^:=]*):([A-Z]+)=(.*)$", line.rstrip("\n"))
        if m:
            entries[m.group(1)] = (m.group(2), m.group(3))
    return entries


def allowed_roots(entries, bundle):
    roots = [os.path.realpath(bundle)]
    for key in ("CUDAToolkit_ROOT", "CUDAToolkit_BIN_DIR", "CUDAToolkit_LIBRARY_ROOT", "STRATA_NCCL_INCLUDE_DIR"):
        if key in entries and entries[key][1]:
            value = entries[key][1]
            roots.append(os.path.realpath(os.path.dirname(value) if key.endswith("BIN_DIR") else value))
    if "STRATA_NCCL_LIBRARY" in entries and entries["STRATA_NCCL_LIBRARY"][1]:
        roots.append(os.path.realpath(os.path.dirname(entries["STRATA_NCCL_LIBRARY"][1])))
    return roots


def under(path, roots):
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r + "/") for r in roots)


def check_cache(build, bundle):
    entries = cache_entries(build)
    roots = allowed_roots(entries, bundle)
    problems = []
    # The results of find_package, find_path/find_library and pkg-config: *_DIR, *_INCLUDE_DIR(S),
    # *_LIBRARY/*_LIBRARIES, pkg-config's *_LINK_LIBRARIES, *_INCLUDEDIR, *_LIBDIR, pkgcfg_lib_*.
    wanted = re.compile(r"(_DIR|_INCLUDE_DIRS?|_LIBRARY|_LIBRARIES|_LINK_LIBRARIES|_INCLUDEDIR|_LIBDIR|_PREFIX)$|"
                        r"^pkgcfg_lib_")
    for key, (kind, value) in sorted(entries.items()):
        # CUDAToolkit_rt_LIBRARY: the C library's librt (run.sh names the compiler's), not a package.
        if (not wanted.search(key) or key.startswith(("CMAKE_", "_")) or "NOTFOUND" in value
                or key == "CUDAToolkit_rt_LIBRARY"):
            continue
        for path in re.findall(r"(/[^;\s]+)", value):
            if path.startswith(SYSTEM) and not under(path, roots):
                problems.append(f"{key}={value} is outside the bundle ({path})")
    found = [k for k in ("TBB_DIR", "GTest_DIR", "nlohmann_json_DIR") if k in entries]
    if not found:
        problems.append("the cache has none of TBB_DIR, GTest_DIR, nlohmann_json_DIR: is this a configured Strata build?")
    return problems


def check_headers(build):
    r = subprocess.run(["ninja", "-C", build, "-t", "deps"], capture_output=True, text=True)
    if r.returncode != 0:
        return [f"ninja -t deps failed: {r.stderr.strip()}"]
    problems, target = set(), None
    for line in r.stdout.splitlines():
        if line and not line.startswith(" "):
            target = line.split(":")[0]
            continue
        path = line.strip()
        if PACKAGE_HEADERS.match(path):
            problems.add(f"{target} read {path}")
    return sorted(problems)[:40]


def check_programs(build, bundle):
    roots = [os.path.realpath(bundle)]
    problems = []
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    programs = []
    for top, _, files in os.walk(build):
        if "CMakeFiles" in top or os.sep + "probe" in top:
            continue
        for f in files:
            p = os.path.join(top, f)
            if os.access(p, os.X_OK) and not f.endswith((".sh", ".py", ".so")) and "." not in f:
                with open(p, "rb") as fh:
                    if fh.read(4) == b"\x7fELF":
                        programs.append(p)
    for p in programs:
        r = subprocess.run(["ldd", p], capture_output=True, text=True, env=env)
        for line in r.stdout.splitlines():
            m = re.match(r"\s*(\S+) => (\S+)", line)
            if m and PACKAGE_LIBS.match(m.group(1)):
                if m.group(2) == "not" or not under(m.group(2), roots):
                    problems.append(f"{os.path.relpath(p, build)} loads {m.group(1)} from {m.group(2)}")
    if not programs:
        problems.append("no program was built")
    return problems, len(programs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--cache-only", action="store_true")
    a = ap.parse_args()
    failed = False
    problems = check_cache(a.build, a.bundle)
    print(f"CMake cache: {'ok' if not problems else 'FAILED'}")
    for p in problems:
        print(f"  {p}")
    failed |= bool(problems)
    if not a.cache_only:
        problems = check_headers(a.build)
        print(f"headers (ninja -t deps): {'ok' if not problems else 'FAILED'}")
        for p in problems:
            print(f"  {p}")
        failed |= bool(problems)
        problems, n = check_programs(a.build, a.bundle)
        print(f"programs ({n}, ldd without LD_LIBRARY_PATH): {'ok' if not problems else 'FAILED'}")
        for p in problems:
            print(f"  {p}")
        failed |= bool(problems)
    print("isolation: " + ("FAILED (see above)" if failed else "the build used the bundle alone"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
