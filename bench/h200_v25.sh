#!/usr/bin/env bash
# v25 on the lent H200: the final code's CUDA GPU tests after v24's dispatch change (wgmma from 17
# rows on sm_90 except q8_0, and its 129-256-row range only where K >= 8192): build, every CUDA GPU test.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  t0=$(date +%s)
  python3 -m pytest -q -n 8 tests/test_triton_cuda.py tests/test_cuda_qmma.py tests/test_cuda_dequant.py \
    tests/test_cuda_scratch_pipeline.py tests/test_cuda_wgmma.py tests/test_cuda_dispatch_rules.py 2>&1 | tail -4
  echo "tests took $(( $(date +%s) - t0 )) s"
  date -u
} 2>&1 | tee "$OUT/run.log"
