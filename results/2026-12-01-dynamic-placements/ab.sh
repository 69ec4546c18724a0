#!/usr/bin/env bash
# Dynamic tables in the device placements (issue 36) against dense ones: strata-bench on the emu device, modes offload,
# cached and gpu, 26 tables of 20,000 rows after 40 warm-up steps (nearly every key held, the tables full), the cache
# at half the rows, with and without --dynamic in interleaved pairs (dense, dynamic, dense, dynamic, ...).
# The bytes per step are counted (the same on every run); the emu device's times are not a GPU's, so of the times only
# the submit phase (host work: the key index, new rows' writes, the cache planner) is compared.
# Writes <mode>-<dense|dynamic>-<pair>.json here and prints, per mode, the bytes per link per step of each kind and the
# medians over the pairs of the dynamic / dense submit phase p50 and of the modelled step (h200-pcie5 profile).
#   usage: results/2026-12-01-dynamic-placements/ab.sh [PAIRS=2] [BENCH=build/default/bench/strata-bench]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pairs=${1:-2}
bench=${2:-build/default/bench/strata-bench}
for mode in offload cached gpu; do
  for ((i = 1; i <= pairs; i++)); do
    for kind in dense dynamic; do
      flag=""
      [ "$kind" = dynamic ] && flag=--dynamic
      # shellcheck disable=SC2086
      "$bench" --modes "$mode" $flag --tables 26 --rows 20000 --cache-fraction 0.5 --steps 10 --warmup 40 \
        --no-progress --json "$here/$mode-$kind-$i.json" >/dev/null
    done
  done
done
python3 - "$here" "$pairs" <<'PY'
import json, statistics, sys
here, pairs = sys.argv[1], int(sys.argv[2])
def r(m, k, i):
    return json.load(open(f"{here}/{m}-{k}-{i}.json"))["results"][0]
for m in ("offload", "cached", "gpu"):
    a, b = r(m, "dense", 1), r(m, "dynamic", 1)
    mb = lambda x, link: x["bytes_per_step"][link] / 1e6
    print(f"{m}: MB per step dense/dynamic: h2d {mb(a, 'h2d'):.1f}/{mb(b, 'h2d'):.1f}, d2h {mb(a, 'd2h'):.1f}/"
          f"{mb(b, 'd2h'):.1f}, host read {mb(a, 'host_read'):.1f}/{mb(b, 'host_read'):.1f}, host write "
          f"{mb(a, 'host_write'):.1f}/{mb(b, 'host_write'):.1f}")
    sub = statistics.median(r(m, "dynamic", i)["train_phase_ms_p50"]["submit"] /
                            r(m, "dense", i)["train_phase_ms_p50"]["submit"] for i in range(1, pairs + 1))
    print(f"  submit phase p50 dynamic/dense {sub:.2f}x (dense {a['train_phase_ms_p50']['submit']:.1f} ms, "
          f"dynamic {b['train_phase_ms_p50']['submit']:.1f} ms in pair 1)")
PY
