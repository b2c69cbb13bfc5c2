#!/usr/bin/env bash
# v76 on the lent H200: stream-K for 9-16 rows (the mid-M kernel's CTAs dealt equal ranges of all
# tiles' stages instead of 2 K-splits a tile). Build, the qmma GPU tests, then 16 rows on 14336 x
# 4096 for every format: stream-K off (UQR_STREAMK=0: 2 splits, 224 CTAs), 2 CTAs an SM (264), 3 (396).
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_qmma.py
  for round in 1 2; do
    for cfg in "UQR_STREAMK=0" "UQR_STREAMK_PER_SM=2" "UQR_STREAMK_PER_SM=3"; do
      echo "== round $round, $cfg"
      env $cfg UQR_QMMA_TAG="$cfg" timeout 100 python3 bench/qmma_sweep.py --M 16 \
        --formats q4_0,q4_1,q8_0,q4_k,mlx4,var_affine,exl3,ternary --shapes 14336x4096 --reps 20 \
        --json "$OUT/r${round}_${cfg#UQR_}.json" | grep -v "^$"
    done
  done
  date -u
} 2>&1 | tee "$OUT/run.log"
