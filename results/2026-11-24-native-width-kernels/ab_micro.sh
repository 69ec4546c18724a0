#!/bin/bash
# A/B interleaved strata-micro gather-pool runs: usage ab_micro.sh OLD NEW PAIRS FILTER OUTPREFIX
OLD=$1; NEW=$2; PAIRS=$3; FILTER=$4; OUT=$5
for i in $(seq 1 $PAIRS); do
  for v in A B; do
    if [ $v = A ]; then BIN=$OLD; else BIN=$NEW; fi
    $BIN --benchmark_filter="$FILTER" --benchmark_repetitions=3 --benchmark_min_time=0.5 --benchmark_format=json > ${OUT}_${v}_$i.json 2>/dev/null
  done
done
python3 - "$OUT" "$PAIRS" <<'PY'
import json,sys,statistics,glob
out,pairs=sys.argv[1],int(sys.argv[2])
res={}
for v in "AB":
  for i in range(1,pairs+1):
    d=json.load(open(f"{out}_{v}_{i}.json"))
    for b in d["benchmarks"]:
      if b.get("run_type")!="iteration": continue
      res.setdefault((b["run_name"],v),[]).append(b["items_per_second"]/1e6)
names=sorted({k[0] for k in res})
for n in names:
  a=res[(n,"A")]; b=res[(n,"B")]
  print(f"{n:28s} old median {statistics.median(a):7.2f} M/s [{min(a):.2f}-{max(a):.2f}] n={len(a)}   new median {statistics.median(b):7.2f} M/s [{min(b):.2f}-{max(b):.2f}] n={len(b)}   ratio {statistics.median(b)/statistics.median(a):.3f}")
PY
