#!/usr/bin/env python3
"""Gap to Belady (pp) of the lookahead policy per window, from the hit_rate_w*.json files here.

Usage: python3 summarize.py  (prints a Markdown table; run in this folder)
"""
import glob
import json
import re

rows = {}
for path in sorted(glob.glob("hr_w*.json"), key=lambda p: int(re.findall(r"\d+", p)[0])):
    w = int(re.findall(r"\d+", path)[0])
    for r in json.load(open(path))["results"]:
        if r["policy"] != "lookahead":
            continue
        rows.setdefault(w, {})[(r["alpha"], r["capacity_fraction"])] = (100 * r["hit_rate"], r["gap_pp"])
cells = sorted({c for v in rows.values() for c in v})
print("| K + W | " + " | ".join(f"{a:g} / {c:.0%}" for a, c in cells) + " | max gap at >= 5% | target 2 |")
print("|---" * (len(cells) + 3) + "|")
for w, v in rows.items():
    gaps = [v[c][1] for c in cells if c[1] >= 0.05]
    print(f"| 4 + {w} | " + " | ".join(f"{v[c][0]:.2f} ({v[c][1]:.2f})" for c in cells) +
          f" | {max(gaps):.2f} | {'holds' if max(gaps) <= 3 else 'missed'} |")
