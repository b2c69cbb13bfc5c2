#!/usr/bin/env bash
# v73 on the lent H200: 14336 x 4096 at 16 rows, how many ways to split K (UQR_SPLIT16_SPLITS) with
# the splits summed in clusters and by the reduce kernel (UQR_SPLIT16_CLUSTER=0). 112 row tiles x 16
# stages: with s splits the busiest SM does ceil(112 s / 132) * 16 / s stages, 16 for s = 2-6 but
# 13.7 at s = 7 and 14 at s = 8 (4096 x 14336 at its 8 splits: 14 of 56 x 32 = 1792 stages).
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
{
  h200_header
  h200_build || exit 1
  for s in 2 6 7 8; do
    for cl in 1 0; do
      echo "== $s splits, cluster $cl"
      UQR_QMMA_TAG=s${s}c$cl UQR_SPLIT16_SPLITS=$s UQR_SPLIT16_CLUSTER=$cl timeout 60 python3 bench/qmma_sweep.py --M 16 \
        --formats q4_0,q4_k,mlx4,ternary --shapes 14336x4096 --reps 20 --json "$OUT/s${s}c$cl.json"
    done
  done
  date -u
} 2>&1 | tee "$OUT/run.log"
