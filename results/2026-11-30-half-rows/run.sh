#!/usr/bin/env bash
# Issue 31's CPU targets, bf16 rows against fp32 rows and torch.nn.EmbeddingBag fp32, interleaved:
# each pair runs fp32, bf16, torch (in that order) on the same keys, so that a slow spell of the
# shared machine (other builds) hits every side alike; the summary takes medians over the pairs.
#  - "big": `cpu` mode on one table of 2M x 128 rows, batch 8192 x 32 uniform keys, 2 threads, the
#    trainer on the host (host buffers: the store alone, as torch), SGD; forward and training
#    lookups/s of strata-bench, and bench/peers/torch_embeddingbag.py (forward under no_grad,
#    training with sparse gradients and SGD: its best configuration) replaying the same keys.
#  - "default": the default `./strata.sh bench` workload (26 Criteo-shaped tables, dim 64) in `cpu`
#    mode with rowwise adagrad (fp32 state): the host tables' bytes (host_table_bytes: rows x
#    record; memory_fit.host_bytes: what the store maps, by the model) and the peak RSS.
# Writes OUT/{fp32,bf16}-{big,default}-P.json, OUT/torch-big-P.json (scratch, not committed) and
# OUT/summary.json, OUT/summary.md (committed).
#
# usage: results/2026-11-30-half-rows/run.sh [OUT] [PAIRS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${1:-/tmp/half-rows}
pairs=${2:-3}
bench=./build/default/bench/strata-bench
mkdir -p "$out"
trace=$(mktemp /tmp/half-rows-keys.XXXXXX)
trap 'rm -f "$trace"' EXIT
big=(--modes cpu --rows 2000000 --dim 128 --batch 8192 --pooling 32 --dist uniform --threads 2 --trainer host
     --warmup 5 --steps 40 --sweep-cache '' --no-progress)
default=(--modes cpu --optimizer rowwise_adagrad --sweep-cache '' --no-progress --no-gather-probe)
uptime | tee "$out/load.txt"
for p in $(seq 1 "$pairs"); do
  for dtype in fp32 bf16; do
    # The keys depend only on the workload and the seed: the first run dumps them for torch.
    dump=()
    [ "$p$dtype" = 1fp32 ] && dump=(--dump-keys "$trace")
    "$bench" "${big[@]}" "${dump[@]}" --dtype "$dtype" --json "$out/$dtype-big-$p.json" >"$out/$dtype-big-$p.txt" 2>&1
    echo "$dtype big $p (load $(cut -d' ' -f1 /proc/loadavg)): $(grep -E '^cpu ' "$out/$dtype-big-$p.txt" | head -1)"
  done
  /usr/bin/python3 bench/peers/torch_embeddingbag.py --keys "$trace" --rows 2000000 --dim 128 --warmup 5 --steps 40 \
    --threads 2 --json "$out/torch-big-$p.json" >"$out/torch-big-$p.txt" 2>&1
  echo "torch big $p (load $(cut -d' ' -f1 /proc/loadavg)): $(tail -2 "$out/torch-big-$p.txt" | tr '\n' ' ')"
  for dtype in fp32 bf16; do
    "$bench" "${default[@]}" --dtype "$dtype" --json "$out/$dtype-default-$p.json" >"$out/$dtype-default-$p.txt" 2>&1
    echo "$dtype default $p (load $(cut -d' ' -f1 /proc/loadavg))"
  done
  uptime >>"$out/load.txt"
done
python3 "$(dirname "${BASH_SOURCE[0]}")/summary.py" "$out" "$pairs" "$0 $*" | tee "$out/summary.md"
