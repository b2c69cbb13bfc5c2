#!/usr/bin/env bash
# v9 on the lent H200: build, the tensor-core small-M kernel's GPU tests (+ the Triton suite),
# ncu of q4_0 M = 1, then the small-M benchmark. Results under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/uqr_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{
  date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
  t0=$(date +%s)
  python3 setup.py build_ext --inplace -j 16 > "$OUT/build.log" 2>&1 \
    && echo "build ok ($(( $(date +%s) - t0 )) s)" || { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
  t0=$(date +%s)
  python3 -m pytest -q -x tests/test_cuda_qmma.py 2>&1 | tail -15
  echo "qmma tests $(( $(date +%s) - t0 )) s"
  if [ -n "${FULL_TESTS:-}" ]; then
    t0=$(date +%s)
    python3 -m pytest -q -n 8 tests/test_triton_cuda.py 2>&1 | tail -8
    echo "triton+gemv tests $(( $(date +%s) - t0 )) s"
  fi
  if [ -n "${NCU:-}" ]; then
  timeout 200 ncu --clock-control none --kernel-name regex:"qmma" --launch-count 4 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    python3 - > "$OUT/ncu.txt" 2>&1 <<'PY'
import torch
from torch_uqr.triton_kernels.testing import random_packed
for fmt in ("q4_0", "q4_k"):
    w = random_packed(fmt, 14336, 4096, 0, seed=1, device="cuda")
    for M in (1, 16):
        torch.ops.uqr._qmma_cuda(torch.randn(M, 4096, device="cuda", dtype=torch.bfloat16), w, fmt, 14336, 4096, 0, 0, False)
torch.cuda.synchronize()
PY
  grep -E "qmma_small_m_kernel|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|No Eligible|Stall" "$OUT/ncu.txt" | head -70
  fi
  python3 -m torch_uqr.bench_cuda --M "${BENCH_M:-1,16}" --shapes "${BENCH_SHAPES:-14336x4096,4096x14336,4096x4096}" \
    --formats "${BENCH_FORMATS:-q4_0,q4_k,q4_1,mlx4,q8_0,ternary}" --reps 30 --json "$OUT/v9.json" --table "$OUT/v9_table.md"
  echo "bench exit $?"; date -u
} 2>&1 | tee "$OUT/run.log"
