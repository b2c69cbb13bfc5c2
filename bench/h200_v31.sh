#!/usr/bin/env bash
# v31 on the lent H200: path "int8" on CUDA (csrc/cuda/qmma_int8.cu: int8 x, integer MMAs, q4_0 /
# q4_k at 1-16 rows). The int8, small-M and dispatch GPU tests, then int8 against the exact small-M
# kernel at 1 / 8 / 16 rows on the three shapes (bench/int8_probe.py).
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  t0=$(date +%s)
  python3 -m pytest -q -n 8 tests/test_cuda_int8.py tests/test_cuda_qmma.py \
    tests/test_cuda_dispatch_rules.py tests/test_gemm_cpu_int8.py 2>&1 | tail -15
  echo "tests took $(( $(date +%s) - t0 )) s"
  PYTHONPATH=. timeout 200 python3 bench/int8_probe.py --M 1,8,16 --reps 20 --json "$OUT/int8_probe.json"
  date -u
} 2>&1 | tee "$OUT/run.log"
