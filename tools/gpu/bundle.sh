#!/usr/bin/env bash
# Makes the dependency bundle of the GPU run (tools/gpu/run.sh): the Debian 12 packages Strata builds
# against (headers, CMake and pkg-config files, libraries), fetched with `apt-get download` and
# unpacked with `dpkg-deb -x` into one folder of the working tree (default .gpu-bundle/, ignored by
# git), so that a machine with its own image and no package registry (the GPU machine) builds
# Strata from the sources plus this folder. Idempotent: a bundle whose MANIFEST lists the same
# packages is kept (--force makes it again).
#
# usage: tools/gpu/bundle.sh [--dir DIR] [--force] [--check]
#   --check  only says whether DIR holds a complete, current bundle (exit 0) or not (exit 1)
#
# A download that fails is retried once after `apt-get update` (as root, or with sudo that needs
# no password); exit 3 when the packages still cannot be fetched (the rehearsal test skips then).
# The bundle is made in a folder next to DIR and renamed into place, its MANIFEST last: a bundle
# interrupted anywhere never reads as complete.
#
# Layout: DIR/usr/{include,lib/x86_64-linux-gnu,share} as the packages install them, with the
# pkg-config files made relocatable (prefix=${pcfiledir}/...), static copies of libraries that also
# come shared removed (hwloc, jemalloc: the build links the shared ones), documentation removed;
# DIR/extra/ holds runtime libraries that the GPU machine's image normally has itself (libudev),
# used only where it lacks them; DIR/MANIFEST says what is in it, and the newest glibc and
# libstdc++ symbol versions its shared libraries need (a machine with older ones cannot load them).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

# Every package the build needs from Debian, with the runtime libraries of the shared ones. Not in
# it: MPI (the GPU run builds without the mpi communicator), Python and pybind11 (no Python module
# there), the CUDA toolkit and NCCL (the GPU machine's own).
BUNDLE_PACKAGES=(
  libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5   # oneTBB
  libhwloc-dev libhwloc15                           # hwloc (also tbbbind's)
  libjemalloc-dev libjemalloc2                      # jemalloc: Strata's programs
  libgtest-dev libgmock-dev                         # GoogleTest (static libraries)
  libbenchmark-dev libbenchmark1debian              # Google Benchmark (bench/ asks for it)
  nlohmann-json3-dev libcli11-dev                   # header-only
  pkgconf-bin libpkgconf3                           # pkg-config, which images without it lack
)
EXTRA_PACKAGES=(libudev1)  # libhwloc's one dependency beyond libc

dir=.gpu-bundle force=0 check=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir=$2; shift 2 ;;
    --force) force=1; shift ;;
    --check) check=1; shift ;;
    *) echo "bundle.sh: unknown argument '$1' (expected --dir DIR, --force, --check)" >&2; exit 2 ;;
  esac
done
log() { printf '[bundle] %s\n' "$*" >&2; }

want="packages: ${BUNDLE_PACKAGES[*]} | extra: ${EXTRA_PACKAGES[*]}"
complete() { [ -f "$dir/MANIFEST" ] && grep -qxF "$want" "$dir/MANIFEST"; }
if [ "$check" = 1 ]; then complete; exit; fi
if [ "$force" = 0 ] && complete; then
  log "$dir is up to date ($(du -sh "$dir" | cut -f1)); --force makes it again"
  exit 0
fi

for tool in apt-get dpkg-deb objdump; do
  command -v "$tool" >/dev/null || { log "needs $tool (a Debian machine with binutils)"; exit 2; }
done
# apt-get update, where this user may run it (root, or sudo without a password); false otherwise.
update_lists() {
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    sudo -n true 2>/dev/null || { log "cannot run apt-get update (not root, no password-less sudo)"; return 1; }
    sudo="sudo -n"
  fi
  log "apt-get update"
  $sudo apt-get update -qq
}
# apt-get download needs the package lists: fetch them once if this machine has none.
updated=0
if ! apt-cache show --no-all-versions "${BUNDLE_PACKAGES[0]}" >/dev/null 2>&1; then
  log "no package lists"
  update_lists || exit 3
  updated=1
fi

# Made next to DIR (one file system: the rename below is atomic), removed on any exit.
mkdir -p "$(dirname "$dir")"
tmp=$(mktemp -d "$(dirname "$dir")/.$(basename "$dir").tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# download WHERE PACKAGE...: apt-get download into WHERE; true when every package came. As root
# apt-get warns that the _apt user cannot write there (harmless), hence the filter.
download() {
  local where=$1
  shift
  rm -rf "$where" && mkdir -p "$where"
  (cd "$where" && apt-get download "$@" 2>&1 | grep -v -e '^Get:' -e 'unsandboxed' >&2 || true)
  [ "$(ls "$where" | wc -l)" -eq "$#" ]
}
fetch_all() { download "$tmp/debs" "${BUNDLE_PACKAGES[@]}" && download "$tmp/extra-debs" "${EXTRA_PACKAGES[@]}"; }
if ! fetch_all; then
  # Stale package lists name versions the mirror no longer has: refresh them once and retry.
  if [ "$updated" = 1 ] || ! update_lists || ! fetch_all; then
    log "apt-get download fetched $(ls "$tmp/debs" | wc -l) of ${#BUNDLE_PACKAGES[@]} packages" \
      "(and $(ls "$tmp/extra-debs" 2>/dev/null | wc -l) of ${#EXTRA_PACKAGES[@]} extra)"
    exit 3
  fi
fi
mkdir -p "$tmp/new/extra"

for deb in "$tmp"/debs/*.deb; do dpkg-deb -x "$deb" "$tmp/new"; done
for deb in "$tmp"/extra-debs/*.deb; do
  dpkg-deb -x "$deb" "$tmp/extra-root"
done
# extra/: the runtime libraries alone, flat.
find "$tmp/extra-root" \( -type f -o -type l \) -name '*.so*' -exec cp -P {} "$tmp/new/extra/" \;

new=$tmp/new
lib=$new/usr/lib/x86_64-linux-gnu
rm -rf "$new/usr/share/doc" "$new/usr/share/man" "$new/usr/share/lintian" "$new/usr/src" "$new/usr/bin/jeprof" \
  "$new/lib" 2>/dev/null || true
rm -f "$lib"/libhwloc.a "$lib"/libjemalloc.a "$lib"/libjemalloc_pic.a
# Relocatable pkg-config files: the bundle is unpacked elsewhere on every machine, so every path
# that starts with /usr (prefix=/usr, libdir=/usr/lib/..., -I/usr/include) is made relative to the
# file's own folder.
relocate() {  # relocate ROOT FILE...: /usr -> ROOT in the paths of each .pc FILE
  local root=$1
  shift
  sed -i -E "s#(^|[=[:space:]]|-I|-L)/usr(/|\$|[[:space:]])#\1${root}\2#g" "$@"
}
relocate '${pcfiledir}/../../..' "$lib"/pkgconfig/*.pc
relocate '${pcfiledir}/../..' "$new"/usr/share/pkgconfig/*.pc
if grep -l -E '(^|[=[:space:]])/usr' "$lib"/pkgconfig/*.pc "$new"/usr/share/pkgconfig/*.pc; then
  log "the pkg-config files above still name /usr: extend the rewrite in tools/gpu/bundle.sh"
  exit 1
fi

# The newest symbol versions the shared libraries need from glibc and libstdc++.
newest() {  # newest PREFIX: the highest PREFIX<version> among the dynamic symbols' versions
  find "$new" -name '*.so*' -type f -print0 | xargs -0 objdump -T 2>/dev/null |
    grep -o "$1[0-9.]*" | sed "s/^$1//" | sort -t. -k1,1n -k2,2n -k3,3n -u | tail -n 1
}
{
  echo "# tools/gpu/bundle.sh: Debian $(cat /etc/debian_version 2>/dev/null || echo '?') packages for the GPU run"
  echo "$want"
  echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "needs glibc: $(newest GLIBC_)"
  echo "needs libstdc++: GLIBCXX_$(newest GLIBCXX_)"
  for deb in "$tmp"/debs/*.deb "$tmp"/extra-debs/*.deb; do
    echo "deb: $(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version)"
  done
} >"$tmp/MANIFEST"

rm -rf "$dir"
mv "$new" "$dir"
mv "$tmp/MANIFEST" "$dir/MANIFEST"  # last: only now is the bundle complete
log "wrote $dir ($(du -sh "$dir" | cut -f1); $(grep -c '^deb:' "$dir/MANIFEST") packages; $(grep '^needs glibc' "$dir/MANIFEST"))"
