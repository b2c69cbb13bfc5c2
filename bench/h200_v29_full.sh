#!/usr/bin/env bash
# v29 on the lent H200: the full run (h200_run.sh full: both archs, every CUDA GPU test, the error
# probe, compute-sanitizer, the benchmark at 20 repetitions) with v28's small-M x prefetch and the
# pipelined scratch path at 448-767 rows where N >= 8192.
bash "$(dirname "$0")/h200_run.sh" full --reps 20
