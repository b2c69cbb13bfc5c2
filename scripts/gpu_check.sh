#!/usr/bin/env bash
# Check torch-uqr on a CUDA machine in one go: build the extension in place, run the CUDA tests,
# check that argument errors raise, run compute-sanitizer (memcheck) over a small case of every
# CUDA kernel and over the block fuzzer, then the CUDA benchmark. Everything lands under $OUT (default /tmp/uqr_out):
#   run.log (this script's output), build.log, gpu.json, gpu.png, table.md.
#
#   bash scripts/gpu_check.sh [full|quick|checks] [extra benchmark arguments...]
#     full    (default) every check, then the benchmark on all shapes (docs/perf/cuda-h200.md was
#             made by `bash scripts/gpu_check.sh full --reps 20`)
#     quick   every check, then a short benchmark (one shape, M in {1, 16, 512, 4096})
#     checks  the checks only
# Needs a CUDA build of torch, nvcc and compute-sanitizer on PATH; pytest-xdist is used if present.
set -uo pipefail
MODE=${1:-full}; shift || true
case "$MODE" in full|quick|checks) ;; *) echo "usage: $0 [full|quick|checks] [bench args...]" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/uqr_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.:tests${PYTHONPATH:+:$PYTHONPATH}
LOG="$OUT/run.log"
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  echo "== build"
  t0=$(date +%s)
  # Built in place: `pip install -e` would re-enter pip with build isolation.
  python3 setup.py build_ext --inplace -j "$(nproc)" > "$OUT/build.log" 2>&1 \
    && echo "build ok ($(( $(date +%s) - t0 )) s)" || { echo "BUILD FAILED (tests of the registered op will skip)"; tail -20 "$OUT/build.log"; }
  echo "== CUDA correctness tests"
  t0=$(date +%s)
  XDIST=(); python3 -c 'import xdist' 2>/dev/null && XDIST=(-n 8)
  python3 -m pytest -q "${XDIST[@]}" tests/test_triton_cuda.py tests/test_cuda_*.py 2>&1 | tail -25
  # NaN/Inf propagation and fuzzed blocks on the CUDA kernels (the CPU halves run in CI).
  python3 -m pytest -q "${XDIST[@]}" tests/test_nan_inf.py tests/test_fuzz_blocks.py -k cuda 2>&1 | tail -5
  echo "tests took $(( $(date +%s) - t0 )) s"
  echo "== argument errors raise (one process each)"
  timeout 120 python3 - <<'PY'
import subprocess, sys
CASES = {
    "dequant_cuda, integer in message": "torch.ops.uqr._dequant_cuda(w, 'mlx4', N, K, 48, out)",
    "dequant_cuda, string in message": "torch.ops.uqr._dequant_cuda(w, 'q9_9', N, K, 0, out)",
    "gemm on CPU, K=500": "torch.ops.uqr.gemm(x.cpu(), w.cpu(), 'q4_0', N, 500, 0, 0, False, 'auto')",
    "gemm on CUDA, K=500": "torch.ops.uqr.gemm(x, w, 'q4_0', N, 500, 0, 0, False, 'auto')",
}
PRELUDE = '''
import torch, torch_uqr
from packed_reference import random_packed
N, K = 8, 512
w = random_packed("q4_0", N, K, 0, seed=1, device="cuda")
x = torch.randn(2, K, device="cuda", dtype=torch.bfloat16)
out = torch.empty(N, K, dtype=torch.bfloat16, device="cuda")
try:
    {stmt}; print("NO ERROR")
except Exception as e:
    print(type(e).__name__, str(e).splitlines()[0][:110])
'''
for name, stmt in CASES.items():
    r = subprocess.run([sys.executable, "-c", PRELUDE.format(stmt=stmt)], capture_output=True, text=True)
    print(f"{name:36s} rc {r.returncode:4d} {r.stdout.strip()[-130:]} {r.stderr.strip()[-200:] if r.returncode else ''}",
          flush=True)
PY
  echo "== compute-sanitizer (memcheck, small cases of every kernel)"
  timeout 240 compute-sanitizer --tool memcheck --print-limit 20 python3 - <<'PY' 2>&1 | tail -8
import torch
from torch_uqr.backends.cuda.dispatch import gemm_cuda_route
from packed_reference import random_packed
for fmt in ("q4_0", "var_affine", "ternary"):  # Triton: split-K, heads, vec
    w = random_packed(fmt, 72, 512, 0, seed=1, device="cuda")
    x = torch.randn(2, 4, 37, 128, device="cuda", dtype=torch.bfloat16)
    gemm_cuda_route(x, w, fmt, 72, 512, 0, out_heads=3, in_heads=True)
    gemm_cuda_route(torch.randn(512, device="cuda"), w, fmt, 72, 512)
    if fmt == "ternary":
        gemm_cuda_route(x, w, fmt, 72, 512, 0, out_heads=3, in_heads=True, path="vec")
for fmt, g in (("q4_0", 0), ("q4_k", 0), ("mlx4", 128), ("q8_0", 0), ("var_affine", 0), ("exl3", 0)):  # tensor-core kernels
    w = random_packed(fmt, 37, 1024, g, seed=2, device="cuda")
    for rows in (1, 9, 16):
        gemm_cuda_route(torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16), w, fmt, 37, 1024, g, kernel="qmma")
    gemm_cuda_route(torch.randn(2, 2, 4, 512, device="cuda", dtype=torch.float16), w, fmt, 37, 1024, g,
                out_heads=1, in_heads=True, kernel="qmma")
    for rows in (12, 17, 70):  # mid-M kernel: split K (12 rows), partial column tiles, rows past N
        gemm_cuda_route(torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16), w, fmt, 37, 1024, g, kernel="qmma")
for fmt, g in (("q4_k", 0), ("mlx4", 128), ("var_affine", 0)):  # 9-16 rows: K split 8 / 4 ways, heads
    w = random_packed(fmt, 300, 4096, g, seed=8, device="cuda")
    gemm_cuda_route(torch.randn(11, 4096, device="cuda", dtype=torch.bfloat16), w, fmt, 300, 4096, g, kernel="qmma")
    gemm_cuda_route(torch.randn(2, 2, 8, 2048, device="cuda", dtype=torch.float16), w, fmt, 300, 4096, g,
                out_heads=3, in_heads=True, kernel="qmma")
for fmt, g in (("q4_0", 0), ("mlx4", 64)):  # 9-16 rows, stream-K over 71 row tiles (ranges cross tiles)
    w = random_packed(fmt, 9000, 4096, g, seed=9, device="cuda")
    gemm_cuda_route(torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16), w, fmt, 9000, 4096, g, kernel="qmma")
if torch.cuda.get_device_capability()[0] == 9:
    for fmt, g in (("q4_0", 0), ("mlx4", 128), ("exl3", 0)):  # Hopper wgmma kernel: split K, heads, partial tiles
        w = random_packed(fmt, 37, 2048, g, seed=5, device="cuda")
        for rows in (17, 70, 130):
            gemm_cuda_route(torch.randn(rows, 2048, device="cuda", dtype=torch.bfloat16), w, fmt, 37, 2048, g, kernel="wgmma")
        gemm_cuda_route(torch.randn(2, 2, 40, 1024, device="cuda", dtype=torch.float16), w, fmt, 37, 2048, g,
                    out_heads=1, in_heads=True, kernel="wgmma")
for fmt in ("q4_0", "q4_k"):  # int8 kernel: pre-pass + dependent launch, 1 / 2 column tiles, heads
    w = random_packed(fmt, 37, 1024, 0, seed=6, device="cuda")
    for rows in (1, 5, 16):
        gemm_cuda_route(torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16), w, fmt, 37, 1024, kernel="int8")
    gemm_cuda_route(torch.randn(2, 2, 4, 512, device="cuda", dtype=torch.float16), w, fmt, 37, 1024,
                out_heads=1, in_heads=True, kernel="int8")
for fmt, g in (("mlx4", 32), ("mlx4", 64), ("ternary", 0), ("var_affine", 0), ("exl3", 0)):  # int8: one row, block columns
    w = random_packed(fmt, 37, 1024, g, seed=7, device="cuda")
    gemm_cuda_route(torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16), w, fmt, 37, 1024, g, kernel="int8")
    gemm_cuda_route(torch.randn(1, 2, 1, 512, device="cuda", dtype=torch.float16), w, fmt, 37, 1024, g,
                out_heads=1, in_heads=True, kernel="int8")
from torch_uqr.backends.cuda.dequant import dequantize_cuda
for fmt, g in (("q4_0", 0), ("mlx4", 64), ("var_affine", 0), ("exl3", 0), ("ternary", 0)):  # decode-to-dense
    for dt in (torch.bfloat16, torch.float32):
        dequantize_cuda(random_packed(fmt, 37, 1024, g, seed=3, device="cuda"), fmt, 37, 1024, g, dtype=dt)
from torch_uqr.backends.cuda.scratch_pipeline import scratch_pipelined  # two streams, a ring of 2
w = random_packed("q4_k", 1000, 1024, 0, seed=4, device="cuda")
scratch_pipelined(torch.randn(33, 1024, device="cuda", dtype=torch.bfloat16), w, "q4_k", 1000, 1024, 0,
                  torch.empty(33, 1000, device="cuda", dtype=torch.bfloat16), dequantize_cuda, 4, 2)
scratch_pipelined(torch.randn(33, 1024, device="cuda", dtype=torch.bfloat16), w, "q4_k", 1000, 1024, 0,  # 35 % first
                  torch.empty(33, 1000, device="cuda", dtype=torch.bfloat16), dequantize_cuda, 2, 2, 0.35)
torch.cuda.synchronize(); print("sanitizer case ran")
PY
  echo "== compute-sanitizer (memcheck, random and mutated blocks of every format)"
  timeout 240 compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest -q -x tests/test_fuzz_blocks.py -k cuda 2>&1 \
    | grep -E "ERROR SUMMARY|passed|failed|Invalid" | head -5
  if [ "$MODE" = checks ]; then date -u; exit 0; fi
  echo "== benchmark ($MODE $*)"
  BARGS=(--json "$OUT/gpu.json" --plot "$OUT/gpu.png" --table "$OUT/table.md")
  [ "$MODE" = quick ] && BARGS+=(--quick)
  python3 -m torch_uqr.cli.bench_cuda "${BARGS[@]}" "$@"
  echo "bench exit $?"
  date -u
} 2>&1 | tee "$LOG"
