#!/usr/bin/env bash
# v10 on the lent H200: sm_90a-only build, the qmma GPU tests, the small-M sweep (bench/qmma_sweep.py)
# and optionally ncu of q4_0 at M = 1 / 16. Results under $OUT.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  python3 -m pytest -q -x tests/test_cuda_qmma.py 2>&1 | tail -4
  for rows in ${SWEEP_TAGS:-v10}; do
    UQR_QMMA_TAG=$rows PYTHONPATH=. python3 bench/qmma_sweep.py --M "${BENCH_M:-1,16}" --shapes "${BENCH_SHAPES:-14336x4096,4096x14336,4096x4096}" \
      --formats "${BENCH_FORMATS:-q4_0,q4_k,q4_1,mlx4,ternary,q8_0}" ${CUBLAS:+--cublas} --json "$OUT/sweep_$rows.json"
  done
  if [ -n "${NCU:-}" ]; then
    for rows in v10; do
    timeout 120 ncu --clock-control none --kernel-name regex:"qmma" --launch-count 2 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats \
      python3 - > "$OUT/ncu_$rows.txt" 2>&1 <<'PY'
import torch
from torch_uqr.triton_kernels.testing import random_packed
w = random_packed("q4_0", 14336, 4096, 0, seed=1, device="cuda")
for M in (1, 16):
    torch.ops.uqr._qmma_cuda(torch.randn(M, 4096, device="cuda", dtype=torch.bfloat16), w, "q4_0", 14336, 4096, 0, 0, False)
torch.cuda.synchronize()
PY
    grep -E "qmma_small_m_kernel|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|No Eligible|Executed Instructions  |Block Size|Grid Size" "$OUT/ncu_$rows.txt" | head -30
    done
  fi
  date -u
} 2>&1 | tee "$OUT/run.log"
