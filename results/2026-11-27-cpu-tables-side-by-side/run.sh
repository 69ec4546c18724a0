#!/usr/bin/env bash
# cpu mode on the default `./strata.sh bench` workload (26 Criteo-shaped tables, one-hot, batch
# 8192), the trainer on the host (so only the store's kernels are timed), two builds interleaved:
# pair p runs A then B when p is odd, B then A when even. Each run also measures the machine's
# gather limit and update floor (docs/bench.md), so every figure has its fraction of the limit.
# usage: run.sh A_STRATA_BENCH B_STRATA_BENCH OUTDIR [PAIRS] [EXTRA strata-bench FLAGS...]
set -euo pipefail
a=${1:?usage: run.sh A B OUTDIR [PAIRS] [FLAGS...]} b=${2:?} out=${3:?}
pairs=${4:-5}
shift $(($# < 4 ? $# : 4))
mkdir -p "$out"
one() {  # NAME BINARY PAIR
  "$2" --modes cpu --trainer host --steps 40 --no-progress --json "$out/$1-$3.json" "${@:4}" >"$out/$1-$3.txt" 2>&1
  printf '%s\t%s\t%s\n' "$1" "$3" "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/load.tsv"
}
for p in $(seq 1 "$pairs"); do
  if [ $((p % 2)) -eq 1 ]; then one A "$a" "$p" "$@"; one B "$b" "$p" "$@"; else one B "$b" "$p" "$@"; one A "$a" "$p" "$@"; fi
done
python3 "$(dirname "$0")/summary.py" "$out"
