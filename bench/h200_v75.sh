#!/usr/bin/env bash
# v75: feasibility of hiding the scratch path's decode under cuBLAS at M = 2048 with an SM carveout
# (bench/carveout_probe.py; pure torch + Triton, no build).
cd "$(dirname "$0")/.."
source bench/h200_lib.sh
h200_header
timeout 400 python3 bench/carveout_probe.py --json "$OUT/h200_v75_carveout.json" 2>&1 | grep -v "Warning: Setting the SM carveout" | tee "$OUT/h200_v75.log"
