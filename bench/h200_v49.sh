#!/usr/bin/env bash
# v49 on the lent H200 (the session's last ~330 s of device time): the final code's checks only -
# the sm_90a build, every CUDA GPU test, the error probe and compute-sanitizer memcheck (now with
# mlx4's one-row int8 kernel and the pipeline's smaller first slice); no benchmark (the numbers are
# v43-v46's, each A/B'd in one build).
UQR_CUDA_ARCHS=90a bash "$(dirname "$0")/h200_run.sh" checks
