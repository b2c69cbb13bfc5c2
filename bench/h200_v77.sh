#!/usr/bin/env bash
# v77 (written in session 23, not run: no device was lent after v76): stream-K at 9-16 rows on all
# three shapes, K split in power-of-two ways (UQR_STREAMK=0) against the default (stream-K where
# that split leaves > 5 % of 2 CTAs an SM empty: 14336 x 4096) and stream-K everywhere (=2).
# Build, the stream-K GPU tests, memcheck of crossing stream-K grids, the A/B.
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_qmma.py -k "split or streamk or every_m"
  UQR_STREAMK=2 h200_tests tests/test_cuda_qmma.py -k "split_k_rows or streamk_wide"
  echo "== memcheck, stream-K (9000 x 4096, 16 rows; 300 x 4096, 11 rows)"
  timeout 120 compute-sanitizer --tool memcheck --print-limit 10 python3 - <<'PY' 2>&1 | tail -4
import torch
from torch_uqr.triton_kernels.dispatch import gemm_triton
from torch_uqr.triton_kernels.testing import random_packed
for fmt, g, N, rows in (("q4_0", 0, 9000, 16), ("mlx4", 64, 9000, 9), ("q4_k", 0, 300, 11)):
    w = random_packed(fmt, N, 4096, g, seed=9, device="cuda")
    gemm_triton(torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16), w, fmt, N, 4096, g, kernel="qmma")
torch.cuda.synchronize()
PY
  for round in 1 2; do
    for cfg in off auto all; do
      case $cfg in off) envs="UQR_STREAMK=0";; auto) envs="UQR_STREAMK=1";; all) envs="UQR_STREAMK=2";; esac
      echo "== round $round, $cfg ($envs)"
      env $envs UQR_QMMA_TAG=$cfg timeout 150 python3 bench/qmma_sweep.py --M 9,16 \
        --formats q4_0,q4_1,q8_0,q4_k,mlx4,var_affine,exl3,ternary --shapes 14336x4096,4096x14336,4096x4096 \
        --reps 20 --json "$OUT/r${round}_$cfg.json" | grep -v "^$"
    done
  done
  date -u
} 2>&1 | tee "$OUT/run.log"
