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

# GPU test files under pytest -n 8: the summary's last lines and the time to stdout. An environment
# prefix (UQR_X=0 h200_tests ...) applies to the run, for A/B runs of a switch.
h200_tests() {
  local t0; t0=$(date +%s)
  python3 -m pytest -q -n 8 "$@" 2>&1 | tail -3
  echo "tests took $(( $(date +%s) - t0 )) s"
}

# bench/int8_probe.py at one row on its default shapes and formats, twice (int8 against the exact
# kernel in each round), rows into $OUT/probe1.json and probe2.json.
h200_int8_probe_rounds() {
  for rep in 1 2; do
    echo "== one row, round $rep"
    PYTHONPATH=. timeout 150 python3 bench/int8_probe.py --M 1 --reps 20 --json "$OUT/probe$rep.json"
  done
}

# ncu of the wgmma kernel, q4_0 14336 x 4096 at 128 and 512 rows: speed of light, scheduler, warp
# states and every stall reason per issued instruction, into $OUT/$1; the summary lines to stdout.
h200_ncu_wgmma() {
  timeout 120 ncu --clock-control none --kernel-name regex:"qmma_wgmma_kernel" --launch-count 2 \
    --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section ComputeWorkloadAnalysis \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio \
    python3 - > "$OUT/$1" 2>&1 <<'PY'
import torch
from torch_uqr.triton_kernels.dispatch import gemm_triton
from torch_uqr.triton_kernels.testing import random_packed
w = random_packed("q4_0", 14336, 4096, 0, seed=1, device="cuda")
for M in (128, 512):
    gemm_triton(torch.randn(M, 4096, device="cuda", dtype=torch.bfloat16), w, "q4_0", 14336, 4096, kernel="wgmma")
torch.cuda.synchronize()
PY
  grep -v "^==PROF==" "$OUT/$1" | grep -E "qmma_wgmma|Duration|Throughput|Issue|Eligible|Pipe|Executed Ipc|Warp Cycles|stalled" \
    | awk '$NF+0 > 0.05 || !/stalled/' | head -80
}

# The header, the sm_90a build and the GPU tests of the tensor-core kernels (wgmma and qmma).
h200_build_and_test_mma() {
  h200_header
  h200_build || return 1
  h200_tests tests/test_cuda_wgmma.py tests/test_cuda_qmma.py
}

# ncu of the small-M kernel (qmma_small_m_kernel), q4_0 14336 x 4096 at 1 and 16 rows: speed of
# light, memory workload (DRAM / L2 / L1 traffic), scheduler, warp states and stall reasons, into
# $OUT/$1; the summary lines to stdout.
h200_ncu_small_m() {
  timeout 150 ncu --clock-control none --kernel-name regex:"qmma_small_m_kernel" --launch-count 2 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
    --section Occupancy --section LaunchStats \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,smsp__inst_executed.sum \
    python3 - > "$OUT/$1" 2>&1 <<'PY'
import torch
from torch_uqr.triton_kernels.testing import random_packed
w = random_packed("q4_0", 14336, 4096, 0, seed=1, device="cuda")
for M in (1, 16):
    torch.ops.uqr._qmma_cuda(torch.randn(M, 4096, device="cuda", dtype=torch.bfloat16), w, "q4_0", 14336, 4096, 0, 0, False)
torch.cuda.synchronize()
PY
  grep -v "^==PROF==" "$OUT/$1" | grep -E "qmma_small|Duration|Throughput|Issue|Eligible|Executed Ipc|Warp Cycles|stalled|dram__bytes|lts__t_sectors|inst_executed|Achieved Occ|Registers|Hit Rate|Waves" \
    | awk '$NF+0 > 0.05 || !/stalled/' | head -90
}

# The header, the sm_90a build and every CUDA GPU test (the ones h200_run.sh runs, plus the dispatch
# rules); the last lines of pytest's summary and the time to stdout.
h200_build_and_test_all() {
  h200_header
  h200_build || return 1
  h200_tests tests/test_triton_cuda.py tests/test_cuda_qmma.py tests/test_cuda_dequant.py \
    tests/test_cuda_scratch_pipeline.py tests/test_cuda_wgmma.py tests/test_cuda_dispatch_rules.py \
    tests/test_cuda_int8.py tests/test_cuda_pdl.py
}

# ncu of the int8 kernel's main pass (qmma_int8_kernel; $2: another kernel-name regex, $3 launches),
# the formats in $INT8_NCU_FORMATS (default q4_0 q4_k) on 14336 x 4096 at one row: speed of light,
# memory workload, scheduler, warp states and stall reasons, into $OUT/$1; the summary lines to stdout.
h200_ncu_int8() {
  INT8_NCU_FORMATS=${INT8_NCU_FORMATS:-q4_0 q4_k} \
  timeout 150 ncu --clock-control none --kernel-name regex:"${2:-qmma_int8_kernel}" --launch-count "${3:-2}" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
    --section Occupancy --section LaunchStats \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio,dram__bytes_read.sum,smsp__inst_executed.sum \
    python3 - > "$OUT/$1" 2>&1 <<'PY'
import os
import torch
from torch_uqr.triton_kernels.testing import random_packed
for fmt in os.environ["INT8_NCU_FORMATS"].split():
    w = random_packed(fmt, 14336, 4096, 0, seed=1, device="cuda")
    torch.ops.uqr._int8_cuda(torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16), w, fmt, 14336, 4096, 0, 0, False)
torch.cuda.synchronize()
PY
  grep -v "^==PROF==" "$OUT/$1" | grep -E "qmma_int8|quantize_x|Duration|Throughput|Issue|Eligible|Executed Ipc|Warp Cycles|stalled|dram__bytes|inst_executed|Achieved Occ|Registers|Waves" \
    | awk '$NF+0 > 0.05 || !/stalled/' | head -90
}
