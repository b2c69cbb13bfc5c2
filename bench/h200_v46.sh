#!/usr/bin/env bash
# v46 on the lent H200: path int8 for mlx4 (g = 32 / 64, one row, the block-column kernel with x
# scaled per group): build, the int8 / chained-call GPU tests, then one row on all three shapes,
# int8 against the exact small-M kernel in the same run (mlx4 at g = 64), twice.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_int8.py tests/test_cuda_pdl.py
  h200_int8_probe_rounds
  date -u
} 2>&1 | tee "$OUT/run.log"
