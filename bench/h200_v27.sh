#!/usr/bin/env bash
# v27 on the lent H200: the small-M kernel with (bit 0) q4_0 / ternary's zero point taken off by two
# more MMAs at one column tile instead of eight HSUB2s, (bit 1) x loaded a trip ahead into two
# register sets at two column tiles. A/B by UQR_QMMA_VARIANT (0 = neither, 3 = both) in one run,
# then the qmma GPU tests and ncu of the new kernel at 1 and 16 rows.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  t0=$(date +%s)
  python3 -m pytest -q -n 8 tests/test_cuda_qmma.py 2>&1 | tail -2
  UQR_QMMA_VARIANT=1 python3 -m pytest -q -n 8 tests/test_cuda_qmma.py 2>&1 | tail -1
  echo "tests took $(( $(date +%s) - t0 )) s"
  for v in 0 3; do
    UQR_QMMA_VARIANT=$v UQR_QMMA_TAG=v27_$v PYTHONPATH=. timeout 200 python3 bench/qmma_sweep.py --M 1,16 \
      --shapes 14336x4096,4096x14336,4096x4096 --formats q4_0,q4_1,q4_k,mlx4,q8_0,var_affine,exl3,ternary \
      --reps 20 --json "$OUT/sweep_v$v.json"
  done
  h200_ncu_small_m h200_v27_ncu.txt
  date -u
} 2>&1 | tee "$OUT/run.log"
