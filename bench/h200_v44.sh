#!/usr/bin/env bash
# v44 on the lent H200: the A/B of v43 that its grep hid - the int8 kernel at one row with block
# columns (default) against without (UQR_INT8_COLS=0: x staged below 4 CTAs an SM, else XPipe), two
# rounds in one build on all three shapes; then the pipelined scratch path's first-slice fraction
# around v43's best (35 %) at 512 rows on 14336 x 4096.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  for rep in 1 2; do
    for cols in 1 0; do
      echo "== UQR_INT8_COLS=$cols (round $rep)"
      UQR_INT8_COLS=$cols PYTHONPATH=. timeout 120 python3 bench/int8_probe.py --M 1 --reps 20 | grep " int8 "
    done
  done
  echo "== pipelined scratch, first-slice fraction"
  PYTHONPATH=. timeout 200 python3 bench/pipeline_probe.py --shapes 14336x4096 --M 512 \
    --formats q4_0,q4_k,exl3,mlx4 --configs 2x2,2x2f35,2x2f40,2x2f45,2x2,2x2f35,2x2f40 --reps 20 --json "$OUT/pipeline.json"
  date -u
} 2>&1 | tee "$OUT/run.log"
