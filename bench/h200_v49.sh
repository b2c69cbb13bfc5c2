#!/usr/bin/env bash
# v49 on the lent H200 (the session's last ~240 s of device time): the final code's new kernels
# once more - the sm_90a build, the int8 / chained-call / scratch-pipeline GPU tests, and
# compute-sanitizer memcheck on the block-column int8 kernel (q4_0, q4_k, mlx4 g = 32 / 64, heads)
# and the pipeline's 35 % first slice. (The whole memcheck case list is bench/h200_run.sh's.)
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  python3 -m pytest -q -n 8 tests/test_cuda_int8.py tests/test_cuda_pdl.py tests/test_cuda_scratch_pipeline.py 2>&1 | tail -2
  echo "== compute-sanitizer memcheck: int8 one row (block columns), pipeline first slice"
  timeout 120 compute-sanitizer --tool memcheck --print-limit 20 python3 - <<'PY' 2>&1 | tail -6
import torch
from torch_uqr.triton_kernels.dispatch import gemm_triton
from torch_uqr.triton_kernels.testing import random_packed
from torch_uqr.triton_kernels.dequant import dequantize_cuda
from torch_uqr.triton_kernels.scratch_pipeline import scratch_pipelined
for fmt, g in (("q4_0", 0), ("q4_k", 0), ("mlx4", 32), ("mlx4", 64)):
    w = random_packed(fmt, 37, 1024, g, seed=7, device="cuda")
    gemm_triton(torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16), w, fmt, 37, 1024, g, kernel="int8")
    gemm_triton(torch.randn(1, 2, 1, 512, device="cuda", dtype=torch.float16), w, fmt, 37, 1024, g,
                out_heads=1, in_heads=True, kernel="int8")
w = random_packed("q4_k", 1000, 1024, 0, seed=4, device="cuda")
scratch_pipelined(torch.randn(33, 1024, device="cuda", dtype=torch.bfloat16), w, "q4_k", 1000, 1024, 0,
                  torch.empty(33, 1000, device="cuda", dtype=torch.bfloat16), dequantize_cuda, 2, 2, 0.35)
torch.cuda.synchronize(); print("sanitizer case ran")
PY
  date -u
} 2>&1 | tee "$OUT/run.log"
