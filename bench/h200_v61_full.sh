#!/usr/bin/env bash
# v61 on the lent H200: the full run of this session's final code (path int8 for var_affine and
# exl3; the small-M kernels' shared-memory cap where the grid needs at most 2 CTAs an SM): build for
# sm_80 + sm_90a, every CUDA GPU test, the error-path probe, compute-sanitizer memcheck, then the
# benchmark (all formats, shapes and M).
cd "$(dirname "$0")/.."
bash bench/h200_run.sh full --reps 20
