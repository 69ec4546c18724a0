#!/usr/bin/env bash
# The issue's table with code generated for an AVX2-only x86 (no AVX-512), as on the AMD EPYC of
# issue 22: this build and the build before issue 22 configured with
#   cmake -S . -B build/avx2 -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=znver2
# (Zen 2: AVX2, no AVX-512; checked: no zmm register in either binary), run on this machine.
# usage: run_avx2.sh BEFORE_AVX2_STRATA_BENCH
set -euo pipefail
before=${1:?usage: run_avx2.sh BEFORE_AVX2_STRATA_BENCH}
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
bench/peers/compare_torch.sh --bench build/avx2/bench/strata-bench --out "$here/pairs-avx2" --pairs 3 --wait-idle 60 \
  --dims "64 128" --dists "uniform zipf:1.05" --rows 2000000 --batch 8192 --pooling 32 --threads 2 --steps 30 \
  --before "$before"
