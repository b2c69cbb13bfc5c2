#!/usr/bin/env bash
# v39 on the lent H200: the full run of this version (both architectures built, every CUDA test
# including the chained-call tests of the programmatic dependent launch, the error probe,
# compute-sanitizer, the benchmark with --reps 20 and its int8 rows), then ncu of the int8 kernel's
# main pass at one row (q4_0, q4_k on 14336 x 4096) into $OUT/ncu_int8.txt.
cd "$(dirname "$0")/.."
bash bench/h200_run.sh full --reps 20
source bench/h200_lib.sh
{ echo "== ncu, int8 main kernel, one row"; h200_ncu_int8 ncu_int8.txt; date -u; } 2>&1 | tee "$OUT/ncu_int8.log"
