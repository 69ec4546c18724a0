#!/usr/bin/env bash
# The default `./strata.sh bench` workload (its cache sweep included), this build and an earlier
# one alternating, three times each. usage: run_default.sh BEFORE_STRATA_BENCH OUTDIR
set -euo pipefail
before=${1:?usage: run_default.sh BEFORE_STRATA_BENCH OUTDIR} out=${2:?usage: run_default.sh BEFORE_STRATA_BENCH OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
mkdir -p "$out"
for p in 1 2 3; do
  ./build/default/bench/strata-bench --no-progress --sweep-cache 0.05,0.1,0.2,0.4 --json "$out/after-$p.json" \
    >"$out/after-$p.txt" 2>&1
  "$before" --no-progress --sweep-cache 0.05,0.1,0.2,0.4 --json "$out/before-$p.json" >"$out/before-$p.txt" 2>&1
done
