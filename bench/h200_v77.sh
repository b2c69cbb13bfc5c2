#!/usr/bin/env bash
# v77 (written in sessions 23-24, not run yet: no device was lent after v76): stream-K at 9-16 rows
# on all three shapes, K split in power-of-two ways (UQR_STREAMK=0) against the default (stream-K
# where that split leaves > 5 % of 2 CTAs an SM empty: 14336 x 4096), stream-K everywhere (=2), and
# the default with the stream-K kernel built for 128 registers (UQR_STREAMK_REGS=128, session 24).
# Build, the stream-K GPU tests (incl. the 128-register build, every format), memcheck of crossing
# stream-K grids in both builds, the A/B at 16 rows. About 9 min; the ncu profile is h200_v78_ncu.sh.
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_qmma.py -k "split or streamk or every_m"
  UQR_STREAMK=2 h200_tests tests/test_cuda_qmma.py -k "split_k_rows or streamk_wide"
  for envs in "UQR_STREAMK=1" "UQR_STREAMK=2 UQR_STREAMK_REGS=128"; do
    echo "== memcheck, stream-K ($envs; 9000 x 4096, 16 and 9 rows; 300 x 4096, 11 rows)"
    env $envs timeout 100 compute-sanitizer --tool memcheck --print-limit 10 python3 - <<'PY' 2>&1 | tail -4
import torch
from torch_uqr.triton_kernels.dispatch import gemm_triton
from torch_uqr.triton_kernels.testing import random_packed
for fmt, g, N, rows in (("q4_0", 0, 9000, 16), ("mlx4", 64, 9000, 9), ("q4_k", 0, 300, 11), ("var_affine", 0, 9000, 16)):
    w = random_packed(fmt, N, 4096, g, seed=9, device="cuda")
    gemm_triton(torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16), w, fmt, N, 4096, g, kernel="qmma")
torch.cuda.synchronize()
PY
  done
  run_cfg() {  # round, config name
    local envs
    case $2 in off) envs="UQR_STREAMK=0";; auto) envs="UQR_STREAMK=1";; all) envs="UQR_STREAMK=2";;
               regs) envs="UQR_STREAMK=1 UQR_STREAMK_REGS=128";; esac
    echo "== round $1, $2 ($envs)"
    env $envs UQR_QMMA_TAG=$2 timeout 100 python3 bench/qmma_sweep.py --M 16 \
      --formats q4_0,q4_1,q8_0,q4_k,mlx4,var_affine,exl3,ternary --shapes 14336x4096,4096x14336,4096x4096 \
      --reps 20 --json "$OUT/r${1}_$2.json" | grep -v "^$"
  }
  for cfg in off auto all regs; do run_cfg 1 $cfg; done
  for cfg in regs auto; do run_cfg 2 $cfg; done
  date -u
} 2>&1 | tee "$OUT/run.log"
