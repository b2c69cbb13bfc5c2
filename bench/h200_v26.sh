#!/usr/bin/env bash
# v26 on the lent H200: GPU tests of 7ea5456's review changes (wgmma / qmma), then ncu of the
# small-M kernel at 1 and 16 rows (what limits it: DRAM, L2 traffic of x, issue or latency).
source "$(dirname "$0")/h200_lib.sh"
{
  h200_build_and_test_mma || exit 1
  h200_ncu_small_m h200_v26_ncu.txt
  date -u
} 2>&1 | tee "$OUT/run.log"
