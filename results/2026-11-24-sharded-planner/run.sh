#!/usr/bin/env bash
# BM_PlanBatchPartitioned (BM_PlanBatchSharded when these figures were taken): the planner of one
# pool in 1, 2 and 4 partitions (cache::PartitionedPlanner, earlier cache::ShardedPool), every
# policy, 5% and 20% caches. Run from the repository root after building the default preset:
#   cmake --build build/default --target strata-micro-planner
#   bash results/2026-11-24-sharded-planner/run.sh
# Writes sharded.json (Google Benchmark) and sharded.txt (its console) here, then summary.md.
set -euo pipefail
out=results/2026-11-24-sharded-planner
build/default/bench/strata-micro-planner --benchmark_filter=BM_PlanBatchPartitioned --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true --benchmark_out="$out/sharded.json" --benchmark_out_format=json > "$out/sharded.txt" 2>&1
python3 "$out/summarize.py" "$out/sharded.json" > "$out/summary.md"
cat "$out/summary.md"
