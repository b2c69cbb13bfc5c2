#!/usr/bin/env bash
# v12 on the H200: the CUDA C++ decode-to-dense kernel (csrc/cuda/dequant.cu) for the large-M
# scratch path. Build (sm_90a), its GPU tests, then per format on 14336x4096 and 4096x14336 -> bf16
# the CUDA vs Triton decode and the scratch matmul at M = 512 / 4096 beside cuBLAS bf16.
# Every section has its own timeout and a failing one does not stop the next.
#   OUT=/tmp/uqr_out bash bench/h200_v12_dequant.sh        (~3-4 minutes; results in $OUT)
source bench/h200_lib.sh
h200_header
h200_build || exit 1
echo "== GPU tests"
timeout 150 python3 -m pytest -q -x -n 8 tests/test_cuda_dequant.py -k "not errors" 2>&1 | tail -4
# The error cases apart: one of them segfaulted on the H200 (run of 11:23 UTC) instead of raising;
# each is its own test so the report names it.
timeout 90 python3 -m pytest -q -n 8 -rf tests/test_cuda_dequant.py -k errors 2>&1 | tail -8
echo "== compute-sanitizer memcheck (every format, sliced rows at odd offsets, partial tiles)"
timeout 120 compute-sanitizer --tool memcheck --print-limit 10 python3 - <<'PY' 2>&1 | tail -6
import torch
from torch_uqr.triton_kernels.dequant import dequantize_cuda
from torch_uqr.triton_kernels.testing import random_packed
for fmt, g in (("q4_0", 0), ("q4_1", 0), ("q8_0", 0), ("q4_k", 0), ("mlx4", 32), ("mlx4", 128),
               ("var_affine", 0), ("exl3", 0), ("ternary", 0)):
    for K, offset in ((2304, 0), (256, 3), (4352, 1)):
        w = random_packed(fmt, 5, K, g, seed=1, device="cuda")
        buf = torch.zeros(5, w.shape[1] + offset + 1, dtype=torch.uint8, device="cuda")
        buf[:, offset:offset + w.shape[1]] = w
        for dtype in (torch.bfloat16, torch.float32):
            dequantize_cuda(buf[:, offset:offset + w.shape[1]], fmt, 5, K, g, dtype=dtype)
torch.cuda.synchronize(); print("sanitizer case ran")
PY
echo "== decode + scratch timings"
PYTHONPATH=. timeout 240 python3 bench/dequant_bench.py --shapes 14336x4096,4096x14336 --M 512,4096 --reps 20 \
  --json "$OUT/v12_dequant.json" 2>&1 | tee "$OUT/v12_dequant.log"
echo "== mlx4 at g = 32 / 128 (decode only)"
PYTHONPATH=. timeout 60 python3 bench/dequant_bench.py --shapes 14336x4096 --formats mlx4 --mlx4-group 32 --M "" \
  --reps 20 --json "$OUT/v12_mlx4_g32.json" 2>&1 | tail -2
PYTHONPATH=. timeout 60 python3 bench/dequant_bench.py --shapes 14336x4096 --formats mlx4 --mlx4-group 128 --M "" \
  --reps 20 --json "$OUT/v12_mlx4_g128.json" 2>&1 | tail -2
date -u
