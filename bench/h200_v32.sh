#!/usr/bin/env bash
# v32 on the lent H200: the int8 kernel with x staged through the weight ring (shared-memory x
# operands) and launched as a programmatic dependent of its quantize pre-pass; and the wgmma
# kernel's q4_k decode with one sub-block per lane (617 -> 487 SASS instructions a stage).
# Tests: int8, small-M, wgmma, dispatch rules. Then int8 vs exact at 1 / 8 / 16 rows on the three
# shapes, the pre-pass overlap A/B at one row (UQR_INT8_PDL=0), and the wgmma kernel at 32-256 rows.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  t0=$(date +%s)
  python3 -m pytest -q -n 8 tests/test_cuda_int8.py tests/test_cuda_qmma.py tests/test_cuda_wgmma.py \
    tests/test_cuda_dispatch_rules.py tests/test_gemm_cpu_int8.py 2>&1 | tail -15
  echo "tests took $(( $(date +%s) - t0 )) s"
  PYTHONPATH=. timeout 200 python3 bench/int8_probe.py --M 1,8,16 --reps 20 --json "$OUT/int8_probe.json"
  echo "-- without the programmatic dependent launch"
  UQR_INT8_PDL=0 PYTHONPATH=. timeout 60 python3 bench/int8_probe.py --M 1 --shapes 14336x4096 --reps 20 \
    --json "$OUT/int8_probe_nopdl.json"
  UQR_QMMA_TAG=v32 PYTHONPATH=. timeout 150 python3 bench/qmma_sweep.py --M 32,64,128,256 --shapes 14336x4096 \
    --formats q4_k,q4_0 --reps 20 --no-qmma --peers wgmma --json "$OUT/wgmma_rows.json"
  UQR_QMMA_TAG=v32 PYTHONPATH=. timeout 60 python3 bench/qmma_sweep.py --M 128 --shapes 4096x14336 \
    --formats q4_k,q4_0 --reps 20 --no-qmma --peers wgmma --json "$OUT/wgmma_k14336.json"
  date -u
} 2>&1 | tee "$OUT/run.log"
