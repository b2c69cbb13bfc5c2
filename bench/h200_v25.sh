#!/usr/bin/env bash
# v25 on the lent H200: the final code's CUDA GPU tests after v24's dispatch change (wgmma from 17
# rows on sm_90 except q8_0, and its 129-256-row range only where K >= 8192): build, every CUDA GPU test.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_build_and_test_all || exit 1
  date -u
} 2>&1 | tee "$OUT/run.log"
