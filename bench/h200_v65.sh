#!/usr/bin/env bash
# v65 on the lent H200: the split-K mid-M kernel at 9-16 rows with the reduction fused (a tile's last
# CTA adds the partials; no second kernel): pairs (CTAs an SM, stages) 42 / 32 / 22, and ncu of 42.
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_qmma.py tests/test_cuda_wgmma.py
  for cfg in 42 32 22; do
    echo "== split K, config $cfg"
    F=q4_0,q4_k,mlx4,q4_1,ternary; [ $cfg = 42 ] && F=$F,exl3,var_affine
    UQR_QMMA_TAG=cfg$cfg UQR_SPLIT16_CFG=$cfg timeout 110 python3 bench/qmma_sweep.py --M 9,16 --formats $F \
      --reps 20 --json "$OUT/cfg$cfg.json"
  done
  UQR_SPLIT16_CFG=42 timeout 120 ncu --clock-control none --kernel-name regex:"qmma_mid_m_kernel" --launch-count 2 \
    --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section Occupancy \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio,smsp__inst_executed.sum \
    python3 - > "$OUT/ncu_split16.txt" 2>&1 <<'PY'
import torch
from torch_uqr.triton_kernels.testing import random_packed
for fmt in ("q4_0", "q4_k"):
    w = random_packed(fmt, 14336, 4096, 0, seed=1, device="cuda")
    torch.ops.uqr._qmma_cuda(torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16), w, fmt, 14336, 4096, 0, 0, False)
torch.cuda.synchronize()
PY
  grep -v "^==PROF==" "$OUT/ncu_split16.txt" | grep -E "qmma_mid|Duration|Issued Warp|Eligible Warps|Warp Cycles Per Issued|stalled|inst_executed|Achieved Occ|Registers" \
    | awk '$NF+0 > 0.2 || !/stalled/' | head -60
  date -u
} 2>&1 | tee "$OUT/run.log"
