#!/usr/bin/env bash
# v68 on the lent H200: the 9-16-row split-K kernel (fragment-order x) with 4 sub-blocks a loop trip
# (UQR_SPLIT16_U=4) against 2, and ncu of the default (q4_0, q4_k; 16 rows, 14336 x 4096).
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
{
  h200_header
  h200_build || exit 1
  for u in 2 4; do
    echo "== U = $u"
    UQR_QMMA_TAG=u$u UQR_SPLIT16_U=$u timeout 80 python3 bench/qmma_sweep.py --M 16 --formats q4_0,q4_k,mlx4,ternary,exl3 \
      --shapes 14336x4096,4096x14336 --reps 20 --json "$OUT/u$u.json"
  done
  timeout 120 ncu --clock-control none --kernel-name regex:"qmma_mid_m_kernel|reduce_splits" --launch-count 4 \
    --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio,smsp__inst_executed.sum \
    python3 - > "$OUT/ncu_split16.txt" 2>&1 <<'PY'
import torch
from torch_uqr.triton_kernels.testing import random_packed
for fmt in ("q4_0", "q4_k"):
    w = random_packed(fmt, 14336, 4096, 0, seed=1, device="cuda")
    torch.ops.uqr._qmma_cuda(torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16), w, fmt, 14336, 4096, 0, 0, False)
torch.cuda.synchronize()
PY
  grep -v "^==PROF==" "$OUT/ncu_split16.txt" | grep -E "qmma_mid|reduce_splits|Duration|Issued Warp|Eligible Warps|Warp Cycles Per Issued|stalled|inst_executed" \
    | awk '$NF+0 > 0.3 || !/stalled/' | cut -c1-150 | head -60
  date -u
} 2>&1 | tee "$OUT/run.log"
