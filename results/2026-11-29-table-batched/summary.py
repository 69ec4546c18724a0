#!/usr/bin/env python3
"""Summary of run.sh (usage: summary.py OUT [TORCH_DIR]: the torch runs from TORCH_DIR, default OUT)'s runs: per workload and mode, the median over the pairs of forward as a
fraction of the gather limit, the training step as a fraction of the step floor, the step
medians and the training step's backward phase, for A (main before), B0 (PRE, when it ran) and B
(this change); and B's cpu training against torch."""
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


# The sides present: A, B0 (PRE in run.sh) when it ran, B.
sides = [x for x in ("A", "B0", "B") if glob.glob(os.path.join(out, f"{x}-*.json"))]
arrow = " → ".join(sides)
columns = [("forward % of gather limit", "forward_fraction_of_gather_limit", 100, "%"),
           ("training % of step floor", "train_fraction_of_step_floor", 100, "%"),
           ("fwd p50 ms", "forward_step_ms_p50", 1, ""),
           ("train step p50 ms", "train_step_ms_p50", 1, ""),
           ("its backward phase p50 ms", ("train_phase_ms_p50", "backward"), 1, "")]


def value(r, mode, key):
    if isinstance(key, tuple):
        d = r[mode].get(key[0]) if mode in r else None
        return d.get(key[1]) if isinstance(d, dict) else None
    return r[mode].get(key) if mode in r else None


def med_of(rs, mode, key, scale):
    v = [value(r, mode, key) for r in rs]
    v = [x * scale for x in v if isinstance(x, (int, float))]
    return (statistics.median(v), min(v), max(v)) if v else None


print("| workload | mode | " + " | ".join(f"{c[0]}, {arrow}" for c in columns) + " |")
print("|---|---|" + "---|" * len(columns))
for w in ("default", "host", "pool20"):
    rs = {x: runs(x, w) for x in sides}
    if not any(rs.values()):
        continue
    for mode in ("cpu", "offload-cpu"):
        cells = [" → ".join(fmt(med_of(rs[x], mode, key, scale), unit) for x in sides)
                 for _, key, scale, unit in columns]
        print(f"| {w} | {mode} | " + " | ".join(cells) + " |")
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
