#!/usr/bin/env bash
# v11 final check on the H200: build, the qmma GPU tests, and the small-/mid-M timings of mlx4,
# q4_0, q4_k on 14336 x 4096 (is mlx4 at M = 1 back to v10 with the small-M loop written out?).
source bench/h200_lib.sh
h200_header
h200_build || exit 1
timeout 90 python3 -m pytest -q -x -n 8 tests/test_cuda_qmma.py 2>&1 | tail -2
PYTHONPATH=. timeout 60 python3 bench/qmma_sweep.py --M 1,16,32,64 --shapes 14336x4096 --formats mlx4,q4_0,q4_k --reps 20 --json "$OUT/final.json"
date -u
