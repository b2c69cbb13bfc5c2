#!/usr/bin/env bash
# v18 on the lent H200: the wgmma kernel at two CTAs an SM (64-row column tiles, registers capped at
# 128, smaller batches; UQR_WGMMA_BM=64 UQR_WGMMA_CTAS=2) against v17's one CTA an SM: its GPU
# tests in that configuration, then its times, 32-512 rows, three shapes.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  timeout 120 python3 -m pytest -q -rf tests/test_cuda_wgmma.py 2>&1 | tail -5
  echo "--- UQR_WGMMA_BM=64 UQR_WGMMA_CTAS=2"
  export UQR_WGMMA_BM=64 UQR_WGMMA_CTAS=2
  timeout 120 python3 -m pytest -q -rf tests/test_cuda_wgmma.py 2>&1 | tail -15
  PYTHONPATH=. timeout 150 python3 bench/qmma_sweep.py --no-qmma --M 32,64,128,256,512 \
    --shapes 14336x4096 --formats q4_0,q4_1,q4_k,mlx4,var_affine,exl3,ternary --peers wgmma --reps 15 \
    --json "$OUT/sweep_ctas2_14336.json"
  PYTHONPATH=. timeout 90 python3 bench/qmma_sweep.py --no-qmma --M 32,64,128,256 \
    --shapes 4096x4096,4096x14336 --formats q4_0,exl3 --peers wgmma --reps 15 --json "$OUT/sweep_ctas2_other.json"
  unset UQR_WGMMA_BM UQR_WGMMA_CTAS
  echo "--- default (one CTA an SM), same run"
  PYTHONPATH=. timeout 60 python3 bench/qmma_sweep.py --no-qmma --cublas --M 64,128 \
    --shapes 14336x4096 --formats q4_0,exl3 --peers wgmma --reps 15 --json "$OUT/sweep_default.json"
  date -u
} 2>&1 | tee "$OUT/run.log"
