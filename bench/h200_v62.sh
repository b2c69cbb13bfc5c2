#!/usr/bin/env bash
# v62 on the lent H200: the review's mend (int8 pre-pass: one-row-only formats instantiate only the
# block-column code order; capped_smem's device attributes read once, thread-safely): sm_90a build
# and the int8 / chained-call GPU tests.
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_int8.py tests/test_cuda_pdl.py
  date -u
} 2>&1 | tee "$OUT/run.log"
