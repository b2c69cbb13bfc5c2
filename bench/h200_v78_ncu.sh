#!/usr/bin/env bash
# v78 (written in session 24, not run): ncu of the stream-K mid-M kernel and its reduce at 16 rows,
# q4_0 and q4_k on 14336 x 4096, as built by default (85 registers) and for 128 (UQR_STREAMK_REGS):
# what limits it now that the SMs are evenly loaded (v68's profile predates stream-K). Speed of
# light, memory workload, scheduler, warp states and every stall reason per issued instruction.
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
{
  h200_header
  h200_build || exit 1
  for regs in 85 128; do
    echo "== ncu, UQR_STREAMK_REGS=$regs"
    UQR_STREAMK_REGS=$regs timeout 200 ncu --clock-control none --kernel-name regex:"qmma_mid_m_kernel|reduce_splits" \
      --launch-count 4 --section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats \
      --section WarpStateStats --section Occupancy --section LaunchStats \
      --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio,dram__bytes_read.sum,smsp__inst_executed.sum,sm__cycles_active.avg \
      python3 - > "$OUT/ncu_regs$regs.txt" 2>&1 <<'PY'
import torch
from torch_uqr.triton_kernels.dispatch import gemm_triton
from torch_uqr.triton_kernels.testing import random_packed
for fmt in ("q4_0", "q4_k"):
    w = random_packed(fmt, 14336, 4096, 0, seed=1, device="cuda")
    gemm_triton(torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16), w, fmt, 14336, 4096, 0, kernel="qmma")
torch.cuda.synchronize()
PY
    grep -v "^==PROF==" "$OUT/ncu_regs$regs.txt" | grep -E "qmma_mid|reduce_splits|Duration|Throughput|Issue|Eligible|Executed Ipc|Warp Cycles|stalled|dram__bytes|inst_executed|cycles_active|Achieved Occ|Registers|Waves" \
      | awk '$NF+0 > 0.05 || !/stalled/' | head -120
  done
  date -u
} 2>&1 | tee "$OUT/run.log"
