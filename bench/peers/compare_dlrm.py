#!/usr/bin/python3
"""The DLRM example (python/examples/train_dlrm.py) with Strata tables against the same model with
torch.nn.EmbeddingBag tables, same threads, same data, interleaved: every round runs each variant
once (the order rotates from round to round), so a slow spell of a shared machine hits every
variant alike. The peer runs in both of its usual forms (one EmbeddingBag per table, and every
table in one EmbeddingBag), each with sparse gradients and sparse Adagrad, as the store's fused
Adagrad; the summary compares Strata with the faster of the two.

  PYTHONPATH=build/default/python /usr/bin/python3 bench/peers/compare_dlrm.py --out DIR [--rounds 5]
      [--steps 400] [--log-every 50] [--threads 2] [--batch 256] [--rows 10000] [--dim 16] [--mode cpu]

Writes DIR/<variant>-<round>.json (the example's --json output, plus the CPUs' idle share during
the run), DIR/summary.json and DIR/summary.md (printed too): per variant the median over rounds of
each run's median samples/s (the first logging window of each run, with warm-up, left out), the
range over rounds, and Strata's ratio to each peer form.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "python" / "examples" / "train_dlrm.py"


def cpu_times():
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return fields[3] + fields[4], sum(fields)  # idle + iowait, total


def run(variant_args, path, common):
    idle0, total0 = cpu_times()
    subprocess.run([sys.executable, str(EXAMPLE), *common, *variant_args, "--json", str(path)], check=True,
                   stdout=subprocess.DEVNULL)
    idle1, total1 = cpu_times()
    result = json.loads(path.read_text())
    result["cpu_idle_share"] = (idle1 - idle0) / max(total1 - total0, 1)
    path.write_text(json.dumps(result, indent=1))
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--rows", type=int, default=10000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--mode", default="cpu", help="placement of the Strata tables")
    a = p.parse_args()
    if a.rounds < 1 or a.steps < 2 * a.log_every:
        p.error(f"--rounds {a.rounds} --steps {a.steps} --log-every {a.log_every}: expected at least one round "
                "and at least two logging windows per run")
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    common = ["--steps", str(a.steps), "--log-every", str(a.log_every), "--threads", str(a.threads), "--batch",
              str(a.batch), "--rows", str(a.rows), "--dim", str(a.dim)]
    variants = {f"strata-{a.mode}": ["--mode", a.mode], "torch-per-table": ["--torch-tables", "per-table"],
                "torch-fused": ["--torch-tables", "fused"]}
    names = list(variants)
    rates = {n: [] for n in names}
    idle = {n: [] for n in names}
    for r in range(a.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            res = run(variants[n], out / f"{n}-{r}.json", common)
            rates[n].append(res["median_samples_per_s"])
            idle[n].append(res["cpu_idle_share"])
            if sys.stderr.isatty():
                print(f"round {r + 1}/{a.rounds} {n}: {res['median_samples_per_s']:,.0f} samples/s", file=sys.stderr)
    med = {n: statistics.median(v) for n, v in rates.items()}
    strata = names[0]
    best_peer = max(names[1:], key=lambda n: med[n])
    summary = {"command": "PYTHONPATH=build/default/python /usr/bin/python3 bench/peers/compare_dlrm.py " +
                          " ".join(sys.argv[1:]),
               "threads": a.threads, "batch": a.batch, "rows": a.rows, "dim": a.dim, "steps": a.steps,
               "rounds": a.rounds, "machine": os.uname().nodename, "cpus": os.cpu_count(),
               "variants": {n: {"median_samples_per_s": med[n], "min": min(rates[n]), "max": max(rates[n]),
                                "runs": rates[n], "cpu_idle_share": idle[n]} for n in names},
               "best_peer": best_peer,
               "ratio_to": {n: med[strata] / med[n] for n in names[1:]}}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    lines = [f"DLRM example, {a.threads} threads, batch {a.batch}, 26 tables x {a.rows} rows x dim {a.dim}, "
             f"{a.steps} steps per run, {a.rounds} interleaved rounds (medians over rounds of each run's median "
             "window)", "", "| tables | samples/s (median) | range | Strata / this |", "|---|---|---|---|"]
    for n in names:
        ratio = "" if n == strata else f"{med[strata] / med[n]:.2f}x"
        lines.append(f"| {n} | {med[n]:,.0f} | {min(rates[n]):,.0f}-{max(rates[n]):,.0f} | {ratio} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
