#!/bin/bash
# usage: ab_bench.sh OUTFILE PAIRS "binA binB ..." -- strata-bench args...
out=$1; pairs=$2; bins=$3; shift 4
for p in $(seq 1 $pairs); do
  for b in $bins; do
    line=$(/tmp/hk/$b/strata-bench --modes cpu "$@" 2>&1 | grep "training step p50 by phase")
    fwd=$(echo "$line" | sed -E 's/.*forward ([0-9.]+) ms.*/\1/')
    bwd=$(echo "$line" | sed -E 's/.*backward\+optimizer ([0-9.]+) ms.*/\1/')
    echo "$p $b $fwd $bwd" >> $out
  done
done
