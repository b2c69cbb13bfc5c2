#!/usr/bin/env bash
# v60 on the lent H200: the shared-memory cap only where the grid needs at most 2 CTAs a SM (v59's
# full run: 16 rows on 14336 x 4096 slower with the cap at 7 a SM, mlx4 29.6 us vs 27.2 in v53).
# sm_90a build, the int8 / chained-call / small-M GPU tests, then exact and int8 at 1 and 16 rows on
# the two large shapes, cap off and on (default), same build.
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_int8.py tests/test_cuda_pdl.py tests/test_cuda_qmma.py
  for cap in 0 1; do
    echo "== UQR_KSPLIT_CAP=$cap"
    UQR_KSPLIT_CAP=$cap timeout 150 python3 bench/int8_probe.py --M 1,16 --reps 20 \
      --shapes 14336x4096,4096x14336 --formats q4_0,q4_k,mlx4,var_affine,exl3 --json "$OUT/probe_cap$cap.json"
  done
  date -u
} 2>&1 | tee "$OUT/run.log"
