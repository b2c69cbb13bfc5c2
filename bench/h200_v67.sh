#!/usr/bin/env bash
# v67 on the lent H200: 9-16 rows on the split-K mid-M kernel with the reduce kernel back (8 outputs
# a thread) and x staged in fragment order (PX, default) against cp.async staging (UQR_SPLIT16_PX=0),
# pairs (CTAs an SM, stages) 32 and 22.
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
F=q4_0,q4_k,mlx4,q4_1,ternary,exl3,var_affine
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_qmma.py tests/test_cuda_wgmma.py tests/test_cuda_pdl.py
  echo "== split K, 32, PX"
  UQR_QMMA_TAG=px32 timeout 150 python3 bench/qmma_sweep.py --M 9,16 --formats $F --reps 20 --cublas --json "$OUT/px32.json"
  echo "== split K, 32, cp.async x"
  UQR_QMMA_TAG=cp32 UQR_SPLIT16_PX=0 timeout 80 python3 bench/qmma_sweep.py --M 16 --formats q4_0,q4_k,mlx4,ternary \
    --shapes 14336x4096,4096x14336 --reps 20 --json "$OUT/cp32.json"
  echo "== split K, 22, PX"
  UQR_QMMA_TAG=px22 UQR_SPLIT16_CFG=22 timeout 80 python3 bench/qmma_sweep.py --M 16 --formats q4_0,q4_k,mlx4,ternary \
    --shapes 14336x4096,4096x14336 --reps 20 --json "$OUT/px22.json"
  date -u
} 2>&1 | tee "$OUT/run.log"
