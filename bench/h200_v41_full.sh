#!/usr/bin/env bash
# v41 on the lent H200: the full run of the final version of this session (programmatic dependent
# launch, the int8 kernel's pipelined one-row x): both architectures built, every CUDA test, the
# error probe, compute-sanitizer, the benchmark with --reps 20 and its int8 rows.
cd "$(dirname "$0")/.."
bash bench/h200_run.sh full --reps 20
