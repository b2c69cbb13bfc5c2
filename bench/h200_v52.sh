#!/usr/bin/env bash
# v52 on the lent H200: the fix for v51's failure (x and the pre-pass's codes read with ld.global.ca,
# ld_after_wait, instead of the read-only path that ptxas may schedule above griddepcontrol.wait):
# build, the CUDA GPU tests under -n 8, the stress loop under a second process's load (PDL on), one
# row int8 against exact (speed of the plain loads, against v50), and the 512-row scratch pipeline
# for q4_k / exl3 over first-slice shares and slice counts.
source "$(dirname "$0")/h200_lib.sh"
export PYTHONPATH=.
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_int8.py tests/test_cuda_pdl.py tests/test_cuda_qmma.py tests/test_cuda_dispatch_rules.py
  echo "== stress under load, UQR_PDL=1"
  python3 bench/ternary_int8_stress.py --load & lp=$!
  sleep 3; python3 bench/ternary_int8_stress.py --iters 60; kill $lp 2>/dev/null; wait $lp 2>/dev/null
  h200_int8_probe_rounds
  echo "== 512 rows, scratch pipeline configurations"
  timeout 150 python3 bench/pipeline_probe.py --shapes 14336x4096 --M 512 --formats q4_k,exl3 \
    --configs 1x1,2x2f35,2x2f30,3x2f25,3x3f25,3x2,4x2f20 --reps 20 --json "$OUT/pipeline.json" 2>&1 | tail -20
  date -u
} 2>&1 | tee "$OUT/run.log"
