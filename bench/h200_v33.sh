#!/usr/bin/env bash
# v33 on the lent H200: the int8 kernel back to global-memory x (v32's shared-memory staging lost
# at every row count), keeping the pre-pass overlap, with per-variant register caps (one row at 72:
# 7 CTAs of 4 warps an SM). Tests: int8, small-M, dispatch rules; then int8 vs exact at 1 / 8 / 16
# rows on the three shapes.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  t0=$(date +%s)
  python3 -m pytest -q -n 8 tests/test_cuda_int8.py tests/test_cuda_qmma.py tests/test_cuda_dispatch_rules.py \
    tests/test_gemm_cpu_int8.py 2>&1 | tail -4
  echo "tests took $(( $(date +%s) - t0 )) s"
  PYTHONPATH=. timeout 200 python3 bench/int8_probe.py --M 1,8,16 --reps 20 --json "$OUT/int8_probe.json"
  date -u
} 2>&1 | tee "$OUT/run.log"
