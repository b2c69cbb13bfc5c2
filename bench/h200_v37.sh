#!/usr/bin/env bash
# v37 on the lent H200: programmatic dependent launch for every CUDA C++ gemm kernel (each call may
# start while the previous kernel finishes, and waits for it before touching x / y) and an L2
# prefetch of each warp's weight share at the kernel's start. Build (sm_90a), the chained-call tests
# and the small-M / int8 / wgmma GPU tests, then one build's A/B of UQR_PDL (0 / 1) x
# UQR_L2_PREFETCH (0 = none / unset = whole share): exact kernel at 1 and 16 rows, int8 at one
# row, wgmma at 128 rows.
# Note: UQR_L2_PREFETCH existed only in the uncommitted tree this measured; the variants that lost
# were removed before commit 2e8f085, so rerunning this now times UQR_PDL alone.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_pdl.py tests/test_cuda_qmma.py tests/test_cuda_int8.py tests/test_cuda_wgmma.py
  for pdl in 0 1; do
    for l2 in 0 all; do
      tag="pdl${pdl}_l2${l2}"
      echo "== UQR_PDL=$pdl UQR_L2_PREFETCH=$l2"
      l2env=(); [ "$l2" = 0 ] && l2env=(UQR_L2_PREFETCH=0)
      env UQR_PDL=$pdl "${l2env[@]}" UQR_QMMA_TAG=$tag PYTHONPATH=. timeout 150 python3 bench/qmma_sweep.py --M 1,16 \
        --formats q4_0,q4_k,mlx4,ternary --shapes 14336x4096,4096x14336 --reps 20 --json "$OUT/sweep_$tag.json"
      env UQR_PDL=$pdl "${l2env[@]}" PYTHONPATH=. timeout 60 python3 bench/int8_probe.py --M 1 \
        --shapes 14336x4096,4096x14336 --reps 20 --json "$OUT/int8_$tag.json" | grep int8
      env UQR_PDL=$pdl "${l2env[@]}" PYTHONPATH=. timeout 60 python3 bench/qmma_sweep.py --M 128 --no-qmma \
        --peers wgmma --formats q4_0,q4_k --shapes 14336x4096 --reps 20 --json "$OUT/wgmma_$tag.json"
    done
  done
  date -u
} 2>&1 | tee "$OUT/run.log"
