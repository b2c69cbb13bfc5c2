#!/usr/bin/env bash
# Diagnostics for the tensor-core small-M kernel: SASS of q4_0 / q4_k (bf16, one column tile) and
# ncu's instruction mix + warp stalls at M = 1, 14336 x 4096. Results under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/uqr_out}; mkdir -p "$OUT"
python3 setup.py build_ext --inplace -j 16 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
SO=$(ls torch_uqr/_C*.so | head -1)
cuobjdump -sass "$SO" | gzip > "$OUT/all.sass.gz"; ls -la "$OUT/all.sass.gz"
timeout 150 ncu --clock-control none --kernel-name regex:"qmma" --launch-count 1 \
  --section InstructionStats --section WarpStateStats --section SchedulerStats --section SpeedOfLight \
  --metrics smsp__inst_executed.sum,smsp__sass_inst_executed_op_shared_ld.sum,smsp__sass_inst_executed_op_global_ld.sum,sm__cycles_elapsed.avg.per_second \
  python3 - > "$OUT/ncu2.txt" 2>&1 <<'PY'
import torch
from torch_uqr.triton_kernels.testing import random_packed
w = random_packed("q4_0", 14336, 4096, 0, seed=1, device="cuda")
torch.ops.uqr._qmma_cuda(torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16), w, "q4_0", 14336, 4096, 0, 0, False)
torch.cuda.synchronize()
PY
grep -E "inst_executed|Duration|cycles_elapsed|Stall|Issued|Executed Ipc|Warp Cycles" "$OUT/ncu2.txt" | head -30
