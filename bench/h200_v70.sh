#!/usr/bin/env bash
# v70 on the lent H200: how many ways the 9-16-row kernel splits K (UQR_SPLIT16_SPLITS), 16 rows:
# 14336 x 4096 (default 2) at 2 / 3 / 4, 4096 x 14336 (default 8) at 6 / 8 / 12.
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
{
  h200_header
  h200_build || exit 1
  for s in 2 3 4; do
    echo "== 14336x4096, $s splits"
    UQR_QMMA_TAG=s$s UQR_SPLIT16_SPLITS=$s timeout 60 python3 bench/qmma_sweep.py --M 16 --formats q4_0,q4_k,mlx4,exl3 \
      --shapes 14336x4096 --reps 20 --json "$OUT/a$s.json"
  done
  for s in 6 8 12; do
    echo "== 4096x14336, $s splits"
    UQR_QMMA_TAG=s$s UQR_SPLIT16_SPLITS=$s timeout 60 python3 bench/qmma_sweep.py --M 16 --formats q4_0,q4_k,mlx4 \
      --shapes 4096x14336 --reps 20 --json "$OUT/b$s.json"
  done
  date -u
} 2>&1 | tee "$OUT/run.log"
