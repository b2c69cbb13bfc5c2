#!/usr/bin/env bash
# v48b on the lent H200: the message of v48's one failing test (ternary, one row).
# The ternary int8 code these ran is in no commit (NOTES v48).
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  python3 -m pytest -q -x tests/test_cuda_int8.py -k "one_row_formats and ternary" 2>&1 | grep -E "Error|assert|where|excess|ternary" | head -30
  date -u
} 2>&1 | tee "$OUT/run.log"
