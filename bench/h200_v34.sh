#!/usr/bin/env bash
# v34 on the lent H200: the int8 kernel as v31 (global-memory x, no register caps; one column tile
# unrolls the whole q4_0 stage) with the pre-pass overlap of v32 (v33's caps of 72-80 registers
# measured slower). Tests: int8, small-M, dispatch rules; then int8 vs exact at 1 / 8 / 16
# rows on the three shapes, and the pre-pass overlap A/B at one row.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  t0=$(date +%s)
  python3 -m pytest -q -n 8 tests/test_cuda_int8.py tests/test_cuda_qmma.py tests/test_cuda_dispatch_rules.py \
    tests/test_gemm_cpu_int8.py 2>&1 | tail -4
  echo "tests took $(( $(date +%s) - t0 )) s"
  PYTHONPATH=. timeout 200 python3 bench/int8_probe.py --M 1,8,16 --reps 20 --json "$OUT/int8_probe.json"
  echo "-- without the programmatic dependent launch"
  UQR_INT8_PDL=0 PYTHONPATH=. timeout 60 python3 bench/int8_probe.py --M 1 --shapes 14336x4096,4096x14336 --reps 20 \
    --json "$OUT/int8_probe_nopdl.json"
  date -u
} 2>&1 | tee "$OUT/run.log"
