#!/usr/bin/env bash
# Issue 32: table-batched CPU kernels, before/after. Interleaved A/B (A, B, A, B) runs of
# strata-bench: A = a build of main before the change (BASE, default ../wt-base32 at f83f55a),
# B = this checkout's build; with PRE=path, a third build B0 runs between them (A, B0, B, ...). Workloads: the default (26 Criteo-shaped tables, 1 key per bag; the
# trainer on the device, as ./strata.sh bench), the same with --trainer host (`host`), and
# --pooling 20 (20 keys per bag); modes cpu and offload-cpu (offload with offload_gather: cpu);
# then torch.nn.EmbeddingBag (bench/peers/torch_embeddingbag.py: 2 threads, sparse SGD, no_grad
# forward) on the --pooling 20 keys. Writes OUT/*.json, OUT/*.txt and OUT/summary.md.
#
# Each run's line (and OUT/load.txt) carries the 1-minute load average when it ended.
#
# usage: [WORKLOADS="default host pool20"] [TORCH=1] [PRE=B0_BENCH] results/2026-11-29-table-batched/run.sh [OUT] [BASE_BENCH] [PAIRS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${1:-results/2026-11-29-table-batched}
base=${2:-../wt-base32/build/default/bench/strata-bench}
pairs=${3:-2}
new=./build/default/bench/strata-bench
mkdir -p "$out"
common=(--modes cpu,offload-cpu --sweep-cache '' --no-progress --threads 2)
uptime | tee "$out/load.txt"
for p in $(seq 1 "$pairs"); do
  for w in ${WORKLOADS:-default host pool20}; do
    extra=()
    [ "$w" = host ] && extra=(--trainer host)
    [ "$w" = pool20 ] && extra=(--pooling 20 --warmup 2 --steps 10)
    for side in A ${PRE:+B0} B; do
      bin=$base; [ "$side" = B ] && bin=$new; [ "$side" = B0 ] && bin=$PRE
      "$bin" "${common[@]}" "${extra[@]}" --json "$out/$side-$w-$p.json" >"$out/$side-$w-$p.txt" 2>&1
      load=$(cut -d' ' -f1 /proc/loadavg)
      echo "$side $w $p (load $load): $(grep -E 'at [0-9]+% of the (gather limit|step floor)' "$out/$side-$w-$p.txt" | sed 's/ (.*//' | tr '\n' ';')"
      echo "$side $w $p: $(uptime)" >>"$out/load.txt"
    done
  done
done
if [ "${TORCH:-1}" = 1 ]; then
# torch on the 20-keys-per-bag keys (the largest Criteo table's rows for every table: the peer
# takes one row count).
trace=$(mktemp /tmp/keys32.XXXXXX)
"$new" --modes cpu --sweep-cache '' --no-progress --pooling 20 --warmup 2 --steps 10 --dump-keys "$trace" >/dev/null 2>&1
rows=$(python3 -c "import json; print(max(t['rows'] for t in json.load(open('$out/B-pool20-1.json'))['workload']['tables']))")
for p in $(seq 1 "$pairs"); do
  /usr/bin/python3 bench/peers/torch_embeddingbag.py --keys "$trace" --rows "$rows" --dim 64 --steps 10 --warmup 2 \
    --threads 2 --json "$out/torch-pool20-$p.json" >"$out/torch-pool20-$p.txt" 2>&1
  tail -2 "$out/torch-pool20-$p.txt"
done
rm -f "$trace"
fi
uptime >>"$out/load.txt"
python3 "$(dirname "${BASH_SOURCE[0]}")/summary.py" "$out" | tee "$out/summary.md"
