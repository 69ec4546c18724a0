#!/usr/bin/env bash
# The weight of a public header: the lines of Strata's own headers that one `#include` of it makes
# the compiler read (the header itself and every repository header it pulls, each counted once).
# Fails when that is over LIMIT, listing each header with its lines, heaviest first, so that the
# include that made it heavy shows. Run by the CTest test store_header_lines (tests/store/CMakeLists.txt).
#
#   header_lines.sh CXX SOURCE_DIR HEADER LIMIT
#       CXX: the C++ compiler (-H lists the headers read); HEADER: relative to SOURCE_DIR.
set -euo pipefail

die() { echo "header_lines.sh: $*" >&2; exit 1; }

[ $# -eq 4 ] || die "usage: header_lines.sh CXX SOURCE_DIR HEADER LIMIT"
cxx=$1 src=$2 header=$3 limit=$4
cd "$src"
[ -f "$header" ] || die "no header $header under $src"

# -H prints every header read, one per line, after as many dots as its include depth. System
# headers are absolute paths; the repository's are relative to the include root "." (-I.).
if ! trace=$("$cxx" -std=c++17 -I. -H -fsyntax-only -x c++ "$header" 2>&1); then
  die "$header does not compile alone:"$'\n'"$trace"
fi
mapfile -t pulled < <(sed -n 's/^\.\.* \(\..*\)$/\1/p' <<<"$trace" | sed 's|^\./||' | sort -u)

total=$(wc -l <"$header")
report=$(printf '%6d %s\n' "$total" "$header")
for h in "${pulled[@]}"; do
  n=$(wc -l <"$h")
  total=$((total + n))
  report+=$'\n'$(printf '%6d %s' "$n" "$h")
done
count=$((${#pulled[@]} + 1))
echo "$header pulls $total lines of Strata's headers ($count headers; limit $limit)"
sort -rn <<<"$report"
if [ "$total" -gt "$limit" ]; then
  die "$header pulls $total lines of Strata's own headers, over the limit of $limit: include only what its declarations need (a forward declaration, or the small header of a type), see the list above"
fi
