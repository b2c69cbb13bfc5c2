#!/usr/bin/env bash
# v66 on the lent H200: the fused split-K reduction with per-stream arrival counters that stay zero
# between calls (no memset a call), pairs 32 / 42 / 22, against v65's fresh zeroed counters
# (UQR_SPLIT16_ZEROS=1) at pair 32.
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
F=q4_0,q4_k,mlx4,ternary
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_qmma.py tests/test_cuda_pdl.py
  for cfg in 32 42 22; do
    echo "== split K, config $cfg"
    UQR_QMMA_TAG=cfg$cfg UQR_SPLIT16_CFG=$cfg timeout 90 python3 bench/qmma_sweep.py --M 9,16 --formats $F \
      --reps 20 --json "$OUT/cfg$cfg.json"
  done
  echo "== split K, config 32, counters zeroed every call"
  UQR_QMMA_TAG=zeros UQR_SPLIT16_ZEROS=1 timeout 90 python3 bench/qmma_sweep.py --M 9,16 --formats q4_0,mlx4 \
    --shapes 14336x4096,4096x14336 --reps 20 --json "$OUT/zeros.json"
  date -u
} 2>&1 | tee "$OUT/run.log"
