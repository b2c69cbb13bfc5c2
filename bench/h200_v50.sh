#!/usr/bin/env bash
# v50 on the lent H200: why test_int8_cuda_one_row_formats[ternary] failed under pytest -n 8 in v48 /
# v48c (and never alone): the int8 test file three times under -n 8 with the failure text kept,
# once sequentially, then compute-sanitizer initcheck / racecheck on the ternary int8 kernel with
# the caching allocator handing back dirty memory, then one row int8 against exact (timing).
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  for i in 1 2 3; do
    python3 -m pytest -q -n 8 tests/test_cuda_int8.py > "$OUT/n8_$i.txt" 2>&1
    tail -1 "$OUT/n8_$i.txt"; grep -E "^E  " "$OUT/n8_$i.txt" | head -12
  done
  python3 -m pytest -q -p no:xdist tests/test_cuda_int8.py > "$OUT/seq.txt" 2>&1
  tail -1 "$OUT/seq.txt"; grep -E "^E  " "$OUT/seq.txt" | head -12
  cat > /tmp/tern_case.py <<'PY'
import torch
from torch_uqr.triton_kernels.testing import random_packed
junk = torch.randint(-128, 127, (64 << 20,), dtype=torch.int8, device="cuda"); del junk  # dirty the pool
for N, K in ((200, 1536), (264, 2048)):
    w = random_packed("ternary", N, K, 0, seed=3, device="cuda")
    x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    a = torch.ops.uqr._int8_cuda(x, w, "ternary", N, K, 0, 0, False)
    b = torch.ops.uqr._int8_cuda(x, w, "ternary", N, K, 0, 0, False)
    print(N, K, "repeat equal:", torch.equal(a, b), "finite:", bool(torch.isfinite(a).all()))
torch.cuda.synchronize(); print("sanitizer case ran")
PY
  for tool in initcheck racecheck memcheck; do
    echo "== compute-sanitizer $tool"
    UQR_POISON=1 timeout 120 compute-sanitizer --tool $tool --print-limit 10 python3 /tmp/tern_case.py 2>&1 | tail -8
  done
  h200_int8_probe_rounds
  date -u
} 2>&1 | tee "$OUT/run.log"
