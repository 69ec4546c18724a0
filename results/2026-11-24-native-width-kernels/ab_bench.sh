#!/bin/bash
# usage: ab_bench.sh OLDBIN NEWBIN PAIRS TAG [extra strata-bench flags]
OLD=$1; NEW=$2; PAIRS=$3; TAG=$4; shift 4
for i in $(seq 1 $PAIRS); do
  for v in A B; do
    if [ $v = A ]; then BIN=$OLD; else BIN=$NEW; fi
    $BIN --modes cpu --tables 1 --rows 2000000 --dim 128 --batch 8192 --pooling 32 --steps 40 --no-progress "$@" --json ${OUT:-.}/sb_${TAG}_${v}_$i.json > /dev/null 2>&1 || echo "run failed $v $i"
  done
done
python3 - "$TAG" "$PAIRS" <<'PY'
import json,sys,statistics
tag,pairs=sys.argv[1],int(sys.argv[2])
r={"A":{"f":[],"t":[]},"B":{"f":[],"t":[]}}
for v in "AB":
  for i in range(1,pairs+1):
    m=json.load(open(f"${OUT:-.}/sb_{tag}_{v}_{i}.json"))["results"][0]
    r[v]["f"].append(m["forward_lookups_per_s"]/1e6); r[v]["t"].append(m["train_lookups_per_s"]/1e6)
for k,name in (("f","forward"),("t","train")):
  a,b=r["A"][k],r["B"][k]
  print(f"{tag:12s} {name:7s} old median {statistics.median(a):6.1f} M/s [{min(a):.1f}-{max(a):.1f}]  new median {statistics.median(b):6.1f} M/s [{min(b):.1f}-{max(b):.1f}]  ratio {statistics.median(b)/statistics.median(a):.3f}   pairs(old/new): " + " ".join(f"{x:.1f}/{y:.1f}" for x,y in zip(a,b)))
PY
