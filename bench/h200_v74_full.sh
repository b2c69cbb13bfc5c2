#!/usr/bin/env bash
# v74 on the lent H200: the full run of this session's final code (9-16 rows on the split-K mid-M
# kernel with the reduce kernel): build for sm_80 + sm_90a, every CUDA GPU test, the error-path
# probe, compute-sanitizer memcheck, then the benchmark (all formats, shapes and M).
cd "$(dirname "$0")/.."
bash bench/h200_run.sh full --reps 20
