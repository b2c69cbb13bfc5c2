#!/usr/bin/env bash
# v80 (session 26): the fused split-K fix-up at 9-16 rows (the CTA that completes a tile's count adds
# its planes and writes y; no reduce_splits launch) against the reduce kernel (UQR_SPLIT_FIXUP=0).
# Runs on commit 96971e2 only: the fix-up (and UQR_SPLIT_FIXUP) was removed after it (NOTES v80).
# With the fix-up every format runs the 128-register stream-K kernel, so the A/B has three
# configurations: fix-up (default), reduce with the previous default builds (off), reduce with the
# 128-register build for all (off128: isolates the fix-up from the register change).
# Build, the split / stream-K GPU tests, memcheck of crossing stream-K grids, the A/B at 16 rows in
# two rounds. About 8 min.
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_qmma.py -k "split or streamk or every_m"
  echo "== memcheck, fused fix-up (9000 x 4096, 16 and 9 rows; 300 x 4096, 11 rows; mlx4 g128 power-of-two split)"
  timeout 100 compute-sanitizer --tool memcheck --print-limit 10 python3 - <<'PY' 2>&1 | tail -4
import torch
from torch_uqr.triton_kernels.dispatch import gemm_triton
from torch_uqr.triton_kernels.testing import random_packed
for fmt, g, N, rows in (("q4_0", 0, 9000, 16), ("mlx4", 64, 9000, 9), ("q4_k", 0, 300, 11),
                        ("var_affine", 0, 9000, 16), ("mlx4", 128, 300, 16)):
    w = random_packed(fmt, N, 4096, g, seed=9, device="cuda")
    for _ in range(2):
        gemm_triton(torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16), w, fmt, N, 4096, g, kernel="qmma")
torch.cuda.synchronize()
PY
  run_cfg() {  # round, config name
    local envs
    case $2 in fixup) envs="UQR_SPLIT_FIXUP=1";; off) envs="UQR_SPLIT_FIXUP=0";;
               off128) envs="UQR_SPLIT_FIXUP=0 UQR_STREAMK_REGS=128";; esac
    echo "== round $1, $2 ($envs)"
    env $envs UQR_QMMA_TAG=$2 timeout 100 python3 bench/qmma_sweep.py --M 16 \
      --formats q4_0,q4_1,q8_0,q4_k,mlx4,var_affine,exl3,ternary --shapes 14336x4096,4096x14336,4096x4096 \
      --reps 20 --json "$OUT/r${1}_$2.json" | grep -v "^$"
  }
  for cfg in off fixup off128; do run_cfg 1 $cfg; done
  for cfg in fixup off; do run_cfg 2 $cfg; done
  date -u
} 2>&1 | tee "$OUT/run.log"
