#!/usr/bin/env bash
# v21 on the lent H200: the wgmma kernel with split rings (x in half-stage slots copied up to 3-6
# batches ahead, weights in stage slots; v20 had whole stages, 2 at 128-row tiles) and a short
# epilogue (v20's unrolled store_acc: ~6k instructions, cold in the instruction cache).
# Build, the wgmma and qmma GPU tests, wgmma vs the mid-M kernel vs scratch at 32-512 rows, ncu.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_build_and_test_mma || exit 1
  PYTHONPATH=. timeout 240 python3 bench/qmma_sweep.py --cublas --M 32,48,64,128,256,512 \
    --shapes 14336x4096 --formats q4_0,q4_1,q4_k,mlx4,q8_0,var_affine,exl3,ternary --peers wgmma,scratch --reps 15 \
    --json "$OUT/sweep_14336.json" | grep -v "qmma.*M=\(128\|256\|512\)"
  PYTHONPATH=. timeout 120 python3 bench/qmma_sweep.py --cublas --no-qmma --M 32,64,128,256,512 \
    --shapes 4096x4096,4096x14336 --formats q4_0,exl3,var_affine --peers wgmma,scratch --reps 15 \
    --json "$OUT/sweep_other.json"
  h200_ncu_wgmma ncu_v21.txt
  date -u
} 2>&1 | tee "$OUT/run.log"
