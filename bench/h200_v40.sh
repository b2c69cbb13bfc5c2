#!/usr/bin/env bash
# v40 on the lent H200: the int8 kernel at one row with global x keeps the next stage's x in
# registers (XPipe; v39 ncu: long-scoreboard waits on the x loads were 6.5-7.7 of 18-19 stall cycles
# an instruction). Build, int8 and chained-call GPU tests with and without it (UQR_INT8_XPIPE=0),
# then one row A/B'd twice in one build on 14336 x 4096, and on the N = 4096 shapes with x forced
# global (UQR_INT8_XRING=0, pipe on) against the staged x they use now.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_int8.py tests/test_cuda_pdl.py
  UQR_INT8_XPIPE=0 h200_tests tests/test_cuda_int8.py
  for rep in 1 2; do
    for pipe in 1 0; do
      echo "== UQR_INT8_XPIPE=$pipe (round $rep)"
      UQR_INT8_XPIPE=$pipe PYTHONPATH=. timeout 60 python3 bench/int8_probe.py --M 1 --shapes 14336x4096 --reps 20
    done
  done
  echo "== N = 4096 shapes: staged x (default) vs global x with the pipe (UQR_INT8_XRING=0)"
  PYTHONPATH=. timeout 60 python3 bench/int8_probe.py --M 1 --shapes 4096x14336,4096x4096 --reps 20 | grep int8
  UQR_INT8_XRING=0 PYTHONPATH=. timeout 60 python3 bench/int8_probe.py --M 1 --shapes 4096x14336,4096x4096 --reps 20 | grep int8
  date -u
} 2>&1 | tee "$OUT/run.log"
