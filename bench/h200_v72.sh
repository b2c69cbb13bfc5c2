#!/usr/bin/env bash
# v72 on the lent H200: v71 with the cluster sums' tile origin fixed (v71 added the warp's 16 rows
# twice: wrong outputs), the same A/B at 16 rows, cluster first and last.
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
F=q4_0,q4_1,q4_k,mlx4,ternary,exl3
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_qmma.py tests/test_cuda_pdl.py
  echo "== cluster sums (default)"
  UQR_QMMA_TAG=cl timeout 100 python3 bench/qmma_sweep.py --M 16 --formats $F --reps 20 --cublas --json "$OUT/cl.json"
  echo "== reduce kernel"
  UQR_QMMA_TAG=rk UQR_SPLIT16_CLUSTER=0 timeout 100 python3 bench/qmma_sweep.py --M 16 --formats $F --reps 20 --json "$OUT/rk.json"
  echo "== cluster sums again"
  UQR_QMMA_TAG=cl2 timeout 100 python3 bench/qmma_sweep.py --M 16 --formats $F --reps 20 --json "$OUT/cl2.json"
  date -u
} 2>&1 | tee "$OUT/run.log"
