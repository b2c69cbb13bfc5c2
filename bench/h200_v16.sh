#!/usr/bin/env bash
# v16 on the lent H200: the wgmma kernel with as many stages as fit (BM = 64: 3-4, BM = 128: 2),
# to test whether it waits on memory latency; UQR_WGMMA_BM=64 forces 64-row column tiles at M >= 128.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  timeout 240 python3 -m pytest -q -rf tests/test_cuda_wgmma.py 2>&1 | tail -30
  PYTHONPATH=. timeout 120 python3 bench/qmma_sweep.py --no-qmma --cublas --M 64,128,512 \
    --shapes 14336x4096 --formats q4_0,q4_k,mlx4,q8_0,var_affine,exl3,ternary --peers wgmma --reps 20 \
    --json "$OUT/sweep_14336.json"
  echo "--- UQR_WGMMA_BM=64"
  UQR_WGMMA_BM=64 PYTHONPATH=. timeout 60 python3 bench/qmma_sweep.py --no-qmma --M 128,512 \
    --shapes 14336x4096 --formats q4_0,q8_0,ternary --peers wgmma --reps 20 --json "$OUT/sweep_bm64.json"
  PYTHONPATH=. timeout 60 python3 bench/qmma_sweep.py --no-qmma --M 64,128,512 \
    --shapes 4096x4096,4096x14336 --formats q4_0 --peers wgmma --reps 20 --json "$OUT/sweep_other.json"
  date -u
} 2>&1 | tee "$OUT/run.log"
