#!/usr/bin/env bash
# v79 (session 25): the full run (sm_80 + sm_90a build, every CUDA GPU test, memcheck, the
# benchmark at --reps 20) with stream-K's 128-register kernel the default for q4_k and exl3 (v77),
# then v78's ncu of the stream-K kernel in both register builds, reusing that build. Under 10 min.
OUT=${OUT:-/tmp/uqr_out}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
timeout 450 bash bench/h200_run.sh full --reps 20
export PYTHONPATH=.
{
  for regs in 85 128; do
    echo "== ncu, UQR_STREAMK_REGS=$regs"
    UQR_STREAMK_REGS=$regs timeout 60 ncu --clock-control none --kernel-name regex:"qmma_mid_m_kernel|reduce_splits" \
      --launch-count 4 --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section Occupancy \
      --section LaunchStats \
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
      | awk '$NF+0 > 0.05 || !/stalled/' | head -90
  done
  date -u
} 2>&1 | tee "$OUT/ncu.log"
