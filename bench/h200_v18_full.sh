#!/usr/bin/env bash
# One call: the full run (bench/h200_run.sh full: build, CUDA tests, sanitizer, benchmark) on the
# committed dispatch, then v18 (bench/h200_v18.sh's question, trimmed): the wgmma kernel at two
# CTAs an SM (UQR_WGMMA_BM=64 UQR_WGMMA_CTAS=2) - its tests, then its times beside one CTA an SM.
set -uo pipefail
OUT=${OUT:-/tmp/uqr_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
bash "$(dirname "$0")/h200_run.sh" full
{
  echo "== v18: two CTAs an SM"; date -u
  UQR_WGMMA_BM=64 UQR_WGMMA_CTAS=2 timeout 90 python3 -m pytest -q -rf tests/test_cuda_wgmma.py 2>&1 | tail -12
  for c in 2 1; do
    echo "--- CTAs an SM: $c"
    if [ "$c" = 2 ]; then export UQR_WGMMA_BM=64 UQR_WGMMA_CTAS=2; else unset UQR_WGMMA_BM UQR_WGMMA_CTAS; fi
    PYTHONPATH=. timeout 80 python3 bench/qmma_sweep.py --no-qmma --M 32,64,128,256 \
      --shapes 14336x4096,4096x14336 --formats q4_0,exl3,ternary --peers wgmma --reps 15 --json "$OUT/v18_ctas$c.json"
  done
  date -u
} 2>&1 | tee "$OUT/v18.log"
