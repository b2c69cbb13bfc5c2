#!/usr/bin/env bash
# v24 on the lent H200: where the mid-M mma.sync kernel should hand over to the wgmma kernel now that
# the latter zero-fills padded tile rows (v23: 30.7 us at 32 rows for q4_0, v21's mid-M kernel 33.2):
# both at 17-40 rows, every format, 14336 x 4096 (the mid-M kernel runs only where N >= 8192).
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  PYTHONPATH=. timeout 150 python3 bench/qmma_sweep.py --M 17,24,32,40 --shapes 14336x4096 \
    --formats q4_0,q4_1,q4_k,mlx4,q8_0,var_affine,exl3,ternary --peers wgmma --reps 15 --json "$OUT/mid_rows.json"
  date -u
} 2>&1 | tee "$OUT/run.log"
