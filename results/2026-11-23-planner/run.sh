#!/usr/bin/env bash
# BM_PlanBatch before (12472f7, the start of this session) and after, alternating in one script so
# that both see the same machine load. Run from the repository root after building both:
#   git worktree add /tmp/base-wt 12472f7
#   cmake -S /tmp/base-wt -B /tmp/base-build -G Ninja -DSTRATA_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
#   cmake --build /tmp/base-build --target strata-micro-planner
#   cmake --build build/default --target strata-micro-planner
set -euo pipefail
out=results/2026-11-23-planner
for round in 1 2; do
  for side in before after; do
    bin=$([ $side = before ] && echo /tmp/base-build/bench/strata-micro-planner || echo build/default/bench/strata-micro-planner)
    "$bin" --benchmark_filter='^BM_PlanBatch/' --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
      --benchmark_out="$out/$side-$round.json" --benchmark_out_format=json > "$out/$side-$round.txt"
  done
done
