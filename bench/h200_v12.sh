#!/usr/bin/env bash
# v12 on the lent H200: var_affine and exl3 in the tensor-core kernels (qmma_traits.cuh). Build
# (sm_90a), the qmma GPU tests, then both formats at M = 1 (beside the Triton gemv that auto used
# before), 16-128 (beside the Triton fused kernel and the scratch path) and cuBLAS; q4_k M = 1, 16
# as the unchanged control. NCU=1 adds ncu of the small-M kernel at M = 1.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  t0=$(date +%s)
  timeout 240 python3 -m pytest -q -x -n 8 tests/test_cuda_qmma.py 2>&1 | tail -4
  echo "tests took $(( $(date +%s) - t0 )) s"
  sweep() { PYTHONPATH=. timeout "$1" python3 bench/qmma_sweep.py "${@:2}"; }
  echo "== M = 1: qmma vs Triton gemv"
  UQR_QMMA_TAG=v12 sweep 90 --M 1 --shapes 14336x4096,4096x4096 --formats var_affine,exl3,q4_k --cublas \
    --peers gemv --reps 20 --json "$OUT/sweep_m1.json"
  echo "== M = 16-128: qmma (small-M to 16, mid-M above) vs Triton fused, scratch"
  UQR_QMMA_TAG=v12 sweep 200 --M 16,32,64,128 --shapes 14336x4096,4096x4096 --formats var_affine,exl3 --cublas \
    --peers fused,scratch --reps 20 --json "$OUT/sweep_mid.json"
  if [ -n "${NCU:-}" ]; then
    timeout 100 ncu --clock-control none --kernel-name regex:"qmma_small" --launch-count 3 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
      --section InstructionStats --section MemoryWorkloadAnalysis \
      python3 - > "$OUT/ncu_v12_small.txt" 2>&1 <<'PY'
import torch
from torch_uqr.triton_kernels.testing import random_packed
for fmt in ("var_affine", "exl3", "q4_k"):
    w = random_packed(fmt, 14336, 4096, 0, seed=1, device="cuda")
    torch.ops.uqr._qmma_cuda(torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16), w, fmt, 14336, 4096, 0, 0, False)
torch.cuda.synchronize()
PY
    grep -E "qmma_small_m_kernel|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|No Eligible|Issued Warp|Executed Ipc|Executed Instructions  " "$OUT/ncu_v12_small.txt" | head -40
  fi
  date -u
} 2>&1 | tee "$OUT/run.log"
