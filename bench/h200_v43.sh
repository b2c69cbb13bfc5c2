#!/usr/bin/env bash
# v43 on the lent H200: (1) the int8 kernel's one-row "block column" variant (ColsX in
# qmma_int8.cu: each k-slot of a lane quad takes its own block, x only in that block's column, scales
# once per block; SASS: 41 / 83 instructions from first to last IMMA of a stage for q4_k / q4_0
# against 150 / 189) - GPU tests with it on and off (UQR_INT8_COLS=0), then one row A/B'd twice in
# one build on all three shapes; (2) the pipelined scratch path with a smaller first slice
# (scratch_pipeline.slice_bounds) at 384-768 rows on 14336 x 4096.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_int8.py tests/test_cuda_pdl.py tests/test_cuda_scratch_pipeline.py
  UQR_INT8_COLS=0 h200_tests tests/test_cuda_int8.py
  for rep in 1 2; do
    for cols in 1 0; do
      echo "== UQR_INT8_COLS=$cols (round $rep)"
      UQR_INT8_COLS=$cols PYTHONPATH=. timeout 90 python3 bench/int8_probe.py --M 1 --reps 20 | grep -v exact
    done
  done
  echo "== exact kernel, one row (reference)"
  PYTHONPATH=. timeout 60 python3 bench/int8_probe.py --M 1 --shapes 14336x4096 --reps 20 | grep exact
  echo "== pipelined scratch, first slice smaller"
  PYTHONPATH=. timeout 240 python3 bench/pipeline_probe.py --shapes 14336x4096 --M 512,768 \
    --formats q4_0,q4_k,exl3 --configs 1x1,2x2,2x2f35,2x2f25,3x2f20,3x3f20,2x2 --reps 20 --json "$OUT/pipeline.json"
  date -u
} 2>&1 | tee "$OUT/run.log"
