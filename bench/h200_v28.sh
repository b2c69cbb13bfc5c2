#!/usr/bin/env bash
# v28 on the lent H200: the small-M kernel with x loaded a trip ahead at two column tiles (v27's
# bit 1 only, mlx4 excluded): every CUDA GPU test, the 9 / 16-row sweep, then the pipelined scratch
# path against the plain one around M = 512 (each configuration twice, to see the spread).
source "$(dirname "$0")/h200_lib.sh"
{
  h200_build_and_test_all || exit 1
  UQR_QMMA_TAG=v28 PYTHONPATH=. timeout 150 python3 bench/qmma_sweep.py --M 1,9,16 \
    --shapes 14336x4096,4096x14336,4096x4096 --formats q4_0,q4_1,q4_k,mlx4,q8_0,var_affine,exl3,ternary \
    --reps 20 --json "$OUT/sweep_rows.json"
  PYTHONPATH=. timeout 200 python3 bench/pipeline_probe.py --shapes 14336x4096,4096x14336 --M 384,512,768 \
    --formats q4_0,q4_k,mlx4 --configs 1x1,2x2,1x1,2x2,4x2 --reps 20 --json "$OUT/pipeline.json"
  date -u
} 2>&1 | tee "$OUT/run.log"
