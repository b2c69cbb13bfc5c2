#!/usr/bin/env bash
# v59 on the lent H200: the full run of this session's code (path int8 for var_affine and exl3;
# the small-M kernels' shared-memory cap, ksplit::capped_smem): build for sm_80 + sm_90a, every CUDA
# GPU test, the error-path probe, compute-sanitizer memcheck (new int8 formats included), then the
# benchmark (all formats, shapes and M).
cd "$(dirname "$0")/.."
bash bench/h200_run.sh full --reps 20
