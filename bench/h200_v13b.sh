#!/usr/bin/env bash
# v13b on the lent H200: what limits the scratch path at M = 512-2048 (NOTES v13): ncu's speed-of-light
# and memory sections for the decoder and cuBLAS's kernel inside the scratch path, 14336 x 4096;
# then the 24-96-row dispatch thresholds re-timed with the CUDA decoder.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  timeout 200 ncu --clock-control none --kernel-name regex:"dequant_kernel|nvjet" --launch-count 8 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    python3 - > "$OUT/ncu_v13b.txt" 2>&1 <<'PY'
import torch
from torch_uqr.triton_kernels.dispatch import gemm_triton
from torch_uqr.triton_kernels.testing import random_packed
for fmt in ("q4_0", "q8_0", "var_affine", "exl3"):
    w = random_packed(fmt, 14336, 4096, 0, seed=1, device="cuda")
    for M in (512, 2048) if fmt == "q4_0" else (2048,):
        gemm_triton(torch.randn(M, 4096, device="cuda", dtype=torch.bfloat16), w, fmt, 14336, 4096, kernel="scratch")
torch.cuda.synchronize()
PY
  grep -E "^  [a-zA-Z_:<>, ]*(dequant_kernel|nvjet)|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|L2 Hit Rate|Achieved Occupancy|Registers Per" "$OUT/ncu_v13b.txt" | head -80
  echo "== 24-96 rows on N = 4096 shapes: fused vs scratch with the CUDA decoder (configs.SCRATCH_HALF_*)"
  PYTHONPATH=. UQR_QMMA_TAG=v13 timeout 200 python3 bench/qmma_sweep.py --M 24,32,48,64,96 \
    --shapes 4096x4096,4096x14336 --formats q8_0,ternary,q4_0 --peers fused,scratch --reps 20 --json "$OUT/sweep_rows.json"
  date -u
} 2>&1 | tee "$OUT/run.log"
