#!/usr/bin/env bash
# v38 on the lent H200: where the kernels let the next call launch (UQR_PDL_TRIGGER start / end /
# exit) and an L2 prefetch of only the first 2 stages (UQR_L2_PREFETCH=2), against no dependent
# launch, in one build (v37: the trigger at the start lost at one row on 4096 x 14336, and
# prefetching the whole share into the L2 lost everywhere). Build, the chained-call and small-M /
# int8 / wgmma GPU tests, then the exact kernel at 1 and 16 rows, int8 at one row, wgmma at 128 rows
# per configuration; the baseline is timed first and last.
# Note: UQR_PDL_TRIGGER and UQR_L2_PREFETCH existed only in the uncommitted tree this measured; the variants that lost
# were removed before commit 2e8f085, so rerunning this now times UQR_PDL alone.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  h200_tests tests/test_cuda_pdl.py tests/test_cuda_qmma.py tests/test_cuda_int8.py tests/test_cuda_wgmma.py
  for cfg in "0 end 0" "1 start 0" "1 end 0" "1 exit 0" "1 end 2" "1 exit 2" "0 end 2" "0 end 0"; do
    set -- $cfg
    tag="pdl$1_$2_l2$3"
    echo "== UQR_PDL=$1 UQR_PDL_TRIGGER=$2 UQR_L2_PREFETCH=$3"
    export UQR_PDL=$1 UQR_PDL_TRIGGER=$2 UQR_L2_PREFETCH=$3
    UQR_QMMA_TAG=$tag PYTHONPATH=. timeout 150 python3 bench/qmma_sweep.py --M 1,16 \
      --formats q4_0,q4_k,mlx4,ternary --shapes 14336x4096,4096x14336 --reps 20
    PYTHONPATH=. timeout 60 python3 bench/int8_probe.py --M 1 --shapes 14336x4096,4096x14336 --reps 20 | grep int8
    PYTHONPATH=. timeout 60 python3 bench/qmma_sweep.py --M 128 --no-qmma --peers wgmma --formats q4_0,q4_k \
      --shapes 14336x4096 --reps 20
  done
  date -u
} 2>&1 | tee "$OUT/run.log"
