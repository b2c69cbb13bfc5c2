#!/usr/bin/env bash
# One call on the lent H200: build the extension, run the CUDA correctness tests, compute-sanitizer
# once on a small case, then the benchmark. Everything lands under $OUT (at most 8 files come back).
#   bash bench/h200_run.sh [quick|full|checks] [--sweep] [extra bench args...]   (env: SKIP_CHECKS, NCU)
set -uo pipefail
MODE=${1:-full}; shift || true
OUT=${OUT:-/tmp/uqr_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
LOG="$OUT/run.log"
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  if [ -z "${SKIP_CHECKS:-}" ]; then
  echo "== build"
  t0=$(date +%s)
  # pip install -e re-enters pip with build isolation (no registry there): build in place instead.
  python3 setup.py build_ext --inplace -j 16 > "$OUT/build.log" 2>&1 \
    && echo "build ok ($(( $(date +%s) - t0 )) s)" || { echo "BUILD FAILED (tests of the registered op will skip)"; tail -20 "$OUT/build.log"; }
  echo "== CUDA correctness tests"
  t0=$(date +%s)
  python3 -m pytest -q -n 8 tests/test_triton_cuda.py tests/test_cuda_qmma.py tests/test_cuda_dequant.py \
    tests/test_cuda_scratch_pipeline.py tests/test_cuda_wgmma.py tests/test_cuda_int8.py tests/test_cuda_pdl.py 2>&1 | tail -25
  echo "tests took $(( $(date +%s) - t0 )) s"
  echo "== argument errors raise (one process each; they segfaulted here before uqr/check.h)"
  PYTHONPATH=. timeout 120 python3 bench/error_path_probe.py
  echo "== compute-sanitizer (memcheck, small case: split-K, heads, vec)"
  timeout 240 compute-sanitizer --tool memcheck --print-limit 20 python3 - <<'PY' 2>&1 | tail -8
import torch
from torch_uqr.triton_kernels.dispatch import gemm_triton
from torch_uqr.triton_kernels.testing import random_packed
for fmt in ("q4_0", "var_affine", "ternary"):
    w = random_packed(fmt, 72, 512, 0, seed=1, device="cuda")
    x = torch.randn(2, 4, 37, 128, device="cuda", dtype=torch.bfloat16)
    gemm_triton(x, w, fmt, 72, 512, 0, out_heads=3, in_heads=True)
    gemm_triton(torch.randn(512, device="cuda"), w, fmt, 72, 512)
    if fmt == "ternary":
        gemm_triton(x, w, fmt, 72, 512, 0, out_heads=3, in_heads=True, path="vec")
for fmt, g in (("q4_0", 0), ("q4_k", 0), ("mlx4", 128), ("q8_0", 0), ("var_affine", 0), ("exl3", 0)):  # tensor-core kernels
    w = random_packed(fmt, 37, 1024, g, seed=2, device="cuda")
    for rows in (1, 9, 16):
        gemm_triton(torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16), w, fmt, 37, 1024, g, kernel="qmma")
    gemm_triton(torch.randn(2, 2, 4, 512, device="cuda", dtype=torch.float16), w, fmt, 37, 1024, g,
                out_heads=1, in_heads=True, kernel="qmma")
    for rows in (12, 17, 70):  # mid-M kernel: split K (12 rows), partial column tiles, rows past N
        gemm_triton(torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16), w, fmt, 37, 1024, g, kernel="qmma")
for fmt, g in (("q4_k", 0), ("mlx4", 128), ("var_affine", 0)):  # 9-16 rows: K split 8 / 4 ways, heads
    w = random_packed(fmt, 300, 4096, g, seed=8, device="cuda")
    gemm_triton(torch.randn(11, 4096, device="cuda", dtype=torch.bfloat16), w, fmt, 300, 4096, g, kernel="qmma")
    gemm_triton(torch.randn(2, 2, 8, 2048, device="cuda", dtype=torch.float16), w, fmt, 300, 4096, g,
                out_heads=3, in_heads=True, kernel="qmma")
for fmt, g in (("q4_0", 0), ("mlx4", 64)):  # 9-16 rows, stream-K over 71 row tiles (ranges cross tiles)
    w = random_packed(fmt, 9000, 4096, g, seed=9, device="cuda")
    gemm_triton(torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16), w, fmt, 9000, 4096, g, kernel="qmma")
for fmt, g in (("q4_0", 0), ("mlx4", 128), ("exl3", 0)):  # Hopper wgmma kernel: split K, heads, partial tiles
    w = random_packed(fmt, 37, 2048, g, seed=5, device="cuda")
    for rows in (17, 70, 130):
        gemm_triton(torch.randn(rows, 2048, device="cuda", dtype=torch.bfloat16), w, fmt, 37, 2048, g, kernel="wgmma")
    gemm_triton(torch.randn(2, 2, 40, 1024, device="cuda", dtype=torch.float16), w, fmt, 37, 2048, g,
                out_heads=1, in_heads=True, kernel="wgmma")
for fmt in ("q4_0", "q4_k"):  # int8 kernel: pre-pass + dependent launch, 1 / 2 column tiles, heads
    w = random_packed(fmt, 37, 1024, 0, seed=6, device="cuda")
    for rows in (1, 5, 16):
        gemm_triton(torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16), w, fmt, 37, 1024, kernel="int8")
    gemm_triton(torch.randn(2, 2, 4, 512, device="cuda", dtype=torch.float16), w, fmt, 37, 1024,
                out_heads=1, in_heads=True, kernel="int8")
for fmt, g in (("mlx4", 32), ("mlx4", 64), ("ternary", 0), ("var_affine", 0), ("exl3", 0)):  # int8: one row, block columns
    w = random_packed(fmt, 37, 1024, g, seed=7, device="cuda")
    gemm_triton(torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16), w, fmt, 37, 1024, g, kernel="int8")
    gemm_triton(torch.randn(1, 2, 1, 512, device="cuda", dtype=torch.float16), w, fmt, 37, 1024, g,
                out_heads=1, in_heads=True, kernel="int8")
from torch_uqr.triton_kernels.dequant import dequantize_cuda
for fmt, g in (("q4_0", 0), ("mlx4", 64), ("var_affine", 0), ("exl3", 0), ("ternary", 0)):  # decode-to-dense
    for dt in (torch.bfloat16, torch.float32):
        dequantize_cuda(random_packed(fmt, 37, 1024, g, seed=3, device="cuda"), fmt, 37, 1024, g, dtype=dt)
from torch_uqr.triton_kernels.scratch_pipeline import scratch_pipelined  # two streams, a ring of 2
w = random_packed("q4_k", 1000, 1024, 0, seed=4, device="cuda")
scratch_pipelined(torch.randn(33, 1024, device="cuda", dtype=torch.bfloat16), w, "q4_k", 1000, 1024, 0,
                  torch.empty(33, 1000, device="cuda", dtype=torch.bfloat16), dequantize_cuda, 4, 2)
scratch_pipelined(torch.randn(33, 1024, device="cuda", dtype=torch.bfloat16), w, "q4_k", 1000, 1024, 0,  # 35 % first
                  torch.empty(33, 1000, device="cuda", dtype=torch.bfloat16), dequantize_cuda, 2, 2, 0.35)
torch.cuda.synchronize(); print("sanitizer case ran")
PY
  fi
  if [ -n "${NCU:-}" ]; then
  echo "== ncu (q4_0 14336x4096: gemv M=1, fused M=16, dequant) -> ncu.txt"
  timeout 300 ncu --clock-control none --target-processes all --kernel-name regex:"_gemv_kernel|_gemm_kernel|_dequant_kernel" \
    --launch-count 3 --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    python3 - > "$OUT/ncu.txt" 2>&1 <<'PY'
import torch
from torch_uqr.triton_kernels.dispatch import gemm_triton
from torch_uqr.triton_kernels.dequant import dequantize_triton
from torch_uqr.triton_kernels.testing import random_packed
w = random_packed("q4_0", 14336, 4096, 0, seed=1, device="cuda")
gemm_triton(torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16), w, "q4_0", 14336, 4096, kernel="gemv")
gemm_triton(torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16), w, "q4_0", 14336, 4096, kernel="fused")
dequantize_triton(w, "q4_0", 14336, 4096, 0, torch.bfloat16)
torch.cuda.synchronize()
PY
  grep -E "^  [a-z_]+kernel|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit" "$OUT/ncu.txt" | head -60
  fi
  if [ "$MODE" = checks ]; then date -u; exit 0; fi
  echo "== benchmark ($MODE $*)"
  BARGS=(--json "$OUT/h200.json" --plot "$OUT/h200.png" --table "$OUT/table.md")
  [ "$MODE" = quick ] && BARGS+=(--quick)
  python3 -m torch_uqr.bench_cuda "${BARGS[@]}" "$@"
  echo "bench exit $?"
  date -u
} 2>&1 | tee "$LOG"
