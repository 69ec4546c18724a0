"""Medians (min-max) of run.sh's pairs: forward and training lookups/s, their ratio B/A per pair,
and each build's forward as a fraction of the gather limit its own run measured."""
import glob
import json
import statistics
import sys

out = sys.argv[1]
runs = {}
for path in sorted(glob.glob(f"{out}/[AB]-*.json")):
    name, pair = path.rsplit("/", 1)[1][:-5].split("-")
    r = json.load(open(path))["results"][0]
    runs.setdefault(name, {})[int(pair)] = r


def med(xs):
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


pairs = sorted(set(runs["A"]) & set(runs["B"]))
for key, label in [("forward_lookups_per_s", "forward M lookups/s"), ("train_lookups_per_s", "train M lookups/s")]:
    for n in "AB":
        print(f"{label:22s} {n}: {med([runs[n][p][key] / 1e6 for p in pairs])}")
    print(f"{label:22s} B/A per pair: {med([runs['B'][p][key] / runs['A'][p][key] for p in pairs])}")
for n in "AB":
    f = [runs[n][p]["forward_fraction_of_gather_limit"] for p in pairs if runs[n][p]["forward_fraction_of_gather_limit"]]
    s = [runs[n][p]["train_fraction_of_step_floor"] for p in pairs if runs[n][p]["train_fraction_of_step_floor"]]
    bw = [runs[n][p]["train_phase_ms_p50"]["backward"] for p in pairs]
    fw = [runs[n][p]["forward_step_ms_p50"] for p in pairs]
    if f:
        print(f"{n}: forward at {med([x * 100 for x in f])}% of the gather limit; step floor / step {med([x * 100 for x in s])}%")
    print(f"{n}: forward step p50 {med(fw)} ms, backward p50 {med(bw)} ms")
