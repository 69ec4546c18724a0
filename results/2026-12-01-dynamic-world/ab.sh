#!/usr/bin/env bash
# Dynamic tables sharded over a world (issue 36) against dense ones: strata-bench on the emu device, mode gpu over
# --ranks 2 thread ranks (row sharding), 26 tables of 20,000 rows after 40 warm-up steps (nearly every key held), with
# and without --dynamic in interleaved pairs (dense, dynamic, dense, dynamic, ...). Over ranks --dynamic gives each
# table a quarter more capacity than rows (docs/bench.md). The all-to-all bytes are counted (the same on every run);
# the emu device's times are not a GPU's, so of the times only the submit phase (host work: dedup, the key exchange to
# the shards and back, the shards' key indexes, new rows' writes, the rows' key exchange) is compared.
# Writes <dense|dynamic>-<pair>.json here and prints rank 0's all-to-all bytes per step and the median over the pairs
# of the dynamic / dense submit phase p50.
#   usage: results/2026-12-01-dynamic-world/ab.sh [PAIRS=2] [BENCH=build/default/bench/strata-bench]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pairs=${1:-2}
bench=${2:-build/default/bench/strata-bench}
for ((i = 1; i <= pairs; i++)); do
  for kind in dense dynamic; do
    flag=""
    [ "$kind" = dynamic ] && flag=--dynamic
    # shellcheck disable=SC2086
    "$bench" --modes gpu --ranks 2 $flag --tables 26 --rows 20000 --steps 10 --warmup 40 --backend emu \
      --sweep-cache '' --no-progress --json "$here/$kind-$i.json" >/dev/null
  done
done
python3 - "$here" "$pairs" <<'PY'
import json, statistics, sys
here, pairs = sys.argv[1], int(sys.argv[2])
def r(k, i):
    return json.load(open(f"{here}/{k}-{i}.json"))["results"][0]
a, b = r("dense", 1), r("dynamic", 1)
print("rank 0 dispatch, dense:", json.dumps(a.get("dispatch", {}).get("bytes_per_step", a.get("dispatch"))))
print("rank 0 dispatch, dynamic:", json.dumps(b.get("dispatch", {}).get("bytes_per_step", b.get("dispatch"))))
sub = [r("dynamic", i)["train_phase_ms_p50"]["submit"] / r("dense", i)["train_phase_ms_p50"]["submit"]
       for i in range(1, pairs + 1)]
print(f"submit phase p50 dynamic/dense: median {statistics.median(sub):.2f}x (per pair "
      + ", ".join(f"{x:.2f}" for x in sub) + f"; dense {a['train_phase_ms_p50']['submit']:.1f} ms, dynamic "
      f"{b['train_phase_ms_p50']['submit']:.1f} ms in pair 1)")
st = [r("dynamic", i)["train_step_ms_p50"] / r("dense", i)["train_step_ms_p50"] for i in range(1, pairs + 1)]
print(f"train step p50 dynamic/dense (emu): median {statistics.median(st):.2f}x")
PY
