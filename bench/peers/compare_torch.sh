#!/usr/bin/env bash
# Strata `cpu` mode against torch.nn.EmbeddingBag on the same keys and threads, interleaved: for
# each workload (dim x key distribution) it runs Strata, torch, Strata, torch, ... (--pairs N pairs),
# so that a slow spell of the machine (a build next door) hits both sides alike. Reports per
# workload the median and range (min-max over the pairs) of forward and training lookups/s of
# both, the ratio of the medians, and Strata's forward as a fraction of the machine's gather
# limit (strata-bench's gather probe, measured in every Strata run).
#
# usage: bench/peers/compare_torch.sh [--out DIR] [--pairs N] [--steps N] [--threads T] [--rows R]
#                                     [--dims "64 128"] [--dim D] [--batch B] [--pooling K]
#                                     [--dists "uniform zipf:1.05"] [--bench PATH] [--wait-idle S]
#                                     [--before PATH] [--summary-only]
# Writes DIR/strata-<dist>-d<dim>-<pair>.json, DIR/torch-<dist>-d<dim>-<pair>.json, DIR/summary.json
# and DIR/summary.md; prints the markdown table on stdout (the runs' own output goes to stderr).
# --summary-only rebuilds the summary from the pairs already in DIR (after a stopped run).
# --before PATH adds a third run to every pair, an earlier build's strata-bench (same workload
# flags; DIR/before-<dist>-d<dim>-<pair>.json): the order is then Strata, before, torch, and the
# summary gives the earlier build's medians, the after/before ratios, and its forward as a
# fraction of the gather limit measured by the current build in the same pair.
# Before each run it measures, over one second, how idle the CPUs are (DIR/idle.tsv, and the
# lowest per workload in the summary); --wait-idle S first waits up to S seconds for a second in
# which they are at least 90% idle (other work on a 2-core machine distorts both sides, torch's
# OpenMP threads most).
#
# torch runs in its best configuration (bench/peers/torch_embeddingbag.py): torch.set_num_threads
# (--threads), forward under no_grad, training with sparse gradients and SGD, zero_grad with
# set_to_none. It replays the keys Strata generated (--dump-keys), cycling over the same distinct
# batches (2 x (warmup + steps), none repeated within a phase).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

out="results/peers-$(date +%Y%m%d-%H%M%S)"
pairs=5 wait_idle=0 summary_only=0 steps=30 threads=2 rows=2000000 dims=128 batch=8192 pooling=32 dists="uniform zipf:1.05"
bench=./build/default/bench/strata-bench before=
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --dim | --dims) dims=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --pooling) pooling=$2; shift 2 ;;
    --dists) dists=$2; shift 2 ;;
    --bench) bench=$2; shift 2 ;;
    --before) before=$2; shift 2 ;;
    --wait-idle) wait_idle=$2; shift 2 ;;
    --summary-only) summary_only=1; shift ;;
    *) echo "compare_torch.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$pairs" in '' | *[!0-9]* | 0) echo "compare_torch.sh: --pairs '$pairs' (expected an integer >= 1)" >&2; exit 2 ;; esac
case "$wait_idle" in '' | *[!0-9]*) echo "compare_torch.sh: --wait-idle '$wait_idle' (expected seconds >= 0)" >&2; exit 2 ;; esac
[ -x "$bench" ] || { echo "compare_torch.sh: $bench is not built (./strata.sh build)" >&2; exit 2; }
[ -z "$before" ] || [ -x "$before" ] || { echo "compare_torch.sh: --before '$before' is not an executable" >&2; exit 2; }
# Debian's python3 has python3-torch; a pyenv python earlier on PATH does not.
py=/usr/bin/python3
"$py" -c 'import torch' 2>/dev/null || { echo "compare_torch.sh: $py cannot import torch (apt install python3-torch)" >&2; exit 2; }
mkdir -p "$out"
trace=$(mktemp /tmp/strata-keys.XXXXXX)
trap 'rm -f "$trace"' EXIT

# Percent of CPU time idle over the next second (/proc/stat: idle + iowait over all).
idle_pct() {
  local u n s i w q sq st t0 i0
  read -r _ u n s i w q sq st _ </proc/stat
  t0=$((u + n + s + i + w + q + sq + st)) i0=$((i + w))
  sleep 1
  read -r _ u n s i w q sq st _ </proc/stat
  echo $((100 * (i + w - i0) / (u + n + s + i + w + q + sq + st - t0 > 0 ? u + n + s + i + w + q + sq + st - t0 : 1)))
}
# Waits up to --wait-idle seconds for a second with the CPUs >= 90% idle; prints the last idle %.
settle() {
  local start=$SECONDS pct
  while :; do
    pct=$(idle_pct)
    if [ "$pct" -ge 90 ] || [ $((SECONDS - start)) -ge "$wait_idle" ]; then break; fi
  done
  echo "$pct"
}
[ "$summary_only" = 1 ] || printf 'workload\tpair\tside\tidle_pct\n' >"$out/idle.tsv"

workloads=()
for dim in $dims; do
  for dist in $dists; do
    tag="${dist//:/-}-d$dim"
    workloads+=("$tag")
    [ "$summary_only" = 1 ] && continue
    for ((p = 1; p <= pairs; p++)); do
      # The keys depend only on the workload and the seed: dump them once, replay them in torch.
      dump=()
      [ "$p" = 1 ] && dump=(--dump-keys "$trace")
      idle=$(settle)
      printf '%s\t%s\tstrata\t%s\n' "$tag" "$p" "$idle" >>"$out/idle.tsv"
      echo "== $tag pair $p/$pairs: strata cpu (CPUs ${idle}% idle just before)" >&2
      "$bench" --no-progress --rows "$rows" --dim "$dim" --batch "$batch" --pooling "$pooling" --dist "$dist" \
        --steps "$steps" --threads "$threads" --modes cpu "${dump[@]}" --json "$out/strata-$tag-$p.json" >&2
      if [ -n "$before" ]; then
        idle=$(settle)
        printf '%s\t%s\tbefore\t%s\n' "$tag" "$p" "$idle" >>"$out/idle.tsv"
        echo "== $tag pair $p/$pairs: earlier build $before (CPUs ${idle}% idle just before)" >&2
        "$before" --rows "$rows" --dim "$dim" --batch "$batch" --pooling "$pooling" --dist "$dist" \
          --steps "$steps" --threads "$threads" --modes cpu --json "$out/before-$tag-$p.json" >&2 </dev/null
      fi
      idle=$(settle)
      printf '%s\t%s\ttorch\t%s\n' "$tag" "$p" "$idle" >>"$out/idle.tsv"
      echo "== $tag pair $p/$pairs: torch.nn.EmbeddingBag (CPUs ${idle}% idle just before)" >&2
      "$py" bench/peers/torch_embeddingbag.py --keys "$trace" --rows "$rows" --dim "$dim" --steps "$steps" \
        --threads "$threads" --json "$out/torch-$tag-$p.json" >&2
    done
  done
done

"$py" - "$out" "$pairs" "${workloads[@]}" <<'PY'
import json, os, statistics, sys

out, pairs, tags = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
idle = {}
for line in open(f"{out}/idle.tsv").read().splitlines()[1:]:
    w, p, side, pct = line.split("\t")
    idle.setdefault(w, []).append(int(pct))


def stats(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def m(x):
    return f"{x / 1e6:.1f}"


def cell(s):
    return f"{m(s['median'])} ({m(s['min'])}-{m(s['max'])})"


def pct(s):
    return f"{100 * s['median']:.0f}% ({100 * s['min']:.0f}-{100 * s['max']:.0f}%)"


summary = {"command": "bench/peers/compare_torch.sh", "pairs": pairs,
           "order": "strata, [before,] torch, strata, [before,] torch, ...",
           "statistic": "median over pairs of each run's median step; range = min-max over pairs", "results": []}
rows, brows = [], []
for tag in tags:
    # Pairs whose two runs both finished (all of them, unless the script was stopped: then run
    # this part again on the folder with --summary-only).
    done = [p for p in range(1, pairs + 1)
            if os.path.exists(f"{out}/strata-{tag}-{p}.json") and os.path.exists(f"{out}/torch-{tag}-{p}.json")]
    if not done:
        continue
    s_runs = [json.load(open(f"{out}/strata-{tag}-{p}.json")) for p in done]
    t_runs = [json.load(open(f"{out}/torch-{tag}-{p}.json")) for p in done]
    cpu = [next(r for r in s["results"] if r["mode"] == "cpu") for s in s_runs]
    sf = stats([c["forward_lookups_per_s"] for c in cpu])
    st = stats([c["train_lookups_per_s"] for c in cpu])
    tf = stats([t["forward_lookups_per_s"] for t in t_runs])
    tt = stats([t["train_lookups_per_s"] for t in t_runs])
    limit = stats([c["gather_limit_lookups_per_s"] for c in cpu]) if all(
        isinstance(c.get("gather_limit_lookups_per_s"), (int, float)) for c in cpu) else None
    frac = stats([c["forward_fraction_of_gather_limit"] for c in cpu]) if limit else None
    floor = stats([c["train_fraction_of_step_floor"] for c in cpu]) if all(
        isinstance(c.get("train_fraction_of_step_floor"), (int, float)) for c in cpu) else None
    # The earlier build (--before), where every pair ran it; its forward over the same pair's limit.
    b_done = [p for p in done if os.path.exists(f"{out}/before-{tag}-{p}.json")]
    bef = None
    if b_done and len(b_done) == len(done):
        b_cpu = [next(r for r in json.load(open(f"{out}/before-{tag}-{p}.json"))["results"] if r["mode"] == "cpu")
                 for p in done]
        bf = stats([c["forward_lookups_per_s"] for c in b_cpu])
        bt = stats([c["train_lookups_per_s"] for c in b_cpu])
        bef = {"forward_lookups_per_s": bf, "train_lookups_per_s": bt,
               "forward_after_over_before": sf["median"] / bf["median"],
               "train_after_over_before": st["median"] / bt["median"],
               "forward_fraction_of_gather_limit": stats(
                   [b["forward_lookups_per_s"] / c["gather_limit_lookups_per_s"] for b, c in zip(b_cpu, cpu)])
               if limit else None,
               "train_fraction_of_step_floor": stats(
                   [c["train_step_floor_ms"] / b["train_step_ms_p50"] for b, c in zip(b_cpu, cpu)]) if floor else None,
               "train_phase_ms_p50_median": {k: statistics.median(c["train_phase_ms_p50"][k] for c in b_cpu)
                                             for k in ("submit", "forward", "backward")}}
    phases = {k: statistics.median(c["train_phase_ms_p50"][k] for c in cpu) for k in ("submit", "forward", "backward")}
    w = s_runs[0]["workload"]
    r = {"workload": tag, "pairs": len(done), "dist": w["dist"], "dim": w["tables"][0]["dim"], "rows": w["total_rows"],
         "batch": w["batch"], "pooling": w["bag_size"], "threads": s_runs[0]["threads"], "steps": w["steps"],
         "strata_forward_lookups_per_s": sf, "torch_forward_lookups_per_s": tf,
         "forward_ratio_of_medians": sf["median"] / tf["median"],
         "strata_train_lookups_per_s": st, "torch_train_lookups_per_s": tt,
         "train_ratio_of_medians": st["median"] / tt["median"],
         "gather_limit_lookups_per_s": limit, "strata_forward_fraction_of_gather_limit": frac,
         "torch_forward_fraction_of_gather_limit": tf["median"] / limit["median"] if limit else None,
         "strata_train_fraction_of_step_floor": floor,
         "step_floor_ms": [c.get("train_step_floor_ms") for c in cpu], "before": bef,
         "strata_train_phase_ms_p50_median": phases,
         "gather_limit": [s["machine"].get("gather_limit") for s in s_runs],
         "torch_version": t_runs[0].get("torch_version"),
         "torch_loadavg_1m_before": [t.get("loadavg_1m_before") for t in t_runs],
         "cpu_idle_pct_before_runs": idle.get(tag, []), "lowest_cpu_idle_pct": min(idle.get(tag, [100]))}
    summary["results"].append(r)
    torch_frac = f"{100 * r['torch_forward_fraction_of_gather_limit']:.0f}%" if limit else "-"
    rows.append(f"| {tag} ({len(done)} pairs) | {cell(sf)} | {cell(tf)} | {r['forward_ratio_of_medians']:.2f}x | {cell(st)} | {cell(tt)} | "
                f"{r['train_ratio_of_medians']:.2f}x | {cell(limit) if limit else '-'} | {pct(frac) if frac else '-'} | "
                f"{torch_frac} | {pct(floor) if floor else '-'} | {r['lowest_cpu_idle_pct']}% |")
    if bef:
        brows.append(f"| {tag} | {cell(bef['forward_lookups_per_s'])} | {cell(sf)} | "
                     f"{bef['forward_after_over_before']:.2f}x | "
                     f"{pct(bef['forward_fraction_of_gather_limit']) if limit else '-'} | {pct(frac) if frac else '-'} | "
                     f"{cell(bef['train_lookups_per_s'])} | {cell(st)} | {bef['train_after_over_before']:.2f}x | "
                     f"{pct(bef['train_fraction_of_step_floor']) if floor else '-'} | {pct(floor) if floor else '-'} |")
if not summary["results"]:
    sys.exit(f"compare_torch.sh: no finished pair in {out}")
summary["machine"] = s_runs[0]["machine"]
md = [f"M lookups/s, median (min-max) over the interleaved pairs; ratios are of the medians.", "",
      "| workload | Strata forward | torch forward | fwd ratio | Strata train | torch train | train ratio | "
      "gather limit | Strata fwd / limit | torch fwd / limit | Strata step floor / step | CPUs idle before (lowest) |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|"] + rows
if brows:
    md += ["", "Earlier build (--before) against this one, same pairs: M lookups/s, median (min-max); fractions of "
           "the gather limit and step floor measured by this build in the same pair.", "",
           "| workload | before forward | after forward | after/before | before fwd / limit | after fwd / limit | "
           "before train | after train | after/before | before step floor / step | after step floor / step |",
           "|---|---|---|---|---|---|---|---|---|---|---|"] + brows
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
open(f"{out}/summary.md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
print(f"\nwrote {out}/summary.json and {out}/summary.md", file=sys.stderr)
PY
