#!/usr/bin/env bash
# v42 on the lent H200 (the session's last ~300 s of device time): the sm_90a build and ncu of the
# int8 main kernel at one row with x a stage ahead in registers (XPipe), q4_0 and q4_k on 14336 x
# 4096, into $OUT/ncu_int8.txt: what limits it now, after v39's profile of the kernel without it.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  echo "== ncu, int8 main kernel (XPipe), one row"
  h200_ncu_int8 ncu_int8.txt
  date -u
} 2>&1 | tee "$OUT/run.log"
