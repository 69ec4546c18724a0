#!/usr/bin/env python3
"""Table of BM_PlanBatchPartitioned (earlier BM_PlanBatchSharded) medians: time per batch, unique keys/s (wall), per core, hit rate,
and the speed-up over 1 shard of the same policy and cache in the same run."""
import json
import sys

runs = json.load(open(sys.argv[1]))["benchmarks"]
med = {}
for r in runs:
    if r.get("aggregate_name") != "median":
        continue
    args = dict(kv.split(":") for kv in r["run_name"].split("/")[1:] if ":" in kv)
    med[(int(args["policy"]), int(args["cache_pct"]), int(args.get("partitions", args.get("shards"))))] = r
names = {0: "lru", 1: "lfu", 2: "lookahead"}
print("| policy | cache | shards | µs per batch | M unique keys/s | per core | hit rate | speed-up vs 1 shard |")
print("|---|---|---|---|---|---|---|---|")
for (p, c, s), r in sorted(med.items()):
    base = med.get((p, c, 1))
    speed = base["real_time"] / r["real_time"] if base else float("nan")
    print(f"| {names[p]} | {c}% | {s} | {r['real_time']:.0f} | {r['items_per_second'] / 1e6:.1f} | "
          f"{r['per_core'] / 1e6:.1f} | {r['hit_rate'] * 100:.2f}% | {speed:.2f}x |")
