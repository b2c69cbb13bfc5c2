#!/usr/bin/env bash
# v57 on the lent H200: var_affine's int8 stage with constant-offset word loads (v56: 20.5 us on
# 14336 x 4096 but 25.3 on 4096 x 14336): sm_90a build, the int8 GPU tests, the one-row probe for
# var_affine and exl3 with cuBLAS, and ncu of var_affine's int8 kernel on both large shapes (bank
# conflicts, stalls, warps) to see why N = 4096 is slower.
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_int8.py
  echo "== probe, one row"
  timeout 200 python3 bench/int8_probe.py --M 1 --reps 20 --cublas --formats var_affine,exl3 --json "$OUT/probe.json"
  echo "== ncu"
  timeout 150 ncu --clock-control none --kernel-name regex:"qmma_int8_kernel" --launch-count 4 \
    --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section Occupancy --section LaunchStats \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio,smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum \
    python3 - > "$OUT/ncu.txt" 2>&1 <<'PY'
import torch
from torch_uqr.triton_kernels.testing import random_packed
for fmt in ("var_affine", "exl3"):
    for N, K in ((14336, 4096), (4096, 14336)):
        w = random_packed(fmt, N, K, 0, seed=1, device="cuda")
        torch.ops.uqr._int8_cuda(torch.randn(1, K, device="cuda", dtype=torch.bfloat16), w, fmt, N, K, 0, 0, False)
torch.cuda.synchronize()
PY
  grep -v "^==PROF==" "$OUT/ncu.txt" | grep -E "qmma_int8|Duration|Issued Warp|Eligible Warps|Warp Cycles Per Issued|stalled|bank_conflicts|wavefronts|inst_executed|Achieved Occ|Registers Per|Block Size|Grid Size|Dynamic Shared" \
    | awk '$NF+0 > 0.3 || !/stalled/' | head -90
  date -u
} 2>&1 | tee "$OUT/run.log"
