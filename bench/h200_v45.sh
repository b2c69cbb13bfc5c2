#!/usr/bin/env bash
# v45 on the lent H200: ncu of path int8 at one row with block columns (v43-v44), q4_0 and q4_k on
# 14336 x 4096, the x pre-pass and the main kernel: what limits it now (issue, latency or bytes).
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  echo "== ncu, int8 pre-pass and main kernel (block columns), one row"
  h200_ncu_int8 ncu_int8.txt "quantize_x_kernel|qmma_int8_kernel" 4
  date -u
} 2>&1 | tee "$OUT/run.log"
