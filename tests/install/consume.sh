#!/usr/bin/env bash
# Uses an installed Strata the way its users do (run by the install_* CTest tests, see
# tests/install/CMakeLists.txt; also by .ci/run on a build without MPI, NCCL and jemalloc).
#
#   consume.sh install BUILD_DIR PREFIX
#       cmake --install BUILD_DIR into PREFIX, emptied first (nothing left from an earlier install).
#   consume.sh example PREFIX EXAMPLES_DIR WORK_DIR WITHOUT [CMAKE_ARGS...]
#       configures EXAMPLES_DIR as its own project against PREFIX (find_package(strata CONFIG
#       REQUIRED)), builds it and runs the trainer.
#   consume.sh readme-cmake PREFIX README WORK_DIR WITHOUT [CMAKE_ARGS...]
#       the C++ program and the CMake lines of README's "Use Strata from your project" section, as
#       written there: configured against PREFIX, built and run.
#   consume.sh readme-pkgconfig PREFIX README WORK_DIR WITHOUT
#       the same program built with the section's pkg-config command line, as written there, and run;
#       then every header installed under PREFIX compiled in one file with pkg-config's flags only.
#   consume.sh headers PREFIX WORK_DIR
#       the installed headers are the public API only (no detail/, no kernel bodies, no engines),
#       and each compiles alone, in a file of its own, with pkg-config's flags only ($CXX, else c++).
#   consume.sh host-layer PREFIX WORK_DIR [CMAKE_ARGS...]
#       a project that uses strata::host alone (find_package(strata CONFIG REQUIRED COMPONENTS host))
#       configures, builds and runs with MPI and CUDA made unfindable, and never looks for NCCL, however
#       this Strata was built; and an unknown component is refused by name.
#   consume.sh tools PREFIX WORK_DIR
#       the installed strata-tune and strata-bench, copied with share/ to another folder (a moved
#       prefix) and run there, find their hardware profiles by name beside them: one that exists only
#       there proves they do not read the source tree's.
#
# WITHOUT: comma-separated libraries (jemalloc, mpi, nccl, cudart) that the programs built must
# not load (ldd) and that pkg-config's flags must not name ("-" for none).
set -euo pipefail

die() { echo "consume.sh: $*" >&2; exit 1; }

SECTION="## Use Strata from your project"

# The first ```LANG block of README's section, printed as written.
readme_block() {
  local readme=$1 lang=$2
  awk -v section="$SECTION" -v lang="$lang" '
    /^## / { in_section = ($0 == section) }
    in_section && /^```/ {
      if (in_block) { in_block = 0; done = 1 } else if ($0 == "```" lang && !done) { in_block = 1 }
      next
    }
    in_block { print }' "$readme"
}

# Fails when a program loads a library it must not.
check_without() {
  local program=$1 without=$2 lib
  [ "$without" = "-" ] && return 0
  local libs
  libs=$(ldd "$program")
  for lib in ${without//,/ }; do
    if grep -qi "lib$lib" <<<"$libs"; then
      die "$program loads lib$lib, which a user of this build must not need:"$'\n'"$libs"
    fi
  done
}

cmake_project() {  # SOURCE_DIR WORK_DIR PREFIX [CMAKE_ARGS...]
  local src=$1 work=$2 prefix=$3
  shift 3
  rm -rf "$work/build"
  cmake -S "$src" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" "$@"
  cmake --build "$work/build"
}

# Points pkg-config at the strata.pc installed under PREFIX.
use_pkgconfig() {
  local pc
  pc=$(find "$1" -name strata.pc -path '*/pkgconfig/*' | head -n1)
  [ -n "$pc" ] || die "no strata.pc under $1"
  export PKG_CONFIG_PATH
  PKG_CONFIG_PATH=$(dirname "$pc")
}

mode=${1:-}
shift || true
case "$mode" in
  install)
    [ $# -eq 2 ] || die "usage: consume.sh install BUILD_DIR PREFIX"
    rm -rf "$2"
    cmake --install "$1" --prefix "$2"
    ;;
  example)
    [ $# -ge 4 ] || die "usage: consume.sh example PREFIX EXAMPLES_DIR WORK_DIR WITHOUT [CMAKE_ARGS...]"
    prefix=$1 src=$2 work=$3 without=$4
    shift 4
    rm -rf "$work"
    cmake_project "$src" "$work" "$prefix" "$@"
    program="$work/build/strata-example-trainer"
    check_without "$program" "$without"
    "$program" "$work/checkpoint"
    ;;
  readme-cmake)
    [ $# -ge 4 ] || die "usage: consume.sh readme-cmake PREFIX README WORK_DIR WITHOUT [CMAKE_ARGS...]"
    prefix=$1 readme=$2 work=$3 without=$4
    shift 4
    rm -rf "$work"
    mkdir -p "$work/src"
    readme_block "$readme" cmake >"$work/src/CMakeLists.txt"
    readme_block "$readme" cpp >"$work/src/trainer.cpp"
    [ -s "$work/src/CMakeLists.txt" ] || die "no \`\`\`cmake block in the section '$SECTION' of $readme"
    [ -s "$work/src/trainer.cpp" ] || die "no \`\`\`cpp block in the section '$SECTION' of $readme"
    cmake_project "$work/src" "$work" "$prefix" "$@"
    check_without "$work/build/trainer" "$without"
    (cd "$work" && ./build/trainer)
    ;;
  readme-pkgconfig)
    [ $# -eq 4 ] || die "usage: consume.sh readme-pkgconfig PREFIX README WORK_DIR WITHOUT"
    prefix=$1 readme=$2 work=$3 without=$4
    rm -rf "$work"
    mkdir -p "$work"
    readme_block "$readme" cpp >"$work/trainer.cpp"
    line=$(readme_block "$readme" sh | grep -m1 'pkg-config' || true)
    [ -n "$line" ] || die "no pkg-config line in a \`\`\`sh block of the section '$SECTION' of $readme"
    use_pkgconfig "$prefix"
    flags=$(pkg-config --cflags --libs strata)
    echo "pkg-config --cflags --libs strata: $flags"
    if [ "$without" != "-" ]; then
      for lib in ${without//,/ }; do
        if grep -qi "$lib" <<<"$flags"; then die "strata.pc names $lib, which this build does not use"; fi
      done
    fi
    # No library file of this machine by absolute path: Strata's archives come from the prefix
    # (${libdir}), every other absolute folder of strata.pc's own is one of its *_libdir variables (a
    # user redefines it with --define-variable); what the modules it requires (tbb, hwloc, MPI's) print
    # is theirs.
    libdir=$(pkg-config --variable=libdir strata)
    dirs=$(pkg-config --print-variables strata | { grep '_libdir$' || true; } | while read -r v; do pkg-config --variable="$v" strata; done)
    # shellcheck disable=SC2046
    required=" $(pkg-config --cflags --libs $(pkg-config --print-requires strata | cut -d' ' -f1)) "
    for token in $flags; do
      [[ $required == *" $token "* ]] && continue
      path=${token#-L}
      path=${path#-Wl,-rpath,}
      path=${path#-I}
      [[ $path == /* ]] || continue
      if [[ $path =~ \.(a|so)(\.[0-9]+)*$ ]]; then die "strata.pc names a library file by its absolute path: $token"; fi
      [[ $token == -I* ]] && continue
      [ "$path" = "$libdir" ] || grep -qxF "$path" <<<"$dirs" ||
        die "strata.pc links from $path, neither its libdir ($libdir) nor one of its *_libdir variables"
    done
    echo "+ $line"
    (cd "$work" && bash -euo pipefail -c "$line")
    check_without "$work/trainer" "$without"
    (cd "$work" && ./trainer)
    # Every installed header, from the prefix only: a header the install left out fails here.
    (cd "$prefix/include/strata" && find . -name '*.hpp' | sort | sed 's|^\./\(.*\)|#include "\1"|') >"$work/all_headers.cpp"
    echo "compiling the $(wc -l <"$work/all_headers.cpp") installed headers"
    # shellcheck disable=SC2046
    c++ -std=c++17 -fsyntax-only $(pkg-config --cflags strata) "$work/all_headers.cpp"
    ;;
  headers)
    [ $# -eq 2 ] || die "usage: consume.sh headers PREFIX WORK_DIR"
    prefix=$1 work=$2
    root="$prefix/include/strata"
    [ -d "$root" ] || die "no $root (install first)"
    # Private code (detail/, the engines), kernel bodies (gpu/kernels/, gpu/cuda/, .cuh) and CUDA
    # sources are not for users: a FILE_SET HEADERS that lists one fails here.
    private=$(cd "$root" && find . -type f \( -path '*/detail/*' -o -path './gpu/kernels/*' -o -path './gpu/cuda/*' \
      -o -path './store/engines/*' -o -name '*.cuh' -o -name '*.cu' \) | sed 's|^\./||' | sort)
    [ -z "$private" ] || die "installed but not public API (keep it out of its layer's FILE_SET HEADERS):"$'\n'"$private"
    rm -rf "$work"
    mkdir -p "$work"
    use_pkgconfig "$prefix"
    flags=$(pkg-config --cflags strata)
    mapfile -t headers < <(cd "$root" && find . -name '*.hpp' | sed 's|^\./||' | sort)
    [ "${#headers[@]}" -gt 0 ] || die "no headers under $root"
    for h in "${headers[@]}"; do
      printf '#include "%s"\n' "$h" >"$work/${h//\//__}.cpp"
    done
    echo "compiling each of the ${#headers[@]} installed headers alone: ${CXX:-c++} -std=c++17 -fsyntax-only $flags"
    export flags
    # shellcheck disable=SC2016
    if ! find "$work" -name '*.cpp' -print0 | sort -z | xargs -0 -P "$(nproc)" -n 1 bash -c \
      '${CXX:-c++} -std=c++17 -fsyntax-only $flags "$1" || { echo "FAILED alone: $(head -n1 "$1")" >&2; exit 255; }' _; then
      die "an installed header does not compile alone (above)"
    fi
    echo "every installed header compiles alone"
    ;;
  host-layer)
    [ $# -ge 2 ] || die "usage: consume.sh host-layer PREFIX WORK_DIR [CMAKE_ARGS...]"
    prefix=$1 work=$2
    shift 2
    rm -rf "$work"
    mkdir -p "$work/src"
    cat >"$work/src/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(host_layer_user LANGUAGES CXX)
set(ASK host CACHE STRING "the components asked for")
find_package(strata CONFIG REQUIRED COMPONENTS ${ASK})
foreach(t strata::store strata::dispatch strata::gpu strata::strata)
  if(TARGET ${t})
    message(FATAL_ERROR "find_package(strata COMPONENTS ${ASK}) defines ${t}, which was not asked for")
  endif()
endforeach()
add_executable(host_user host_user.cpp)
target_link_libraries(host_user PRIVATE strata::host)
CMAKE
    cat >"$work/src/host_user.cpp" <<'CPP'
#include <cstdio>

#include "host/dedup.hpp"
#include "host/topology.hpp"

int main() {
  const strata::Key keys[] = {7, 3, 7, 7};
  const strata::UniqueKeys u = strata::dedup_keys(keys, 4);
  auto topo = strata::Topology::discover();
  if (!topo.is_ok()) return 1;
  std::printf("host layer alone: %zu unique keys, %d NUMA node(s)\n", u.keys.size(), topo.value().num_nodes());
  return u.keys.size() == 2 ? 0 : 1;
}
CPP
    # MPI and CUDA cannot be found here; NCCL is looked for only after CUDA (it would fail first).
    cmake_project "$work/src" "$work" "$prefix" -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON \
      -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON "$@"
    if grep -E '^(STRATA_NCCL_|MPI_|CUDAToolkit_)' "$work/build/CMakeCache.txt"; then
      die "find_package(strata COMPONENTS host) looked for MPI, CUDA or NCCL (above, in its CMakeCache.txt)"
    fi
    check_without "$work/build/host_user" mpi,nccl,cudart
    "$work/build/host_user"
    # A component that does not exist stops the configure, naming it and the components there are.
    if out=$(cmake -S "$work/src" -B "$work/unknown" -DCMAKE_PREFIX_PATH="$prefix" "-DASK=host;hots" "$@" 2>&1); then
      die "find_package(strata COMPONENTS host hots) configured"
    fi
    grep -q "unknown component 'hots' (expected core, host, gpu, cache, dispatch, store, cuda, mpi or nccl)" \
      <<<"$(tr -s ' \n' ' ' <<<"$out")" ||
      die "find_package(strata COMPONENTS host hots) failed without naming 'hots':"$'\n'"$out"
    echo "an unknown component is refused by name"
    ;;
  tools)
    [ $# -eq 2 ] || die "usage: consume.sh tools PREFIX WORK_DIR"
    prefix=$1 work=$2
    for f in bin/strata-tune bin/strata-bench share/strata/profiles/h200-pcie5.json; do
      [ -e "$prefix/$f" ] || die "cmake --install put no $f under $prefix"
    done
    rm -rf "$work"
    mkdir -p "$work/moved"
    cp -r "$prefix/bin" "$prefix/share" "$work/moved/"
    cp "$work/moved/share/strata/profiles/h200-pcie5.json" "$work/moved/share/strata/profiles/only-installed.json"
    cd "$work"
    workload='{"tables":"a=2000x16,b=300x8","batch":32,"bag_size":2,"dist":"zipf:1.05","distinct_batches":2}'
    for profile in h200-pcie5 only-installed; do
      moved/bin/strata-tune plan --workload "$workload" --profile "$profile" --hbm-budget 64KB --host-budget 1GB \
        --out "plan-$profile.json" >/dev/null
      [ -s "plan-$profile.json" ] || die "strata-tune plan --profile $profile wrote no plan"
      moved/bin/strata-bench --no-progress --rows 500 --dim 16 --batch 16 --pooling 2 --steps 1 --warmup 0 \
        --threads 1 --read-probe-mib 1 --modes cpu --no-gather-probe --profile "$profile" --json "bench-$profile.json" >/dev/null
      [ -s "bench-$profile.json" ] || die "strata-bench --profile $profile wrote no result"
    done
    echo "the installed strata-tune and strata-bench, moved, find their profiles (h200-pcie5, only-installed)"
    ;;
  *)
    die "usage: consume.sh install|example|readme-cmake|readme-pkgconfig|headers|host-layer|tools ..."
    ;;
esac
