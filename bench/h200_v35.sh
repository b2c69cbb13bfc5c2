#!/usr/bin/env bash
# v35 on the lent H200: the int8 kernel's one-row x staged through the weight ring (v32) or read
# from global memory (v34), both in one build (UQR_INT8_XRING=1 / 0), on the three shapes.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  t0=$(date +%s)
  python3 -m pytest -q -n 8 tests/test_cuda_int8.py tests/test_cuda_dispatch_rules.py 2>&1 | tail -3
  UQR_INT8_XRING=1 python3 -m pytest -q -n 8 tests/test_cuda_int8.py 2>&1 | tail -2
  echo "tests took $(( $(date +%s) - t0 )) s"
  for ring in 1 0; do
    echo "-- UQR_INT8_XRING=$ring"
    UQR_INT8_XRING=$ring PYTHONPATH=. timeout 100 python3 bench/int8_probe.py --M 1 --reps 20 --json "$OUT/int8_xring$ring.json"
  done
  date -u
} 2>&1 | tee "$OUT/run.log"
