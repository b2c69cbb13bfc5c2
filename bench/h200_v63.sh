#!/usr/bin/env bash
# v63 on the lent H200: 9-16 rows on the mid-M kernel with K split over CTAs (x staged once per CTA
# of 128 weight rows, 4 CTAs an SM) against the small-M kernel (UQR_SPLIT16=0): sm_90a build, the
# tensor-core GPU tests, then qmma_sweep at 9 / 16 rows, and the register cap (CTAs an SM) 3 and 2.
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
F=q4_0,q4_k,q4_1,mlx4,exl3,var_affine,ternary
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_qmma.py tests/test_cuda_wgmma.py tests/test_cuda_pdl.py
  echo "== small-M kernel (UQR_SPLIT16=0) and cuBLAS"
  UQR_QMMA_TAG=small UQR_SPLIT16=0 timeout 170 python3 bench/qmma_sweep.py --M 9,16 --formats $F --reps 20 --cublas --json "$OUT/small.json"
  echo "== split K, 4 CTAs an SM"
  UQR_QMMA_TAG=split4 timeout 150 python3 bench/qmma_sweep.py --M 9,16 --formats $F --reps 20 --json "$OUT/split4.json"
  for m in 3 2; do
    echo "== split K, $m CTAs an SM"
    UQR_QMMA_TAG=split$m UQR_SPLIT16_MINB=$m timeout 60 python3 bench/qmma_sweep.py --M 16 --formats q4_0,q4_k,mlx4 \
      --shapes 14336x4096,4096x14336 --reps 20 --json "$OUT/split$m.json"
  done
  date -u
} 2>&1 | tee "$OUT/run.log"
