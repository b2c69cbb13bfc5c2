#!/usr/bin/env bash
# v47 on the lent H200: "eager" rings in the small-M and int8 kernels (every slot filled before the
# loop, each refilled right after it is read: 3 stages in flight from the start instead of 2; v45
# ncu had long-scoreboard waits, the cp.async DEPBAR among them, first). GPU tests with it on and
# off (UQR_EAGER_RING=0), then A/B twice in one build: the int8 probe (exact and int8, 1 and 16
# rows, three shapes) and the benchmark's small-M cells for five formats. (Measured no gain, so the
# UQR_EAGER_RING switch and the eager rings were never committed; the bench lines failed on their
# arguments: the CUDA benchmark takes neither --device after "bench --device cuda" nor --no-baseline.)
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_int8.py tests/test_cuda_pdl.py tests/test_cuda_qmma.py
  UQR_EAGER_RING=0 h200_tests tests/test_cuda_int8.py tests/test_cuda_qmma.py
  for rep in 1 2; do
    for e in 1 0; do
      echo "== UQR_EAGER_RING=$e (round $rep)"
      UQR_EAGER_RING=$e PYTHONPATH=. timeout 150 python3 bench/int8_probe.py --M 1,16 --reps 20 | awk '{print $1,$2,$3,$4,$5,$6}'
    done
  done
  for e in 1 0; do
    echo "== bench small M, UQR_EAGER_RING=$e"
    UQR_EAGER_RING=$e timeout 200 python3 -m torch_uqr bench --device cuda --formats q8_0,ternary,var_affine,exl3,q4_1 \
      --M 1,16 --shapes 14336x4096 --reps 20 --no-baseline 2>&1 | grep -v "bench:" | tail -16
  done
  date -u
} 2>&1 | tee "$OUT/run.log"
