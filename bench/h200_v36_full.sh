#!/usr/bin/env bash
# v36 on the lent H200: the full run of this version (both architectures built, every CUDA test,
# the error probe, compute-sanitizer including the int8 kernel, the benchmark with --reps 20 and its
# int8 rows), then the int8 kernel's one-row x staged (UQR_INT8_XRING=1) or global (0) at
# N x K = 14336 x 4096 and 4096 x 14336, into $OUT/xring.log.
cd "$(dirname "$0")/.."
bash bench/h200_run.sh full --reps 20
{
  for ring in 1 0; do
    echo "-- UQR_INT8_XRING=$ring"
    UQR_INT8_XRING=$ring PYTHONPATH=. timeout 60 python3 bench/int8_probe.py --M 1 --shapes 14336x4096,4096x14336 \
      --reps 20 --json "$OUT/int8_xring$ring.json"
  done
  date -u
} 2>&1 | tee "$OUT/xring.log"
