#!/usr/bin/env bash
# v55 on the lent H200: the review's restructuring of the int8 pre-pass (one meta store for every
# code order, no behaviour change): sm_90a build, the int8 / chained-call GPU tests under -n 8, and
# the stress loop under a second process's load.
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_int8.py tests/test_cuda_pdl.py
  python3 bench/ternary_int8_stress.py --load & lp=$!
  sleep 3; python3 bench/ternary_int8_stress.py --iters 40; kill $lp 2>/dev/null; wait $lp 2>/dev/null
  date -u
} 2>&1 | tee "$OUT/run.log"
