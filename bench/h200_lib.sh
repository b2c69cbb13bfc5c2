# Sourced by the bench/h200_v*.sh iteration scripts: $OUT, the GPU line, and the quick build.
set -uo pipefail
OUT=${OUT:-/tmp/uqr_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

h200_header() { date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; }

# sm_90a only (UQR_CUDA_ARCHS; the full run builds sm_80 too): about 30-45 s with 16 jobs.
h200_build() {
  local t0; t0=$(date +%s)
  UQR_CUDA_ARCHS=${UQR_CUDA_ARCHS:-90a} python3 setup.py build_ext --inplace -j 16 > "$OUT/build.log" 2>&1 \
    && echo "build ok ($(( $(date +%s) - t0 )) s)" || { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; return 1; }
}
