#!/usr/bin/env bash
# v54 on the lent H200: the decode-to-dense kernel with 2 (committed), 4 or 8 chunks of 8 elements
# per thread (UQR_DEQUANT_CPT; tiles of 2048 / 4096 / 8192 elements a CTA): predicted, fewer and
# longer CTAs with more independent stores per thread move the decode from ~64 % of DRAM peak
# toward the copy rate, which the 2048-row scratch path (decode + cuBLAS) needs for 0.9x cuBLAS.
# Build, the dequant / scratch tests under each setting, then bench/dequant_probe.py per setting.
# (Ran on an A/B build with the switch; the commit keeps 4 chunks and no switch: NOTES v54.)
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
{
  h200_header
  h200_build || exit 1
  for cpt in 2 4 8; do
    echo "== UQR_DEQUANT_CPT=$cpt tests"; UQR_DEQUANT_CPT=$cpt h200_tests tests/test_cuda_dequant.py tests/test_cuda_scratch_pipeline.py
  done
  for rnd in 1 2; do
    for cpt in 2 4 8; do
      UQR_DEQUANT_CPT=$cpt timeout 100 python3 bench/dequant_probe.py --reps 20
    done
  done
  date -u
} 2>&1 | tee "$OUT/run.log"
