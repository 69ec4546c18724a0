#!/usr/bin/env python3
"""Summary of run.sh (usage: summary.py OUT [TORCH_DIR]: the torch runs from TORCH_DIR, default OUT)'s runs: per workload and mode, the median over the pairs of forward as a
fraction of the gather limit, the training step as a fraction of the step floor, and the step
medians, for A (main before) and B (this change); and B's cpu training against torch."""
import glob
import json
import os
import statistics
import sys

out = sys.argv[1]


def runs(side, w):
    rs = []
    for p in sorted(glob.glob(os.path.join(out, f"{side}-{w}-*.json"))):
        rs.append({m["mode"]: m for m in json.load(open(p))["results"]})
    return rs


def med(rs, mode, key, scale=1.0):
    v = [r[mode][key] for r in rs if mode in r and isinstance(r[mode].get(key), (int, float))]
    return (statistics.median(v) * scale, min(v) * scale, max(v) * scale) if v else None


def fmt(x, unit=""):
    return "-" if x is None else f"{x[0]:.0f}{unit} ({x[1]:.0f}-{x[2]:.0f})"


print("| workload | mode | forward % of gather limit, A → B | training % of step floor, A → B | "
      "fwd p50 ms A → B | train step p50 ms A → B |")
print("|---|---|---|---|---|---|")
for w in ("default", "host", "pool20"):
    a, b = runs("A", w), runs("B", w)
    if not a and not b:
        continue
    for mode in ("cpu", "offload-cpu"):
        print(f"| {w} | {mode} | {fmt(med(a, mode, 'forward_fraction_of_gather_limit', 100), '%')} → "
              f"{fmt(med(b, mode, 'forward_fraction_of_gather_limit', 100), '%')} | "
              f"{fmt(med(a, mode, 'train_fraction_of_step_floor', 100), '%')} → "
              f"{fmt(med(b, mode, 'train_fraction_of_step_floor', 100), '%')} | "
              f"{fmt(med(a, mode, 'forward_step_ms_p50'))} → {fmt(med(b, mode, 'forward_step_ms_p50'))} | "
              f"{fmt(med(a, mode, 'train_step_ms_p50'))} → {fmt(med(b, mode, 'train_step_ms_p50'))} |")
torch_dir = sys.argv[2] if len(sys.argv) > 2 else out
t = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(torch_dir, "torch-pool20-*.json")))]
if t:
    tl = statistics.median(x["train_lookups_per_s"] for x in t)
    b = runs("B", "pool20")
    a = runs("A", "pool20")
    for name, rs in (("A (main)", a), ("B (this change)", b)):
        v = [r["cpu"]["train_lookups_per_s"] for r in rs if "cpu" in r]
        if v:
            print(f"\npool20 training, cpu {name}: {statistics.median(v):.3e} lookups/s; torch "
                  f"{tl:.3e} lookups/s: {statistics.median(v) / tl:.2f}x torch")
