#!/usr/bin/env bash
# The one prepared GPU run (`./strata.sh gpu`; README, "Testing on a GPU"): on a machine with its own
# image, no package registry and no network, build what the CUDA validation needs from the sources
# and the dependency bundle (tools/gpu/bundle.sh, carried in as .gpu-bundle/), run the CUDA tests
# under STRATA_REQUIRE_GPU=1 and bench/gpu_targets.sh, and leave everything under $OUT.
#
# usage: tools/gpu/run.sh [--rehearse] [--bundle DIR] [--build DIR] [--out DIR] [--jobs N] [--budget S]
#   --rehearse  the same path on a machine without a GPU (CI runs it: tests/gpu/CMakeLists.txt):
#               makes the bundle if it is missing, builds fewer targets, the CUDA tests skip,
#               gpu_targets.sh --quick --backend emu, and the build must have used the bundle
#               alone (tools/gpu/check_isolation.py; any failed step fails the run)
#   --bundle    the bundle (default .gpu-bundle)
#   --build     the build folder (default build/gpu, or build/gpu-rehearse)
#   --out       where the results go (default $OUT, else results/gpu-run-DATE)
#   --jobs      build jobs (default: nproc)
#   --budget    seconds the whole run may take (default 540 on a GPU, 3000 rehearsing); every step
#               gets a timeout inside what is left, and the results are written in any case
#
# It degrades instead of stopping: each bundle library is first tried alone (a program compiled,
# linked and run against it); one that fails is named, and what needs it is left out (GoogleTest:
# no tests; jemalloc: the programs use malloc; CLI11: no benchmarks; oneTBB, hwloc or
# nlohmann-json: Strata cannot build, and only the kernels' resource table is made). A configure
# that fails is retried without NCCL, then without tests; a build keeps going past failed targets
# (ninja -k 0) and what did build runs. Without strata-bench, strata-devbench runs alone (the
# kernels against copies).
#
# $OUT gets at most 8 files (what the device tool brings back): summary.md (read it first),
# run.log (every step's output), targets.json, devbench.json, bench.json, ctest-junit.xml,
# kernel_resources.txt and gpu-run.tar.gz (all of it: per-step logs, the exact commands, nvidia-smi,
# nvcc --version, the CMake cache, the bench HTML). Exit status: 0 when every step passed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD
# The whole script is one function, read before it runs, and called on the script's last line
# together with its exit: editing the file during a run cannot change the run.
main() {

mode=gpu bundle=.gpu-bundle build="" out="" jobs=$(nproc 2>/dev/null || echo 4) budget=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rehearse) mode=rehearse; shift ;;
    --bundle) bundle=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    *) echo "run.sh: unknown argument '$1' (expected --rehearse, --bundle DIR, --build DIR, --out DIR, --jobs N, --budget S)" >&2
       exit 2 ;;
  esac
done
stamp=$(date +%Y%m%d-%H%M%S)
if [ "$mode" = gpu ]; then
  build=${build:-build/gpu} budget=${budget:-540}
  out=${out:-${OUT:-results/gpu-run-$stamp}}
else
  build=${build:-build/gpu-rehearse} budget=${budget:-3000}
  out=${out:-results/gpu-rehearse-$stamp}
fi
abs() { case "$1" in /*) echo "$1" ;; *) echo "$root/$1" ;; esac; }
bundle=$(abs "$bundle") build=$(abs "$build") out=$(abs "$out")
work=$build/run  # every file of this run; packed into $out/gpu-run.tar.gz at the end
rm -rf "$work"
mkdir -p "$work" "$out"
deadline=$((SECONDS + budget))
exec > >(tee -a "$work/run.log") 2>&1

say() { printf '[gpu %s +%ds] %s\n' "$mode" "$SECONDS" "$*"; }
echo "# the commands of this run, in order (tools/gpu/run.sh, mode $mode)" >"$work/commands.sh"
printf 'step\tstatus\tseconds\tnote\n' >"$work/steps.tsv"
failed_steps=""

# step NAME LIMIT COMMAND...: runs COMMAND with a timeout of LIMIT seconds (less if the budget is
# short; skipped when under 10 s are left), its output in $work/NAME.log and on the console,
# its command line in commands.sh and its outcome in steps.tsv. Returns the command's status.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((deadline - SECONDS - 25))  # 25 s kept for writing the results
  [ "$limit" -gt "$left" ] && limit=$left
  printf '%q ' "$@" >>"$work/commands.sh"
  echo >>"$work/commands.sh"
  if [ "$limit" -lt 10 ]; then
    say "$name: skipped, the time budget is spent"
    printf '%s\tskipped\t0\tno time left\n' "$name" >>"$work/steps.tsv"
    failed_steps="$failed_steps $name"
    return 124
  fi
  say "$name (timeout ${limit}s): $*"
  local start=$SECONDS rc
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$work/$name.log"
  rc=${PIPESTATUS[0]}
  local status=ok
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    status=timeout
  elif [ "$rc" -ne 0 ]; then
    status="failed($rc)"
  fi
  [ "$status" = ok ] || failed_steps="$failed_steps $name"
  printf '%s\t%s\t%d\t\n' "$name" "$status" $((SECONDS - start)) >>"$work/steps.tsv"
  say "$name: $status after $((SECONDS - start)) s"
  return "$rc"
}
note() {  # note NAME STATUS TEXT: a step decided here (no command)
  printf '%s\t%s\t0\t%s\n' "$1" "$2" "$3" >>"$work/steps.tsv"
  say "$1: $2: $3"
}

# ---- 1. the machine ----
find_tool() {  # find_tool NAME|PATH...: the first that is on PATH (a name) or executable (a path)
  local c
  for c in "$@"; do
    case "$c" in
      */*) [ -x "$c" ] && { echo "$c"; return 0; } ;;
      ?*) command -v "$c" 2>/dev/null && return 0 ;;
    esac
  done
  return 1
}
# Where pip's cmake and ninja put theirs (the image's PyTorch environment has both), and nvcc's
# usual homes, for a PATH that lacks them.
py_bin() { python3 -c "import $1, sys; sys.stdout.write($2)" 2>/dev/null; }
pip_cmake=$(py_bin cmake 'cmake.CMAKE_BIN_DIR') pip_ninja=$(py_bin ninja 'ninja.BIN_DIR')
nvcc=$(find_tool nvcc /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc) || nvcc=""
cmake=$(find_tool cmake "${pip_cmake:-/nonexistent}/cmake") || cmake=""
ctest=$(find_tool ctest "${pip_cmake:-/nonexistent}/ctest") || ctest=""
ninja=$(find_tool ninja "${pip_ninja:-/nonexistent}/ninja") || ninja=""
cxx=$(find_tool c++ g++ clang++) || cxx=""
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "mode: $mode; jobs: $jobs; budget: ${budget}s; bundle: $bundle; build: $build"
  echo "git: $(git rev-parse HEAD 2>/dev/null || echo 'no git') $(git status --porcelain 2>/dev/null | wc -l) changed files"
  echo "uname: $(uname -a)"
  echo "os: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
  echo "glibc: $glibc; libstdc++: $( (strings "$($cxx -print-file-name=libstdc++.so.6 2>/dev/null)" 2>/dev/null || true) |
    grep -o '^GLIBCXX_[0-9.]*' | sort -t. -k3,3n | tail -n 1)"
  echo "cpus: $(nproc); memory: $(free -g 2>/dev/null | awk '/Mem:/ {print $2 " GiB"}')"
  for t in "$cxx" "$nvcc" "$cmake" "$ninja" python3 nvidia-smi ccache; do
    [ -n "$t" ] && echo "$t: $(command -v "$t" 2>/dev/null || echo "$t") $("$t" --version 2>/dev/null | grep -m 1 -E '[0-9]+\.[0-9]+')"
  done
} >"$work/machine.txt" 2>&1
cat "$work/machine.txt"
[ -n "$nvcc" ] && "$nvcc" --version >"$work/nvcc-version.txt" 2>&1
if command -v nvidia-smi >/dev/null 2>&1; then
  timeout 60 nvidia-smi >"$work/nvidia-smi.txt" 2>&1
  timeout 60 nvidia-smi -q >"$work/nvidia-smi-q.txt" 2>&1
  timeout 30 nvidia-smi topo -m >"$work/nvidia-smi-topo.txt" 2>&1
  cat "$work/nvidia-smi.txt"
else
  echo "no nvidia-smi on this machine" >"$work/nvidia-smi.txt"
fi
if [ "$mode" = gpu ] && [ ! -e /dev/nvidiactl ] && ! command -v nvidia-smi >/dev/null 2>&1; then
  say "WARNING: no NVIDIA driver here (no nvidia-smi, no /dev/nvidiactl): the CUDA tests will fail (STRATA_REQUIRE_GPU=1)"
fi

# ---- 2. the bundle ----
if [ "$mode" = rehearse ]; then
  step bundle 600 "$root/tools/gpu/bundle.sh" --dir "$bundle"
fi
libdir=$bundle/usr/lib/x86_64-linux-gnu
have_bundle=1
if [ ! -f "$bundle/MANIFEST" ]; then
  have_bundle=0
  note bundle missing "no bundle at $bundle: run ./strata.sh bundle on a Debian machine and carry .gpu-bundle"
else
  cp "$bundle/MANIFEST" "$work/bundle-manifest.txt"
  need=$(sed -n 's/^needs glibc: //p' "$bundle/MANIFEST")
  if [ -n "$glibc" ] && [ -n "$need" ] &&
    [ "$(printf '%s\n%s\n' "$need" "$glibc" | sort -t. -k1,1n -k2,2n | head -n 1)" != "$need" ]; then
    say "WARNING: the bundle's libraries need glibc $need, this machine has $glibc: expect them not to load"
  fi
fi

# pkg-config for CMake: the bundle's pkgconf, reading the bundle's .pc files only.
mkdir -p "$build"
cat >"$build/pkg-config" <<EOF
#!/bin/sh
# Written by tools/gpu/run.sh: the bundle's pkgconf, which sees the bundle's packages only.
PKG_CONFIG_LIBDIR='$libdir/pkgconfig:$bundle/usr/share/pkgconfig' PKG_CONFIG_PATH= \\
LD_LIBRARY_PATH='$libdir' exec '$bundle/usr/bin/pkgconf' "\$@"
EOF
chmod +x "$build/pkg-config"

# The runtime libraries the image may lack (libudev for hwloc): extra/ only where needed.
if [ "$have_bundle" = 1 ] && ldd "$libdir/libhwloc.so.15" 2>/dev/null | grep -q 'not found'; then
  say "this image lacks $(ldd "$libdir/libhwloc.so.15" | awk '/not found/ {print $1}' | tr '\n' ' '): using the bundle's extra/"
  export LD_LIBRARY_PATH="$bundle/extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# ---- 3. each bundle library alone ----
# probe NAME LIBS SOURCE: compiles SOURCE against the bundle, links LIBS and runs it.
probe_dir=$build/probe
mkdir -p "$probe_dir"
declare -A probe_ok
probe() {
  local name=$1 libs=$2 src=$3
  printf '%s\n' "$src" >"$probe_dir/$name.cpp"
  # shellcheck disable=SC2086
  if step "probe-$name" 120 sh -c "'$cxx' -std=c++17 -O1 -I'$bundle/usr/include' '$probe_dir/$name.cpp' -o '$probe_dir/$name' \
      -L'$libdir' -Wl,-rpath,'$libdir' $libs -pthread && '$probe_dir/$name'"; then
    probe_ok[$name]=1
  else
    probe_ok[$name]=0
  fi
}
if [ "$have_bundle" = 1 ] && [ -n "$cxx" ]; then
  probe tbb -ltbb '#include <tbb/parallel_for.h>
#include <atomic>
int main() { std::atomic<int> n{0}; tbb::parallel_for(0, 1000, [&](int) { ++n; }); return n == 1000 ? 0 : 1; }'
  probe hwloc -lhwloc '#include <hwloc.h>
#include <cstdio>
int main() { hwloc_topology_t t; if (hwloc_topology_init(&t) || hwloc_topology_load(t)) return 1;
  std::printf("cores %d numa %d\n", hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE), hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE));
  hwloc_topology_destroy(t); return 0; }'
  probe jemalloc -ljemalloc '#include <jemalloc/jemalloc.h>
#include <cstdio>
int main() { const char* v = nullptr; size_t n = sizeof(v); if (mallctl("version", &v, &n, nullptr, 0)) return 1;
  void* p = malloc(1 << 20); std::printf("jemalloc %s\n", v); free(p); return 0; }'
  probe gtest "$libdir/libgmock.a $libdir/libgtest_main.a $libdir/libgtest.a" '#include <gmock/gmock.h>
#include <gtest/gtest.h>
TEST(Probe, Links) { EXPECT_THAT(1, ::testing::Eq(1)); }'
  probe json "" '#include <nlohmann/json.hpp>
int main() { return nlohmann::json::parse("{\"a\": [1, 2]}")["a"][1] == 2 ? 0 : 1; }'
  probe cli11 "" '#include <CLI/CLI.hpp>
int main(int argc, char** argv) { CLI::App app; int n = 0; app.add_option("-n", n); CLI11_PARSE(app, argc, argv); return n; }'
fi
ok() { [ "${probe_ok[$1]:-0}" = 1 ]; }

# ---- 4. the kernels' resource table (nvcc alone: needs no bundle) ----
if [ "$mode" = gpu ] && [ -n "$nvcc" ]; then
  step kernel-resources 240 python3 "$root/tools/gpu/kernel_resources.py" --nvcc "$nvcc" --check --write "$work/kernel_resources.txt"
fi

# ---- 5. configure ----
built=0
if [ "$have_bundle" = 0 ] || [ -z "$cxx" ] || [ -z "$cmake" ] || ! ok tbb || ! ok hwloc || ! ok json; then
  why="no bundle"
  [ "$have_bundle" = 1 ] && why="the bundle's $(for l in tbb hwloc json; do ok "$l" || printf '%s ' "$l"; done)failed here (see probe-*.log)"
  [ -z "$cxx" ] && why="no C++ compiler"
  [ -z "$cmake" ] && why="no cmake"
  note configure skipped "Strata cannot build: $why; only the machine's description and the kernels' resource table are made"
  failed_steps="$failed_steps configure"
else
  tests=ON jemalloc=ON bench=ON
  ok gtest || { tests=OFF; say "GoogleTest failed here: building without tests"; }
  ok jemalloc || { jemalloc=OFF; say "jemalloc failed here: Strata's programs use the system malloc"; }
  ok cli11 || { bench=OFF; say "CLI11 failed here: no strata-devbench or strata-bench"; }
  # Named in full: with the system and PATH prefixes off, CMake would not find them itself.
  generator=Ninja make_program=(-DCMAKE_MAKE_PROGRAM="$ninja")
  [ -z "$ninja" ] && generator="Unix Makefiles" make_program=()
  cuda_args=()
  if [ -n "$nvcc" ]; then
    cuda_root=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
    cuda_args=(-DCMAKE_CUDA_COMPILER="$nvcc" -DCUDAToolkit_ROOT="$cuda_root" -DCMAKE_CUDA_ARCHITECTURES=90)
    # librt, which CUDA::cudart_static names: the C library's own (a stub since glibc 2.34), which
    # CMake would not find with the system paths off.
    rt=$("$cxx" -print-file-name=librt.a)
    [ -f "$rt" ] && cuda_args+=(-DCUDAToolkit_rt_LIBRARY="$rt")
    # NCCL: the toolkit's own, else the one PyTorch's wheels bring (nvidia-nccl-cu13).
    nccl_inc="" nccl_lib=""
    for d in "$cuda_root/include" "$cuda_root/targets/x86_64-linux/include"; do
      [ -f "$d/nccl.h" ] && { nccl_inc=$d; break; }
    done
    for f in "$cuda_root"/lib64/libnccl.so* "$cuda_root"/lib/libnccl.so* "$cuda_root"/targets/x86_64-linux/lib/libnccl.so*; do
      [ -e "$f" ] && { nccl_lib=$f; break; }
    done
    if [ -z "$nccl_inc" ] || [ -z "$nccl_lib" ]; then
      py_nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null)
      if [ -n "$py_nccl" ] && [ -f "$py_nccl/include/nccl.h" ]; then
        nccl_inc=$py_nccl/include
        nccl_lib=$(ls "$py_nccl"/lib/libnccl.so* 2>/dev/null | head -n 1)
      fi
    fi
    if [ -n "$nccl_inc" ] && [ -n "$nccl_lib" ]; then
      say "NCCL: $nccl_inc, $nccl_lib"
      cuda_args+=(-DSTRATA_NCCL=AUTO -DSTRATA_NCCL_INCLUDE_DIR="$nccl_inc" -DSTRATA_NCCL_LIBRARY="$nccl_lib")
    else
      say "no NCCL found (toolkit, python3's nvidia.nccl): building without the nccl communicator"
      cuda_args+=(-DSTRATA_NCCL=OFF)
    fi
  else
    say "no nvcc: building without the CUDA backend"
  fi
  [ "$mode" = gpu ] && cuda_args+=(-DSTRATA_CUDA=ON)
  launcher=()
  if [ "$mode" = rehearse ] && command -v ccache >/dev/null 2>&1; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  # Rehearsing checks the build path, not speed: C++ at -O0 (STRATA_QUICK_BUILD; the GPU run keeps
  # Release's -O3). CI runs the rehearsal without ccache: its build took 683 s of two cores at -O3,
  # 946 s at -O1 on a loaded machine.
  quick=()
  [ "$mode" = rehearse ] && quick=(-DSTRATA_QUICK_BUILD=ON)
  # Only the bundle: no system prefixes (/usr, /usr/local), none from PATH or the environment, no
  # package registries; pkg-config sees the bundle's .pc files alone (the wrapper above).
  # Left out: MPI (not needed for the CUDA path; no OpenMPI there), the Python module, the
  # example, the install rules; Release, for sm_90 only, to build in time.
  configure() {  # configure EXTRA_ARGS...
    rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
    step "configure$1" 300 "$cmake" -S "$root" -B "$build" -G "$generator" -DCMAKE_BUILD_TYPE=Release -DSTRATA_NATIVE=ON \
      -DCMAKE_CXX_COMPILER="$cxx" "${make_program[@]}" \
      -DCMAKE_PREFIX_PATH="$bundle/usr" -DCMAKE_FIND_USE_CMAKE_SYSTEM_PATH=OFF \
      -DCMAKE_FIND_USE_SYSTEM_ENVIRONMENT_PATH=OFF -DCMAKE_FIND_USE_CMAKE_ENVIRONMENT_PATH=OFF \
      -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF \
      -DPKG_CONFIG_EXECUTABLE="$build/pkg-config" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
      -DSTRATA_MPI=OFF -DSTRATA_PYTHON=OFF -DSTRATA_BUILD_EXAMPLES=OFF \
      -DSTRATA_INSTALL=OFF -DSTRATA_BUILD_TESTS="$tests" -DSTRATA_BUILD_BENCH="$bench" \
      -DSTRATA_USE_JEMALLOC="$jemalloc" -DSTRATA_TEST_GPU_REHEARSAL=OFF "${cuda_args[@]}" "${launcher[@]}" "${quick[@]}" "${@:2}"
  }
  # Retries, each keeping what the one before gave up: without NCCL; with nvcc told to accept a
  # host compiler newer than it knows; without tests.
  if configure ""; then
    built=1
  elif [ -n "$nvcc" ] && configure "-no-nccl" -DSTRATA_NCCL=OFF; then
    built=1
  elif [ -n "$nvcc" ] && configure "-any-host-compiler" -DSTRATA_NCCL=OFF -DCMAKE_CUDA_FLAGS=-allow-unsupported-compiler; then
    built=1
  elif [ "$tests" = ON ] && configure "-no-tests" -DSTRATA_NCCL=OFF -DCMAKE_CUDA_FLAGS=-allow-unsupported-compiler \
    -DSTRATA_BUILD_TESTS=OFF; then
    built=1 tests=OFF
  fi
fi

# ---- 6. build ----
# The CUDA validation: every binary with CUDA cases, and the two benchmarks. Rehearsing, fewer: one
# test binary (GoogleTest, gmock) and the benchmarks (CLI11, nlohmann-json, jemalloc) link every
# bundle library the GPU build links.
if [ "$mode" = gpu ]; then
  want=(gpu_test gpu_cuda_only_test gpu_cuda_context_test gpu_cuda_range_test gpu_cuda_runtime_test
        gpu_store_device_test store_test dispatch_nccl_test strata-devbench strata-bench strata-micro-checkpoint)
else
  want=(gpu_cuda_only_test strata-devbench strata-bench)
fi
# (The target list is read whole first: grep -q quitting early would fail the pipe under pipefail.)
have_target() { grep -q -E "(^|[[:space:]])$1: " <<<"$target_list"; }
exe() { find "$build" -type f -name "$1" -perm -u+x 2>/dev/null | head -n 1; }
if [ "$built" = 1 ]; then
  cp "$build/CMakeCache.txt" "$work/CMakeCache.txt"
  target_list=$("$cmake" --build "$build" --target help 2>/dev/null)
  targets=()
  for t in "${want[@]}"; do have_target "$t" && targets+=("$t"); done
  keep_going=(-k 0)
  [ "$generator" = Ninja ] || keep_going=(-k)
  build_limit=480
  [ "$mode" = rehearse ] && build_limit=2400  # two shared cores, not sixteen
  step build "$build_limit" "$cmake" --build "$build" -j "$jobs" --target "${targets[@]}" -- "${keep_going[@]}"
  # Built means up to date now (ninja has no work left for it), not a binary left by an earlier run.
  up_to_date() {
    if [ "$generator" = Ninja ]; then
      "$ninja" -C "$build" -n "$1" 2>/dev/null | grep -q '^ninja: no work to do'
    else
      [ -n "$(exe "$1")" ]
    fi
  }
  for t in "${want[@]}"; do
    if ! have_target "$t"; then
      echo "$t: not in this configuration"
    elif up_to_date "$t"; then
      echo "$t: built"
    else
      echo "$t: NOT built (see build.log)"
    fi
  done | tee "$work/targets-built.txt"
  # A wanted target that exists but did not build fails the run (the rest still runs).
  if grep -q 'NOT built' "$work/targets-built.txt"; then
    case " $failed_steps " in *" build "*) ;; *) failed_steps="$failed_steps build" ;; esac
  fi
  if [ "$mode" = rehearse ]; then
    step isolation 120 python3 "$root/tools/gpu/check_isolation.py" --build "$build" --bundle "$bundle"
  else
    # On the GPU machine the check only informs (its image may hold a package of the same name).
    step isolation 120 python3 "$root/tools/gpu/check_isolation.py" --build "$build" --bundle "$bundle" || true
  fi
fi

# ---- 7. the CUDA tests ----
# Every test case of the CUDA-only binaries and the cuda cases of the others have Cuda, CUDA or
# Nccl in their names (tests/gpu/CMakeLists.txt); the placeholders of binaries that did not build
# (*_NOT_BUILT) are left out here and named in targets-built.txt.
cuda_tests='[Cc]uda|CUDA|[Nn]ccl|NCCL'
if [ "$built" = 1 ] && [ "$tests" = ON ] && [ -n "$ctest" ]; then
  if [ "$mode" = gpu ]; then export STRATA_REQUIRE_GPU=1; fi
  # At most what leaves 3 minutes for gpu_targets.sh (the figures), at least one.
  ctest_limit=$((deadline - SECONDS - 25 - 180))
  [ "$ctest_limit" -gt 360 ] && ctest_limit=360
  [ "$ctest_limit" -lt 60 ] && ctest_limit=60
  step ctest "$ctest_limit" "$ctest" --test-dir "$build" -R "$cuda_tests" -E '_NOT_BUILT' -j 8 --timeout 240 --no-tests=error \
    --output-on-failure --output-junit "$work/ctest-junit.xml"
  unset STRATA_REQUIRE_GPU
fi

# ---- 8. bench/gpu_targets.sh ----
built_ok() { grep -q "^$1: built" "$work/targets-built.txt" 2>/dev/null; }
bench_dir=$(dirname "$(exe strata-devbench)")
if built_ok strata-devbench; then
  targets_args=(--backend cuda --no-tests --bin "$bench_dir" --out "$work/targets")
  [ "$mode" = rehearse ] && targets_args=(--backend emu --quick --no-tests --bin "$bench_dir" --out "$work/targets")
  if [ "$mode" = gpu ] && [ $((deadline - SECONDS)) -lt 240 ]; then
    say "under 4 minutes left: gpu_targets.sh --quick (small sizes, on the GPU all the same)"
    targets_args+=(--quick)
  fi
  if ! built_ok strata-bench; then
    say "strata-bench did not build: strata-devbench alone (the kernels against copies)"
    targets_args+=(--only devbench)
  fi
  step gpu-targets 360 bash "$root/bench/gpu_targets.sh" "${targets_args[@]}"
elif [ "$built" = 1 ]; then
  note gpu-targets skipped "strata-devbench did not build"
  failed_steps="$failed_steps gpu-targets"
fi

# ---- 9. the results ----
python3 - "$work" "$mode" "$failed_steps" >"$work/summary.md" <<'PY' || echo "summary failed" >>"$work/summary.md"
import json, os, re, sys, xml.etree.ElementTree as ET
work, mode, failed = sys.argv[1], sys.argv[2], sys.argv[3].split()
def read(name):
    p = os.path.join(work, name)
    return open(p, errors="replace").read() if os.path.exists(p) else ""
print(f"# Strata GPU run ({mode})\n")
print("Verdict: " + ("every step passed" if not failed else "FAILED or skipped steps: " + ", ".join(failed)) + "\n")
print("## Machine\n```\n" + read("machine.txt").strip() + "\n```\n")
smi = read("nvidia-smi.txt").strip()
if smi:
    print("```\n" + smi + "\n```\n")
print("## Steps\n\n| step | status | seconds | note |\n| --- | --- | --- | --- |")
for line in read("steps.tsv").splitlines()[1:]:
    cells = (line.split("\t") + ["", "", "", ""])[:4]
    print("| " + " | ".join(cells) + " |")
print()
built = read("targets-built.txt").strip()
if built:
    print("## Targets\n```\n" + built + "\n```\n")
junit = os.path.join(work, "ctest-junit.xml")
if os.path.exists(junit):
    try:
        suite = ET.parse(junit).getroot()
        cases = suite.iter("testcase")
        counts = {"passed": 0, "failed": 0, "skipped": 0}
        bad = []
        for c in cases:
            status = c.get("status", "run")
            if c.find("failure") is not None or status == "fail":
                counts["failed"] += 1
                bad.append(c.get("name"))
            elif c.find("skipped") is not None or status in ("disabled", "notrun"):
                counts["skipped"] += 1
            else:
                counts["passed"] += 1
        print(f"## CUDA tests\n{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped\n")
        for n in bad[:60]:
            print(f"- FAILED {n}")
        if len(bad) > 60:
            print(f"- ... and {len(bad) - 60} more (ctest-junit.xml, ctest.log)")
        print()
    except ET.ParseError as e:
        print(f"## CUDA tests\nctest-junit.xml unreadable: {e}\n")
ctest_log = read("ctest.log")
m = re.findall(r"^\d+% tests passed.*$", ctest_log, re.M)
if m:
    print("ctest: " + m[-1] + "\n")
t = os.path.join(work, "targets", "targets.json")
if os.path.exists(t):
    tj = json.load(open(t))
    print(f"## GPU targets ({tj['device'].get('name')}, {tj['device'].get('backend')})\n")
    print("| target | value | goal | met |\n| --- | --- | --- | --- |")
    for k, v in tj.items():
        if k == "device":
            continue
        val = "n/a" if v.get("value") is None else f"{v['value']:.3f}"
        met = ("met" if v["met"] else "NOT met") if "met" in v else v.get("why", "")
        print(f"| {k} | {val} | {'>=' if v['at_least'] else '<='} {v['target']} | {met} |")
    print()
res = read("kernel-resources.log").strip()
if res:
    print("## Kernel resources (sm_90, nvcc -Xptxas -v)\n```\n" + res[-3000:] + "\n```\n")
print("## Commands\n```\n" + read("commands.sh").strip() + "\n```")
PY

for f in targets/targets.json targets/devbench.json targets/bench.json; do
  [ -f "$work/$f" ] && cp "$work/$f" "$out/"
done
[ -f "$work/ctest-junit.xml" ] && cp "$work/ctest-junit.xml" "$out/"
[ -f "$work/kernel_resources.txt" ] && cp "$work/kernel_resources.txt" "$out/"
cp "$work/summary.md" "$out/summary.md"
say "done: $( [ -z "$failed_steps" ] && echo 'every step passed' || echo "failed or skipped:$failed_steps"); results in $out"
cp "$work/run.log" "$out/run.log"
tar -czf "$out/gpu-run.tar.gz" -C "$build" run 2>/dev/null
cat "$work/summary.md" | sed -n '/^## Steps/,/^## Commands/p' | grep -v '^## Commands'
[ -z "$failed_steps" ]
}
main "$@"; exit
