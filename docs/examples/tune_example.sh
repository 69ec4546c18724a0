#!/usr/bin/env bash
# docs/tune.md's worked example, as a script: it runs every command of the example in a temporary
# directory and prints the transcript that docs/tune.md includes ("$ command", its output, "(exit N)"
# when not 0). Usage: docs/examples/tune_example.sh BUILD_DIR (the build tree with tune/strata-tune
# and bench/strata-bench).
#
# The profile is docs/examples/calibrated.json, a calibration recorded once (strata-tune calibrate
# measures the machine it runs on, so its numbers would differ from run to run and machine to
# machine); every budget is given, so that no default depends on this machine's memory. What is
# measured here (the emulated device's step times, strata-bench's run time) is printed as
# <measured>. tools/tune_example_docs.py checks that docs/tune.md holds this transcript (ctest
# tune_example_docs) and rewrites it (--write).
set -euo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/strata-tune-example-XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
cp "$here/calibrated.json" "$here/make_criteo.py" .
export PATH="$build/tune:$build/bench:$PATH"

# The numbers this machine measures.
mask() {
  sed -E -e 's/(measured on this machine \([^)]*\): )[0-9.e+-]+ ms/\1<measured> ms/' \
    -e 's/(done in )[0-9.]+ s/\1<measured> s/'
}

# Prints "$ command", runs it, prints its output and its exit code when not 0.
run() {
  echo "\$ $1"
  local out code=0
  out=$(set +o pipefail; eval "$1" 2>&1) || code=$?
  if [ -n "$out" ]; then printf '%s\n' "$out" | mask; fi
  if [ "$code" -ne 0 ]; then echo "(exit $code)"; fi
  echo
}

echo "# 1. A Criteo TSV file (20000 lines from make_criteo.py), planned"
echo
run "cat make_criteo.py"
run "python3 make_criteo.py day0.tsv"
run "strata-tune plan --criteo day0.tsv --tables criteo:200000 --batch 512 --dim 32 --profile calibrated.json --hbm-budget 8MB --host-budget 1GB --threads 1 --belady-points 2 --out criteo_plan.json --html criteo_plan.html"
run "strata-tune plan --criteo day0.tsv --tables criteo:200000 --dim 32 --profile calibrated.json --hbm-budget 8MB --host-budget 1GB --threads 1 | head -4"

echo "# 2. A recorded trace, planned exactly and sampled"
echo
run "strata-bench --tables a=200000x32,b=50000x32,c=2000x16 --batch 256 --pooling 4 --dist zipf:1.05 --steps 50 --warmup 0 --modes cpu --no-gather-probe --read-probe-mib 1 --threads 1 --no-progress --dump-trace day1.strtrace > /dev/null 2>&1"
run "strata-tune plan --trace day1.strtrace --dim 32 --profile calibrated.json --hbm-budget 6MB --host-budget 1GB --threads 1 --out trace_plan.json"
run "strata-tune plan --trace day1.strtrace --dim 32 --profile calibrated.json --hbm-budget 6MB --host-budget 1GB --threads 1 --sample 0.1 --sample-check-keys 20000"
run "strata-tune plan --trace day1.strtrace --dim 32 --profile calibrated.json --hbm-budget 6MB --host-budget 1GB --threads 1 --dtype auto | sed -n '/^table/,/^memory/p'"

echo "# 3. Validate"
echo
run "strata-tune validate trace_plan.json --trace day1.strtrace --profile calibrated.json --backend emu --out validate.json --html validate.html"
run "strata-tune validate trace_plan.json --trace day1.strtrace --profile calibrated.json --backend emu --trainer host | sed -n '/^bytes per training step/,/^\$/p'"
run "strata-tune validate criteo_plan.json --criteo day0.tsv --tables criteo:200000 --batch 512 --dim 32 --profile calibrated.json --backend emu"
run "strata-tune validate criteo_plan.json --criteo day0.tsv --tables criteo:300000 --batch 512 --dim 32"
run "strata-tune plan --trace day1.strtrace --profile calibrated.json --dim 32 --hbm-budget 1KB --host-budget 1MB"
