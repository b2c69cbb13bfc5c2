#!/usr/bin/env bash
# v11 on the lent H200: sm_90a-only build, the qmma GPU tests (small- and mid-M), the sweep of
# bench/qmma_sweep.py over M = 24..512 beside cuBLAS, the Triton fused kernel and the scratch path,
# and (NCU=1) ncu of the mid-M kernel at M = 128. Results under $OUT. The runs logged in
# bench/results/h200_v11a.log and h200_v11b.log used earlier revisions of this script and of the
# kernel, with variant knobs (ldmatrix, fp32 scales, chunked scratch, forced column tiles) that
# were removed after those measurements.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  t0=$(date +%s)
  timeout 200 python3 -m pytest -q -x -n 8 tests/test_cuda_qmma.py 2>&1 | tail -4
  echo "tests took $(( $(date +%s) - t0 )) s"
  sweep() { PYTHONPATH=. timeout "$1" python3 bench/qmma_sweep.py "${@:2}"; }
  echo "== mid-M kernel (weights scaled before the MMA, 2 CTAs/SM) vs cuBLAS, Triton fused, scratch"
  UQR_QMMA_TAG=v11 sweep 250 --M ${BENCH_M:-24,32,48,64,128,256,512} --shapes "${BENCH_SHAPES:-14336x4096,4096x4096,4096x14336}" \
    --formats "${BENCH_FORMATS:-q4_0,q4_k,mlx4,ternary,q4_1,q8_0}" --cublas --peers fused,scratch \
    --reps 20 --json "$OUT/sweep_mid.json"
  echo "== small-M regression"
  UQR_QMMA_TAG=v11 sweep 40 --M 1,16 --shapes 14336x4096 --formats q4_0,q4_k,mlx4,ternary --json "$OUT/sweep_small.json"
  if [ -n "${NCU:-}" ]; then
    timeout 100 ncu --clock-control none --kernel-name regex:"qmma_mid" --launch-count 2 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
      --section InstructionStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      python3 - > "$OUT/ncu_v11_mid.txt" 2>&1 <<'PY'
import torch
from torch_uqr.triton_kernels.testing import random_packed
for fmt in ("q4_0", "q4_k"):
    w = random_packed(fmt, 14336, 4096, 0, seed=1, device="cuda")
    torch.ops.uqr._qmma_cuda(torch.randn(128, 4096, device="cuda", dtype=torch.bfloat16), w, fmt, 14336, 4096, 0, 0, False)
torch.cuda.synchronize()
PY
    grep -E "qmma_mid_m_kernel|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|No Eligible|Issued Warp|Executed Ipc|Executed Instructions  |L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Block Size|Grid Size" "$OUT/ncu_v11_mid.txt" | head -40
  fi
  date -u
} 2>&1 | tee "$OUT/run.log"
