#!/usr/bin/env bash
# v13c on the lent H200 (the variant it timed was reverted after it, NOTES v13c): the decoder with 4 weight rows per CTA staged by cp.async (csrc/cuda/dequant.cu;
# v13b's ncu had the one-row version at 62-68 % of DRAM peak). Build, the decoder's and the
# pipeline's GPU tests, sanitizer on sliced rows, decode timings beside Triton's (same run), then
# the benchmark on 14336 x 4096 from M = 128 (paired ratios from M = 512).
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  echo "== GPU tests"
  timeout 150 python3 -m pytest -q -n 8 tests/test_cuda_dequant.py tests/test_cuda_scratch_pipeline.py 2>&1 | tail -3
  echo "== compute-sanitizer memcheck (sliced rows at odd offsets, partial tiles, N not a multiple of 4)"
  timeout 120 compute-sanitizer --tool memcheck --print-limit 10 python3 - <<'PY' 2>&1 | tail -4
import torch
from torch_uqr.triton_kernels.dequant import dequantize_cuda
from torch_uqr.triton_kernels.testing import random_packed
for fmt, g in (("q4_0", 0), ("q8_0", 0), ("q4_k", 0), ("mlx4", 128), ("var_affine", 0), ("exl3", 0), ("ternary", 0)):
    for N, K, offset in ((5, 2304, 0), (7, 256, 3), (6, 4352, 1)):
        w = random_packed(fmt, N, K, g, seed=1, device="cuda")
        buf = torch.zeros(N, w.shape[1] + offset + 1, dtype=torch.uint8, device="cuda")
        buf[:, offset:offset + w.shape[1]] = w
        for dtype in (torch.bfloat16, torch.float32):
            dequantize_cuda(buf[:, offset:offset + w.shape[1]], fmt, N, K, g, dtype=dtype)
torch.cuda.synchronize(); print("sanitizer case ran")
PY
  echo "== decode timings (CUDA vs Triton, same run)"
  PYTHONPATH=. timeout 150 python3 bench/dequant_bench.py --shapes 14336x4096 --M "" --reps 20 --json "$OUT/dequant.json" 2>&1 | tail -20
  echo "== benchmark 14336 x 4096, M >= 128"
  timeout 200 python3 -m torch_uqr.bench_cuda --shapes 14336x4096 --M 128,512,2048,4096 --json "$OUT/bench.json" \
    --table "$OUT/table.md" 2>&1 | grep -E "paired|cublas|^\|"
  date -u
} 2>&1 | tee "$OUT/run.log"
