"""Summary of results/2026-11-30-half-rows/run.sh: medians over the interleaved pairs and the ratios.

usage: summary.py OUT PAIRS COMMAND  (writes OUT/summary.json, prints the markdown table)
"""
import json, statistics, sys

out, pairs, command = sys.argv[1], int(sys.argv[2]), sys.argv[3]
load = lambda name: json.load(open(f"{out}/{name}.json"))
cpu = lambda doc: next(r for r in doc["results"] if r["mode"] == "cpu")
med = statistics.median
res = {"command": command, "pairs": pairs, "order": "fp32, bf16, torch per pair (big), then fp32, bf16 (default)",
       "statistic": "median over pairs of each run's median step", "machine": None}
big = {d: [cpu(load(f"{d}-big-{p}")) for p in range(1, pairs + 1)] for d in ("fp32", "bf16")}
torch = [load(f"torch-big-{p}") for p in range(1, pairs + 1)]
first = load("fp32-big-1")
res["machine"] = {k: first["machine"].get(k) for k in ("cpu_model", "cores", "compiler")}
res["workload_big"] = {k: first["workload"].get(k) for k in ("total_rows", "batch", "bag_size", "dist")}
res["workload_big"].update(dim=first["workload"]["tables"][0]["dim"], threads=first["threads"], trainer="host",
                           optimizer=first["workload"]["optimizer"])
f = {d: [r["forward_lookups_per_s"] for r in big[d]] for d in big}
t = {d: [r["train_lookups_per_s"] for r in big[d]] for d in big}
tf = [x["forward_lookups_per_s"] for x in torch]
tt = [x["train_lookups_per_s"] for x in torch]
ratio = lambda a, b: [x / y for x, y in zip(a, b)]
res["big"] = {
    "forward_lookups_per_s": {"fp32": f["fp32"], "bf16": f["bf16"], "torch_fp32": tf},
    "train_lookups_per_s": {"fp32": t["fp32"], "bf16": t["bf16"], "torch_fp32": tt},
    "forward_bf16_over_fp32": med(f["bf16"]) / med(f["fp32"]),
    "forward_bf16_over_torch_fp32": med(f["bf16"]) / med(tf),
    "forward_fp32_over_torch_fp32": med(f["fp32"]) / med(tf),
    "train_bf16_over_fp32": med(t["bf16"]) / med(t["fp32"]),
    "forward_bf16_over_fp32_per_pair": ratio(f["bf16"], f["fp32"]),
    "forward_bf16_over_torch_per_pair": ratio(f["bf16"], tf),
    "train_bf16_over_fp32_per_pair": ratio(t["bf16"], t["fp32"]),
    "train_bf16_over_torch_fp32": med(t["bf16"]) / med(tt),
    "gather_limit_lookups_per_s": {d: [r["gather_limit_lookups_per_s"] for r in big[d]] for d in big},
    "forward_fraction_of_gather_limit": {d: [r["forward_fraction_of_gather_limit"] for r in big[d]] for d in big},
    "train_fraction_of_step_floor": {d: [r["train_fraction_of_step_floor"] for r in big[d]] for d in big},
    "train_phase_ms_p50": {d: [r["train_phase_ms_p50"] for r in big[d]] for d in big},
    "torch_version": torch[0].get("torch_version"),
}
dflt = {d: [cpu(load(f"{d}-default-{p}")) for p in range(1, pairs + 1)] for d in ("fp32", "bf16")}
res["default"] = {
    "host_table_bytes": {d: dflt[d][0]["host_table_bytes"] for d in dflt},
    "memory_fit_host_bytes": {d: dflt[d][0]["memory_fit"]["host_bytes"] for d in dflt},
    "peak_host_bytes": {d: [r["peak_host_bytes"] for r in dflt[d]] for d in dflt},
    "host_tables_bf16_over_fp32": dflt["bf16"][0]["host_table_bytes"] / dflt["fp32"][0]["host_table_bytes"],
    "memory_fit_host_bf16_over_fp32": dflt["bf16"][0]["memory_fit"]["host_bytes"] / dflt["fp32"][0]["memory_fit"]["host_bytes"],
    "peak_rss_bf16_over_fp32": med(r["peak_host_bytes"] for r in dflt["bf16"]) / med(r["peak_host_bytes"] for r in dflt["fp32"]),
    "forward_lookups_per_s": {d: [r["forward_lookups_per_s"] for r in dflt[d]] for d in dflt},
    "train_lookups_per_s": {d: [r["train_lookups_per_s"] for r in dflt[d]] for d in dflt},
}
json.dump(res, open(f"{out}/summary.json", "w"), indent=2)
b, d = res["big"], res["default"]
m = lambda xs: f"{med(xs) / 1e6:.1f} M ({min(xs) / 1e6:.1f}-{max(xs) / 1e6:.1f})"
print(f"| 2M x 128, 8192 x 32 uniform, 2 threads | fp32 | bf16 | torch fp32 | bf16/fp32 | bf16/torch |")
print(f"|---|---|---|---|---|---|")
print(f"| forward lookups/s | {m(f['fp32'])} | {m(f['bf16'])} | {m(tf)} | {b['forward_bf16_over_fp32']:.2f}x | {b['forward_bf16_over_torch_fp32']:.2f}x |")
print(f"| training lookups/s | {m(t['fp32'])} | {m(t['bf16'])} | {m(tt)} | {b['train_bf16_over_fp32']:.2f}x | {b['train_bf16_over_torch_fp32']:.2f}x |")
pp = lambda xs: ", ".join(f"{x:.2f}" for x in xs)
print(f"\nper pair: forward bf16/fp32 {pp(b['forward_bf16_over_fp32_per_pair'])} (median "
      f"{med(b['forward_bf16_over_fp32_per_pair']):.2f}); forward bf16/torch {pp(b['forward_bf16_over_torch_per_pair'])} "
      f"(median {med(b['forward_bf16_over_torch_per_pair']):.2f}); training bf16/fp32 "
      f"{pp(b['train_bf16_over_fp32_per_pair'])} (median {med(b['train_bf16_over_fp32_per_pair']):.2f})")
print(f"\ndefault workload, rowwise adagrad: host_table_bytes fp32 {d['host_table_bytes']['fp32'] / 1e6:.1f} MB, "
      f"bf16 {d['host_table_bytes']['bf16'] / 1e6:.1f} MB ({d['host_tables_bf16_over_fp32']:.3f}x); "
      f"mapped (memory_fit.host_bytes) {d['memory_fit_host_bf16_over_fp32']:.3f}x; peak RSS {d['peak_rss_bf16_over_fp32']:.3f}x")
