#!/usr/bin/env bash
# Strata's one entry point: setup | build | test | bench | peers | lint | bundle | gpu. See README.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

# Debian packages the build and tests need (Debian 12).
CORE_PACKAGES=(build-essential cmake ninja-build pkg-config git
  libhwloc-dev hwloc libtbb-dev libjemalloc-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin nlohmann-json3-dev libcli11-dev
  python3  # python3: the summary of bench/gpu_targets.sh (and its test)
  # The Python package (python/) and its tests: Debian's python3 with headers, pybind11, NumPy,
  # pytest and PyTorch (strata.torch and its equivalence tests against torch.nn.EmbeddingBag); and
  # `pip install --no-build-isolation ./python` into a virtual environment (pip, venv, setuptools, wheel).
  python3-dev pybind11-dev python3-numpy python3-pytest python3-torch
  python3-pip python3-venv python3-setuptools python3-wheel)
# The PyTorch peer benchmark (bench/peers): already in CORE_PACKAGES since the Python package's
# tests need torch; kept so that `setup --peers` stays a complete list for it.
PEER_PACKAGES=(python3-torch python3-numpy)

log() { printf '[strata] %s\n' "$*" >&2; }

missing_packages() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}

install_packages() {
  local missing
  missing=$(missing_packages "$@")
  [ -z "$missing" ] && return 0
  log "installing: $(echo $missing | tr '\n' ' ')"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  # shellcheck disable=SC2086
  $sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

cmd_setup() {
  install_packages "${CORE_PACKAGES[@]}"
  if [ "${1:-}" = "--peers" ]; then install_packages "${PEER_PACKAGES[@]}"; fi
}

preset_of() { echo "${1:-default}"; }

cmd_build() {
  local preset
  preset=$(preset_of "${1:-}")
  cmd_setup
  if [ ! -f "build/$preset/build.ninja" ] && [ ! -f "build/$preset/Makefile" ]; then
    cmake --preset "$preset" -G Ninja >/dev/null
  fi
  cmake --build --preset "$preset" -j "$(nproc)"
}

cmd_test() {
  local preset
  preset=$(preset_of "${1:-}")
  cmd_build "$preset"
  ctest --preset "$preset" -j "$(nproc)"
}

# The cache sizes `bench` sweeps by default (fractions of every table's rows).
BENCH_SWEEP=0.05,0.1,0.2,0.4

cmd_bench() {
  cmd_build default
  local out="results/bench-$(date +%Y%m%d-%H%M%S)"
  mkdir -p "$out"
  log "placement-mode benchmark; results in $out/"
  # Defaults go first: strata-bench takes the last value of a flag, so "$@" overrides them
  # (--sweep-cache '' turns the sweep off). The console table is kept next to the JSON and HTML.
  ./build/default/bench/strata-bench --json "$out/bench.json" --html "$out/bench.html" \
    --sweep-cache "$BENCH_SWEEP" "$@" | tee "$out/console.txt"
  log "wrote $out/bench.json, $out/bench.html and $out/console.txt"
}

# The repository's own C++ files (clang-format applies to these; build trees are not tracked).
cpp_files() { git ls-files -- '*.cpp' '*.hpp' '*.cu' '*.cuh'; }

# The libraries' folders: `lint --all` runs clang-tidy over every translation unit under them.
LIBRARY_DIRS=(core host gpu cache dispatch store python/src)

# Every C++ translation unit of the libraries in the default preset's compile_commands.json (configured
# first if missing: clang-tidy needs the compile commands, not a build). The .cu files are left out:
# clang-tidy would parse them with clang's own CUDA front end, which takes neither nvcc's flags in their
# compile commands (--generate-code, -fmad=false, --Werror=all-warnings) nor CUDA 13's headers (clang 14
# knows CUDA up to 11.5); their device code is gpu/kernels/bodies.hpp, which the host compiler builds
# for the emulated device and clang-tidy checks through gpu/kernels/host_grid.cpp.
tidy_all() {
  if [ ! -f build/default/compile_commands.json ]; then
    cmd_setup  # the packages the configure looks for
    cmake --preset default -G Ninja >/dev/null
  fi
  local root dirs
  root=$(printf '%s' "$PWD" | sed 's/[][\.*^$+?(){}|]/\\&/g')
  dirs=$(IFS='|'; echo "${LIBRARY_DIRS[*]}")
  log "clang-tidy: every C++ file of ${LIBRARY_DIRS[*]} (.clang-tidy), $(nproc) at a time"
  # run-clang-tidy (Debian's clang-tidy package) runs one clang-tidy per file in parallel and prints each
  # file's findings together; the invocation lines and the compiler's "N warnings generated" are noise.
  # Its whole output is kept in build/default/clang-tidy.log.
  local rc=0
  run-clang-tidy -p build/default -j "$(nproc)" -quiet "^$root/($dirs)/.*\.cpp\$" >build/default/clang-tidy.log 2>&1 ||
    rc=$?
  grep -v -E '^(/usr/bin/)?clang-tidy(-[0-9]+)? |^[0-9]+ warnings? (and [0-9]+ errors? )?generated\.$' \
    build/default/clang-tidy.log || true
  if [ "$rc" -ne 0 ]; then
    log "clang-tidy found the problems above (.clang-tidy has WarningsAsErrors; all: build/default/clang-tidy.log)"
    return "$rc"
  fi
  log "clang-tidy: $(grep -c -E '^(/usr/bin/)?clang-tidy(-[0-9]+)? ' build/default/clang-tidy.log) files, no finding"
}

# House habits, checked: every C++ file formatted by .clang-format (what CI runs), and clang-tidy
# (.clang-tidy) on the C++ sources changed against LINT_BASE (default: HEAD, i.e. uncommitted
# changes), with the default preset's compile_commands.json; `lint --all` runs clang-tidy over every
# translation unit of the libraries instead (CI runs it). `lint --fix` formats in place.
cmd_lint() {
  install_packages clang-format clang-tidy git
  if [ "${1:-}" = "--fix" ]; then
    cpp_files | xargs clang-format -i
    log "formatted $(cpp_files | wc -l) files"
    return 0
  fi
  if ! cpp_files | xargs clang-format --dry-run --Werror 2>/tmp/strata-format.$$; then
    grep -o '^[^:]*:[0-9]*:[0-9]*: error' /tmp/strata-format.$$ | cut -d: -f1 | sort -u | sed 's/^/  /' >&2
    rm -f /tmp/strata-format.$$
    log "these files differ from .clang-format: ./strata.sh lint --fix formats them"
    return 1
  fi
  rm -f /tmp/strata-format.$$
  log "format: $(cpp_files | wc -l) files match .clang-format"
  if [ "${1:-}" = "--all" ]; then
    tidy_all
    return
  fi
  local changed
  changed=$(git diff --name-only --diff-filter=d "${LINT_BASE:-HEAD}" -- '*.cpp' | grep -v '^tests/' || true)
  if [ -n "$changed" ]; then
    [ -f build/default/compile_commands.json ] || cmd_build default
    # shellcheck disable=SC2086
    clang-tidy -p build/default --quiet $changed
  fi
}

cmd_peers() {
  cmd_setup --peers
  cmd_build default
  bash bench/peers/compare_torch.sh "$@"
}

# The GPU machine (README, "Testing on a GPU"): `bundle` fetches the Debian packages the build needs
# into .gpu-bundle/ (here, with apt-get; carried to that machine, which has no registry), `gpu` is
# the one command run there (tools/gpu/run.sh builds from the sources and the bundle, runs the CUDA
# tests and bench/gpu_targets.sh, writes $OUT), `gpu --rehearse` the same here without a GPU.
# Neither installs anything: `gpu` runs where nothing can be installed.
cmd_bundle() { bash tools/gpu/bundle.sh "$@"; }
cmd_gpu() { bash tools/gpu/run.sh "$@"; }

usage() {
  cat <<'USAGE'
usage: ./strata.sh COMMAND [ARGS]
  setup [--peers]     install missing Debian packages (idempotent; PyTorch is among them)
  build [PRESET]      configure and build (presets: default, asan, tsan, minimal)
  test  [PRESET]      build and run the preset's tests with ctest (all but for minimal)
  bench [FLAGS]       run strata-bench on the built-in workload with a cache sweep (flags go to strata-bench)
  peers [FLAGS]       Strata cpu mode vs torch.nn.EmbeddingBag on the same keys, with ratios
  lint [--all|--fix]  check every C++ file against .clang-format, clang-tidy on changed sources
                      (LINT_BASE=<rev>, default HEAD); --all: clang-tidy on every library file instead
                      (CI runs it); --fix formats every C++ file
  bundle [--force]    fetch the GPU run's dependency bundle into .gpu-bundle/ (Debian packages, ~8 MB)
  gpu [--rehearse]    the GPU machine's one command: build from the sources and .gpu-bundle/, run the
                      CUDA tests and bench/gpu_targets.sh, results in $OUT (--rehearse: here, no GPU;
                      other flags: tools/gpu/run.sh)
USAGE
}

case "${1:-}" in
  setup) shift; cmd_setup "$@" ;;
  build) shift; cmd_build "$@" ;;
  test) shift; cmd_test "$@" ;;
  bench) shift; cmd_bench "$@" ;;
  peers) shift; cmd_peers "$@" ;;
  lint) shift; cmd_lint "$@" ;;
  bundle) shift; cmd_bundle "$@" ;;
  gpu) shift; cmd_gpu "$@" ;;
  -h|--help|help|"") usage ;;
  *) usage; exit 2 ;;
esac
