#!/usr/bin/env bash
# v69 on the lent H200: the committed 9-16-row split-K kernel (per-format U and CTAs an SM, 4-wide
# reduce): h200_run.sh's checks (build, every CUDA GPU test, error probe, memcheck with the split-K
# cases) and the benchmark at 9 and 16 rows (cuBLAS and the int4 peer in the same run).
exec bash "$(dirname "$0")/h200_run.sh" full --M 9,16 --reps 20
