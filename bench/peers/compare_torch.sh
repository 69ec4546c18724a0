#!/usr/bin/env bash
# Strata `cpu` mode against torch.nn.EmbeddingBag on the same keys, same threads; prints the ratios.
# usage: bench/peers/compare_torch.sh [--out DIR] [--steps N] [--threads T] [--rows R] [--dim D]
#                                     [--batch B] [--pooling K] [--dists "uniform zipf:1.05"]
# Writes DIR/strata-<dist>.json, DIR/torch-<dist>.json and DIR/summary.json.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

out="results/peers-$(date +%Y%m%d-%H%M%S)"
steps=30 threads=2 rows=2000000 dim=128 batch=8192 pooling=32 dists="uniform zipf:1.05"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --dim) dim=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --pooling) pooling=$2; shift 2 ;;
    --dists) dists=$2; shift 2 ;;
    *) echo "compare_torch.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
bench=./build/default/bench/strata-bench
[ -x "$bench" ] || { echo "compare_torch.sh: build first (./strata.sh build)" >&2; exit 2; }
# Debian's python3 has python3-torch; a pyenv python earlier on PATH does not.
py=/usr/bin/python3
mkdir -p "$out"
trace=$(mktemp /tmp/strata-keys.XXXXXX)
trap 'rm -f "$trace"' EXIT

for dist in $dists; do
  tag=${dist//:/-}
  echo "== $dist: strata cpu" >&2
  "$bench" --no-progress --rows "$rows" --dim "$dim" --batch "$batch" --pooling "$pooling" --dist "$dist" \
    --steps "$steps" --threads "$threads" --modes cpu --dump-keys "$trace" --json "$out/strata-$tag.json" >&2
  echo "== $dist: torch.nn.EmbeddingBag" >&2
  "$py" bench/peers/torch_embeddingbag.py --keys "$trace" --rows "$rows" --dim "$dim" --steps "$steps" \
    --threads "$threads" --json "$out/torch-$tag.json" >&2
done

"$py" - "$out" $dists <<'PY'
import json, sys
out, dists = sys.argv[1], sys.argv[2:]
summary = {"command": "bench/peers/compare_torch.sh", "results": []}
print(f"\n{'dist':<12} {'strata fwd/s':>13} {'torch fwd/s':>13} {'fwd ratio':>10} {'strata trn/s':>13} {'torch trn/s':>13} {'train ratio':>12} {'gather GB/s':>12} {'read GB/s':>10}")
for d in dists:
    tag = d.replace(":", "-")
    s = json.load(open(f"{out}/strata-{tag}.json"))
    t = json.load(open(f"{out}/torch-{tag}.json"))
    c = next(r for r in s["results"] if r["mode"] == "cpu")
    fr = c["forward_lookups_per_s"] / t["forward_lookups_per_s"]
    tr = c["train_lookups_per_s"] / t["train_lookups_per_s"]
    summary["results"].append({"dist": d, "strata_forward_lookups_per_s": c["forward_lookups_per_s"],
        "torch_forward_lookups_per_s": t["forward_lookups_per_s"], "forward_ratio": fr,
        "strata_train_lookups_per_s": c["train_lookups_per_s"], "torch_train_lookups_per_s": t["train_lookups_per_s"],
        "train_ratio": tr, "strata_gather_gbs": c["gather_gbs"], "read_bandwidth_gbs": s["read_bandwidth_gbs"],
        "workload": s["workload"], "threads": s["threads"], "torch_version": t.get("torch_version")})
    print(f"{d:<12} {c['forward_lookups_per_s']:>13.3e} {t['forward_lookups_per_s']:>13.3e} {fr:>9.2f}x "
          f"{c['train_lookups_per_s']:>13.3e} {t['train_lookups_per_s']:>13.3e} {tr:>11.2f}x "
          f"{c['gather_gbs']:>12.2f} {s['read_bandwidth_gbs']:>10.2f}")
summary["machine"] = s["machine"]
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
print(f"wrote {out}/summary.json")
PY
