#!/usr/bin/env bash
# Dynamic tables against dense ones (issue 36): strata-bench's cpu mode on the same workload with and without
# --dynamic, in interleaved pairs (dense, dynamic, dense, dynamic, ...), on two workloads:
#   default: the default workload (26 Criteo-shaped tables, batch 8192, one key a bag): most timed steps admit keys;
#   steady:  26 tables of 20,000 rows with 40 warm-up steps, so that nearly every key has its row before the clock.
# Writes <workload>-<dense|dynamic>-<pair>.json here and prints, per workload, the medians over the pairs of the
# dynamic / dense ratios of the train and forward step p50 and the train phases.
#   usage: results/2026-11-30-dynamic-tables/ab.sh [PAIRS=3] [BENCH=build/default/bench/strata-bench]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pairs=${1:-3}
bench=${2:-build/default/bench/strata-bench}
declare -A args=([default]="--steps 20 --warmup 5" [steady]="--tables 26 --rows 20000 --steps 20 --warmup 40")
for w in default steady; do
  for ((i = 1; i <= pairs; i++)); do
    for kind in dense dynamic; do
      flag=""
      [ "$kind" = dynamic ] && flag=--dynamic
      # shellcheck disable=SC2086
      "$bench" --modes cpu $flag ${args[$w]} --no-progress --json "$here/$w-$kind-$i.json" >/dev/null
    done
  done
done
python3 - "$here" "$pairs" <<'PY'
import json, statistics, sys
here, pairs = sys.argv[1], int(sys.argv[2])
def r(w, k, i):
    return json.load(open(f"{here}/{w}-{k}-{i}.json"))["results"][0]
for w in ("default", "steady"):
    rows = []
    for i in range(1, pairs + 1):
        a, b = r(w, "dense", i), r(w, "dynamic", i)
        rows.append({
            "train": b["train_step_ms_p50"] / a["train_step_ms_p50"],
            "forward": b["forward_step_ms_p50"] / a["forward_step_ms_p50"],
            "dense_train_ms": a["train_step_ms_p50"], "dynamic_train_ms": b["train_step_ms_p50"],
            "dense_phases": a["train_phase_ms_p50"], "dynamic_phases": b["train_phase_ms_p50"],
        })
    med = lambda k: statistics.median(x[k] for x in rows)
    print(f"{w}: dynamic/dense train step p50 {med('train'):.2f}x, forward step p50 {med('forward'):.2f}x "
          f"(medians of {pairs} interleaved pairs; dense train p50 {med('dense_train_ms'):.1f} ms, "
          f"dynamic {med('dynamic_train_ms'):.1f} ms)")
    for x in rows:
        d, y = x["dense_phases"], x["dynamic_phases"]
        print("   phases ms dense/dynamic: " + ", ".join(f"{k} {d[k]:.1f}/{y[k]:.1f}" for k in d))
PY
