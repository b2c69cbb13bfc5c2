#!/usr/bin/env bash
# v51 on the lent H200: the ternary int8 failure of v48 / v50 (whole outputs wrong, only under
# pytest -n 8, only on the second call with a weight): the test file under -n 8 with the dependent
# launch off, a stress loop with and without a second process loading the GPU (PDL on / off), and
# compute-sanitizer initcheck / racecheck / memcheck on the ternary int8 kernel.
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
{
  h200_header
  h200_build || exit 1
  echo "== -n 8, UQR_PDL=0"
  UQR_PDL=0 python3 -m pytest -q -n 8 tests/test_cuda_int8.py > "$OUT/n8_nopdl.txt" 2>&1
  tail -1 "$OUT/n8_nopdl.txt"; grep -E "^E  " "$OUT/n8_nopdl.txt" | head -4
  for i in 1 2 3; do
    echo "== fresh process, ternary test alone ($i)"
    python3 -m pytest -q -p no:xdist tests/test_cuda_int8.py -k "one_row_formats and ternary" > "$OUT/alone_$i.txt" 2>&1
    tail -1 "$OUT/alone_$i.txt"; grep -E "^E  " "$OUT/alone_$i.txt" | head -2
  done
  echo "== -n 3, the three one-row tests only"
  python3 -m pytest -q -n 3 tests/test_cuda_int8.py -k "one_row_formats" 2>&1 | grep -E "passed|failed|^E  " | head -4
  echo "== stress, alone"; python3 bench/ternary_int8_stress.py --iters 40
  for pdl in 1 0; do
    echo "== stress under load, UQR_PDL=$pdl"
    python3 bench/ternary_int8_stress.py --load & lp=$!
    sleep 3; UQR_PDL=$pdl python3 bench/ternary_int8_stress.py --iters 40; kill $lp 2>/dev/null; wait $lp 2>/dev/null
  done
  cat > /tmp/tern_case.py <<'PY'
import torch
from torch_uqr.triton_kernels.testing import random_packed
junk = torch.randint(-128, 127, (64 << 20,), dtype=torch.int8, device="cuda"); del junk  # dirty the pool
for N, K in ((200, 1536), (264, 2048)):
    w = random_packed("ternary", N, K, 0, seed=3, device="cuda")
    x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    a = torch.ops.uqr._int8_cuda(x, w, "ternary", N, K, 0, 0, False)
    b = torch.ops.uqr._int8_cuda(x.view(1, 1, K), w, "ternary", N, K, 0, 0, False)
    print(N, K, "repeat equal:", torch.equal(a, b.view_as(a)), "finite:", bool(torch.isfinite(a).all()))
torch.cuda.synchronize(); print("sanitizer case ran")
PY
  for tool in initcheck racecheck memcheck; do
    echo "== compute-sanitizer $tool"
    UQR_POISON=1 timeout 100 compute-sanitizer --tool $tool --print-limit 10 python3 /tmp/tern_case.py 2>&1 | tail -8
  done
  date -u
} 2>&1 | tee "$OUT/run.log"
