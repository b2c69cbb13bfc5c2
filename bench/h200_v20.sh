#!/usr/bin/env bash
# v20 on the lent H200: the wgmma kernel with stages overlapped (a stage's last batch multiplies
# while the next stage's first batch decodes; v19 drained every stage) and its weight reads as
# LDS (v19's SASS had generic 64-bit LDs: the aligned shared pointer was rebuilt from an integer).
# Build, the wgmma and qmma GPU tests, then wgmma vs scratch at 64-512 rows, then ncu with stall reasons.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_build_and_test_mma || exit 1
  PYTHONPATH=. timeout 200 python3 bench/qmma_sweep.py --cublas --no-qmma --M 64,128,256,512 \
    --shapes 14336x4096 --formats q4_0,q4_1,q4_k,mlx4,q8_0,var_affine,exl3,ternary --peers wgmma,scratch --reps 15 \
    --json "$OUT/sweep_14336.json"
  PYTHONPATH=. timeout 120 python3 bench/qmma_sweep.py --cublas --no-qmma --M 128,256,512 \
    --shapes 4096x4096,4096x14336 --formats q4_0,exl3,var_affine --peers wgmma,scratch --reps 15 \
    --json "$OUT/sweep_other.json"
  h200_ncu_wgmma ncu_v20.txt
  date -u
} 2>&1 | tee "$OUT/run.log"
