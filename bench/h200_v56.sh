#!/usr/bin/env bash
# v56 on the lent H200: path "int8" for var_affine and exl3 (one row, block columns in
# qmma_int8.cu): sm_90a build, the int8 GPU tests under -n 8 (new formats included), then the probe
# at one row on the three shapes - int8 against the exact kernel and cuBLAS bf16 in the same run -
# and ncu of the two new kernels on 14336 x 4096.
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_int8.py tests/test_cuda_pdl.py
  echo "== probe, one row"
  timeout 200 python3 bench/int8_probe.py --M 1 --reps 20 --cublas --formats var_affine,exl3,q4_k \
    --json "$OUT/probe.json"
  echo "== ncu"
  INT8_NCU_FORMATS="var_affine exl3" h200_ncu_int8 ncu.txt
  date -u
} 2>&1 | tee "$OUT/run.log"
