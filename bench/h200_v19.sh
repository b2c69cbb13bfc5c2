#!/usr/bin/env bash
# v19 on the lent H200: the benchmark again with the wgmma kernel among the timed kernels (the v18 full
# run's bench left it out, so its table showed the scratch path at M = 128), after the build; 20 repetitions instead of 30 to fit the device time left.
source "$(dirname "$0")/h200_lib.sh"
{
  h200_header
  h200_build || exit 1
  python3 -m torch_uqr.bench_cuda --reps 20 --json "$OUT/h200.json" --plot "$OUT/h200.png" --table "$OUT/table.md"
  echo "bench exit $?"
  date -u
} 2>&1 | tee "$OUT/run.log"
