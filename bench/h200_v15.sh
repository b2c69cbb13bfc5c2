#!/usr/bin/env bash
# v15 on the lent H200: the wgmma kernel with batches of 4 sub-blocks per commit group and split-K. Build, its GPU tests,
# then its times beside cuBLAS and the scratch path (which auto takes at these rows today).
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  timeout 240 python3 -m pytest -q -rf tests/test_cuda_wgmma.py 2>&1 | tail -30
  PYTHONPATH=. timeout 150 python3 bench/qmma_sweep.py --no-qmma --cublas --M 64,128,512,2048 \
    --shapes 14336x4096 --formats q4_0,q4_k,mlx4,q8_0,var_affine,exl3,ternary --peers wgmma,scratch --reps 20 \
    --json "$OUT/sweep_14336.json"
  PYTHONPATH=. timeout 60 python3 bench/qmma_sweep.py --no-qmma --cublas --M 128,512,2048 \
    --shapes 4096x4096,4096x14336 --formats q4_0 --peers wgmma,scratch --reps 20 --json "$OUT/sweep_other.json"
  date -u
} 2>&1 | tee "$OUT/run.log"
