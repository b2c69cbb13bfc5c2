#!/usr/bin/env bash
# v30 on the lent H200: the final small-M kernel (the non-prefetch path loads x per sub-block again,
# as before v27: loading a whole trip up front spilled 4 bytes in q4_k's one-column-tile kernel,
# which test_cuda_build refuses): every CUDA GPU test, then 1 / 16 rows for a few formats.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_build_and_test_all || exit 1
  UQR_QMMA_TAG=v30 PYTHONPATH=. timeout 100 python3 bench/qmma_sweep.py --M 1,16 --shapes 14336x4096 \
    --formats q4_0,q4_k,mlx4,ternary,q8_0 --reps 20 --json "$OUT/sweep.json"
  date -u
} 2>&1 | tee "$OUT/run.log"
