#!/usr/bin/env bash
# Issue 22 before/after on a quiet machine: the issue's table (cpu mode against torch, dims 64 and
# 128, uniform and zipf 1.05; Strata, the build before issue 22, torch interleaved in each pair) and
# the default `./strata.sh bench` workload (this build and the earlier one alternating).
# usage: run.sh BEFORE_STRATA_BENCH   (e.g. a build of f54fabf, the commit before issue 22's work)
set -euo pipefail
before=${1:?usage: run.sh BEFORE_STRATA_BENCH}
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
bench/peers/compare_torch.sh --out "$here/pairs" --pairs 3 --wait-idle 60 --dims "64 128" \
  --dists "uniform zipf:1.05" --rows 2000000 --batch 8192 --pooling 32 --threads 2 --steps 30 --before "$before"
# The default workload, as ./strata.sh bench runs it (its cache sweep included), alternating.
mkdir -p "$here/default"
for p in 1 2 3; do
  ./build/default/bench/strata-bench --no-progress --sweep-cache 0.05,0.1,0.2,0.4 \
    --json "$here/default/after-$p.json" >"$here/default/after-$p.txt" 2>&1
  "$before" --no-progress --sweep-cache 0.05,0.1,0.2,0.4 --json "$here/default/before-$p.json" \
    >"$here/default/before-$p.txt" 2>&1
done
