#!/usr/bin/env bash
# v71 on the lent H200 (an experiment since removed from csrc/, bench/NOTES.md v71-v73): 9-16 rows with the splits of K summed inside thread-block clusters through
# distributed shared memory (default on sm_90) against the reduce kernel (UQR_SPLIT16_CLUSTER=0),
# in one build: GPU tests (with the other sum paths in their own processes), memcheck of the
# cluster kernel, then both at 9 and 16 rows, cluster timed first and last.
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
F=q4_0,q4_1,q4_k,mlx4,ternary,q8_0,exl3,var_affine
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_qmma.py tests/test_cuda_wgmma.py tests/test_cuda_pdl.py
  echo "== compute-sanitizer (memcheck): cluster sums, 9-16 rows"
  timeout 150 compute-sanitizer --tool memcheck --print-limit 20 python3 - <<'PY' 2>&1 | tail -6
import torch
from torch_uqr.triton_kernels.dispatch import gemm_triton
from torch_uqr.triton_kernels.testing import random_packed
for fmt, g in (("q4_0", 0), ("q4_k", 0), ("mlx4", 128), ("var_affine", 0), ("exl3", 0)):
    w = random_packed(fmt, 300, 4096, g, seed=8, device="cuda")
    for rows in (9, 16):
        gemm_triton(torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16), w, fmt, 300, 4096, g, kernel="qmma")
    gemm_triton(torch.randn(2, 2, 8, 2048, device="cuda", dtype=torch.float16), w, fmt, 300, 4096, g,
                out_heads=3, in_heads=True, kernel="qmma")
torch.cuda.synchronize(); print("sanitizer case ran")
PY
  echo "== cluster sums (default)"
  UQR_QMMA_TAG=cl timeout 150 python3 bench/qmma_sweep.py --M 9,16 --formats $F --reps 20 --cublas --json "$OUT/cl.json"
  echo "== reduce kernel"
  UQR_QMMA_TAG=rk UQR_SPLIT16_CLUSTER=0 timeout 120 python3 bench/qmma_sweep.py --M 9,16 --formats $F --reps 20 --json "$OUT/rk.json"
  echo "== cluster sums again, 16 rows"
  UQR_QMMA_TAG=cl2 timeout 80 python3 bench/qmma_sweep.py --M 16 --formats $F --reps 20 --json "$OUT/cl2.json"
  date -u
} 2>&1 | tee "$OUT/run.log"
