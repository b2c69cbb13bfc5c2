#!/usr/bin/env bash
# v23 on the lent H200: wgmma tile rows past the last activation row zero-filled instead of all
# re-reading the last row (v22: 192 rows slower than 256), and two CTAs an SM at <= 64 rows only where
# the grid splits K (v22's A/B). The checks of the full run (both archs, every CUDA GPU test, error
# probe, compute-sanitizer), then wgmma vs scratch at 48-256 rows to set the dispatch's row ranges.
OUT=${OUT:-/tmp/uqr_out}
bash "$(dirname "$0")/h200_run.sh" checks
{
  PYTHONPATH=. timeout 150 python3 bench/qmma_sweep.py --no-qmma --M 32,64,96,160,192,256 --shapes 14336x4096,4096x14336 \
    --formats q4_0,mlx4,var_affine,exl3,ternary --peers wgmma,scratch --reps 15 --json "$OUT/rows.json"
  date -u
} 2>&1 | tee "$OUT/extra.log"
