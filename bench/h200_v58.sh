#!/usr/bin/env bash
# v58 on the lent H200: the int8 kernel's launch pads its dynamic shared memory so that no SM can
# hold more CTAs than ceil(grid / SMs) (ksplit::capped_smem; UQR_KSPLIT_CAP=0: off). v57: var_affine
# int8 took 18.9 us under ncu on 4096 x 14336 but 24.6 graph-timed. sm_90a build, the int8 and
# chained-call GPU tests, then the one-row probe (int8 kernel only, cuBLAS once) off / on / off / on.
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_int8.py tests/test_cuda_pdl.py
  for round in 1 2; do
    for cap in 0 1; do
      echo "== round $round, UQR_KSPLIT_CAP=$cap"
      extra=""; [ "$round$cap" = "10" ] && extra="--cublas"
      UQR_KSPLIT_CAP=$cap timeout 150 python3 bench/int8_probe.py --M 1 --reps 20 --no-exact $extra \
        --formats q4_0,q4_k,mlx4,ternary,var_affine,exl3 --json "$OUT/probe_r${round}_cap$cap.json"
    done
  done
  date -u
} 2>&1 | tee "$OUT/run.log"
