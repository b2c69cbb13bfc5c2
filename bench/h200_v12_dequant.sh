#!/usr/bin/env bash
# v12 on the H200: the CUDA C++ decode-to-dense kernel (csrc/cuda/dequant.cu) for the large-M
# scratch path. Build (sm_90a), its GPU tests, then per format on 14336x4096 and 4096x14336 -> bf16
# the CUDA vs Triton decode and the scratch matmul at M = 512 / 4096 beside cuBLAS bf16.
# Every section has its own timeout and a failing one does not stop the next.
#   OUT=/tmp/uqr_out bash bench/h200_v12_dequant.sh        (~3-4 minutes; results in $OUT)
source bench/h200_lib.sh
h200_header
h200_build || exit 1
echo "== GPU tests"
timeout 150 python3 -m pytest -q -x -n 8 tests/test_cuda_dequant.py 2>&1 | tail -4
echo "== decode + scratch timings"
PYTHONPATH=. timeout 240 python3 bench/dequant_bench.py --shapes 14336x4096,4096x14336 --M 512,4096 --reps 20 \
  --json "$OUT/v12_dequant.json" 2>&1 | tee "$OUT/v12_dequant.log"
echo "== mlx4 at g = 32 / 128 (decode only)"
PYTHONPATH=. timeout 60 python3 bench/dequant_bench.py --shapes 14336x4096 --formats mlx4 --mlx4-group 32 --M "" \
  --reps 20 --json "$OUT/v12_mlx4_g32.json" 2>&1 | tail -2
PYTHONPATH=. timeout 60 python3 bench/dequant_bench.py --shapes 14336x4096 --formats mlx4 --mlx4-group 128 --M "" \
  --reps 20 --json "$OUT/v12_mlx4_g128.json" 2>&1 | tail -2
date -u
