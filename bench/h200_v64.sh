#!/usr/bin/env bash
# v64 on the lent H200: the 9-16-row split-K mid-M kernel's (CTAs an SM, ring stages) pairs 32 / 23
# / 22 at 16 rows, and ncu of pair 32 (q4_0 and q4_k, 16 rows, 14336 x 4096).
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_qmma.py
  for cfg in 32 23 22; do
    echo "== split K, config $cfg"
    UQR_QMMA_TAG=cfg$cfg UQR_SPLIT16_CFG=$cfg timeout 60 python3 bench/qmma_sweep.py --M 16 --formats q4_0,q4_k,mlx4 \
      --shapes 14336x4096,4096x14336 --reps 20 --json "$OUT/cfg$cfg.json"
  done
  timeout 150 ncu --clock-control none --kernel-name regex:"qmma_mid_m_kernel|reduce_splits" --launch-count 4 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
    --section Occupancy --section LaunchStats \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio,dram__bytes_read.sum,smsp__inst_executed.sum \
    python3 - > "$OUT/ncu_split16.txt" 2>&1 <<'PY'
import torch
from torch_uqr.triton_kernels.testing import random_packed
for fmt in ("q4_0", "q4_k"):
    w = random_packed(fmt, 14336, 4096, 0, seed=1, device="cuda")
    torch.ops.uqr._qmma_cuda(torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16), w, fmt, 14336, 4096, 0, 0, False)
torch.cuda.synchronize()
PY
  grep -v "^==PROF==" "$OUT/ncu_split16.txt" | grep -E "qmma_mid|reduce_splits|Duration|Throughput|Issue|Eligible|Executed Ipc|Warp Cycles|stalled|dram__bytes|inst_executed|Achieved Occ|Registers|Waves" \
    | awk '$NF+0 > 0.05 || !/stalled/' | head -120
  date -u
} 2>&1 | tee "$OUT/run.log"
