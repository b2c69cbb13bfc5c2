#!/usr/bin/env bash
# v10 diagnostics: sm_90a build, qmma tests, the 14336 x 4096 small-M sweep, the SASS of the
# kernel instantiations and ncu's warp-stall sampling by source line for q4_0 at M = 1.
set -uo pipefail
OUT=${OUT:-/tmp/uqr_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{
  UQR_CUDA_ARCHS=90a python3 setup.py build_ext --inplace -j 16 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  python3 -m pytest -q -x tests/test_cuda_qmma.py 2>&1 | tail -3
  UQR_QMMA_TAG=v10e PYTHONPATH=. python3 bench/qmma_sweep.py --M 1,16 --shapes 14336x4096 --json "$OUT/sweep.json"
  SO=$(ls torch_uqr/_C*.so | head -1)
  cuobjdump -sass "$SO" | gzip > "$OUT/all.sass.gz"
  timeout 150 ncu --clock-control none --kernel-name regex:"qmma" --launch-count 1 --import-source no \
    --section WarpStateStats --section SourceCounters --section InstructionStats \
    python3 - > "$OUT/ncu_src.txt" 2>&1 <<'PY'
import torch
from torch_uqr.triton_kernels.testing import random_packed
w = random_packed("q4_0", 14336, 4096, 0, seed=1, device="cuda")
torch.ops.uqr._qmma_cuda(torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16), w, "q4_0", 14336, 4096, 0, 0, False)
torch.cuda.synchronize()
PY
  grep -E "Stall|stall|Issued|Executed" "$OUT/ncu_src.txt" | head -30
} 2>&1 | tee "$OUT/run.log"
