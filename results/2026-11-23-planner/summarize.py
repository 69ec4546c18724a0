# Medians of BM_PlanBatch before/after (two rounds each) -> summary.json and a markdown table.
import json
rows = {}
for side in ("before", "after"):
    for r in (1, 2):
        for b in json.load(open(f"{side}-{r}.json"))["benchmarks"]:
            if b.get("aggregate_name") != "median":
                continue
            key = b["label"]
            rows.setdefault(key, {}).setdefault(side, []).append((b["real_time"], b["items_per_second"] / 1e6))
out = []
print("| planner | before µs (M keys/s) | after µs (M keys/s) | after/before throughput |")
print("|---|---|---|---|")
for label, v in rows.items():
    bt = sorted(t for t, _ in v["before"]); at = sorted(t for t, _ in v["after"])
    bk = [k for _, k in v["before"]]; ak = [k for _, k in v["after"]]
    ratio = (sum(ak) / len(ak)) / (sum(bk) / len(bk))
    out.append({"label": label, "before_us": bt, "after_us": at, "before_mkeys_s": bk, "after_mkeys_s": ak, "throughput_ratio": ratio})
    fmt = lambda ts, ks: ", ".join(f"{t:.0f} ({k:.1f})" for t, k in zip(ts, ks))
    print(f"| {label} | {fmt([t for t,_ in v['before']], bk)} | {fmt([t for t,_ in v['after']], ak)} | {ratio:.2f}x |")
json.dump(out, open("summary.json", "w"), indent=2)
