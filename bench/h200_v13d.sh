#!/usr/bin/env bash
# v13d on the lent H200: q8_0 and ternary between 64 and 128 rows, fused vs scratch with the CUDA
# decoder, on 14336 x 4096 (not covered by v13b) and 4096 x 4096, to check configs.SCRATCH_HALF_FORMAT_MIN_M.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  PYTHONPATH=. UQR_QMMA_TAG=v13 timeout 200 python3 bench/qmma_sweep.py --M 72,80,96,112 \
    --shapes 14336x4096,4096x4096 --formats q8_0,ternary --peers fused,scratch --reps 20 --json "$OUT/sweep_rows.json" \
    | grep -v " v13 "
  date -u
} 2>&1 | tee "$OUT/run.log"
