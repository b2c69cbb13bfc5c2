#!/usr/bin/env bash
# v22 on the lent H200: the full run (h200_run.sh full: both archs, every CUDA GPU test, the error
# probe, compute-sanitizer, the benchmark at 20 repetitions) with v21's wgmma kernel and the dispatch
# from its sweep, then two small A/B sweeps: one CTA an SM (split rings) against two (whole stages)
# at 32-64 rows, and wgmma vs scratch at 192 rows.
OUT=${OUT:-/tmp/uqr_out}
bash "$(dirname "$0")/h200_run.sh" full --reps 20
{
  for ctas in 1 2; do
    echo "== UQR_WGMMA_CTAS=$ctas"
    UQR_WGMMA_CTAS=$ctas PYTHONPATH=. timeout 60 python3 bench/qmma_sweep.py --no-qmma --M 32,48,64 \
      --shapes 14336x4096,4096x14336 --formats q4_0,exl3,q8_0 --peers wgmma --reps 15
  done
  PYTHONPATH=. timeout 60 python3 bench/qmma_sweep.py --no-qmma --M 192 --shapes 14336x4096,4096x14336 \
    --formats q4_0,mlx4,var_affine --peers wgmma,scratch --reps 15 --json "$OUT/rows192.json"
  date -u
} 2>&1 | tee "$OUT/extra.log"
