#!/usr/bin/env bash
# v17 on the lent H200: what limits the wgmma kernel (ncu: speed of light, warp states, scheduler,
# memory, q4_0 at 64 and 128 rows on 14336 x 4096), then the rows where path auto should take it:
# wgmma vs the mid-M kernel (main rows, "qmma") vs the scratch path, 32-256 rows, three shapes.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  timeout 150 ncu --clock-control none --kernel-name regex:"qmma_wgmma_kernel" --launch-count 2 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    --section Occupancy --section ComputeWorkloadAnalysis --section LaunchStats \
    python3 - > "$OUT/ncu_v17.txt" 2>&1 <<'PY'
import torch
from torch_uqr.triton_kernels.dispatch import gemm_triton
from torch_uqr.triton_kernels.testing import random_packed
w = random_packed("q4_0", 14336, 4096, 0, seed=1, device="cuda")
for M in (64, 128):
    gemm_triton(torch.randn(M, 4096, device="cuda", dtype=torch.bfloat16), w, "q4_0", 14336, 4096, kernel="wgmma")
torch.cuda.synchronize()
PY
  grep -v "^==PROF==" "$OUT/ncu_v17.txt" | grep -E "qmma_wgmma|Duration|Throughput|Issue|Eligible|Active Warps|Occupancy|Stall|Registers|Shared Memory Config|Pipe|L2 Hit|Executed Ipc|No Eligible|Warp Cycles" | head -90
  PYTHONPATH=. timeout 150 python3 bench/qmma_sweep.py --cublas --M 32,64,128,256 \
    --shapes 14336x4096 --formats q4_0,q4_1,q4_k,mlx4,q8_0,var_affine,exl3,ternary --peers wgmma,scratch --reps 15 \
    --json "$OUT/sweep_rows_14336.json"
  PYTHONPATH=. timeout 90 python3 bench/qmma_sweep.py --cublas --M 32,64,128,256 \
    --shapes 4096x4096,4096x14336 --formats q4_0,exl3 --peers wgmma,scratch --reps 15 \
    --json "$OUT/sweep_rows_other.json"
  date -u
} 2>&1 | tee "$OUT/run.log"
