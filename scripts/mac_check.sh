#!/usr/bin/env bash
# One command for a Mac user: build torch-uqr with its Metal kernels, run the Apple GPU test suite
# and the benchmark (with torch's fp16 matmul and, if installed, MLX as peers in the same run), and
# print a report to paste into an issue. Also written to mac_check_report.md.
#
#   scripts/mac_check.sh            # venv .venv-mac-check (created if missing), full run
#   scripts/mac_check.sh --quick    # benchmark 1024x1024 at M = 1, 16, 128 only
#   options: --venv DIR, --no-venv (the current python3 and its packages), --no-bench, --no-mlx
#
# Needs macOS 13+ on Apple Silicon and the Xcode command-line tools (xcode-select --install).
# UQR_MAC_CHECK_DRY_RUN=1 prints the commands instead of running them (used by the test suite).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-mac-check"
USE_VENV=1 BENCH=1 QUICK=0 MLX=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --venv) VENV="$2"; shift 2 ;;
    --no-venv) USE_VENV=0; shift ;;
    --no-bench) BENCH=0; shift ;;
    --quick) QUICK=1; shift ;;
    --no-mlx) MLX=0; shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "mac_check.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [[ "$(uname -s)" != "Darwin" || "$(uname -m)" != "arm64" ]]; then
  echo "SKIP: scripts/mac_check.sh needs macOS on Apple Silicon (arm64); this is $(uname -s) $(uname -m)."
  echo "      Nothing was built or run. On Linux, the Metal kernels are checked by the emulator tests."
  exit 0
fi

DRY="${UQR_MAC_CHECK_DRY_RUN:-0}"
REPORT="$ROOT/mac_check_report.md"
LOG_DIR="$(mktemp -d "${TMPDIR:-/tmp}/uqr_mac_check.XXXXXX")"
run() {  # run a command (or print it in a dry run), output to the terminal and a log
  local log="$1"; shift
  echo "+ $*"
  [[ "$DRY" == "1" ]] && return 0
  "$@" 2>&1 | tee "$LOG_DIR/$log"
  return "${PIPESTATUS[0]}"
}

cd "$ROOT" || exit 1
if [[ "$USE_VENV" == "1" ]]; then
  if [[ ! -x "$VENV/bin/python" ]]; then
    run venv.log python3 -m venv "$VENV" || { echo "mac_check.sh: could not create the venv $VENV" >&2; exit 1; }
  fi
  PY="$VENV/bin/python"
else
  PY="$(command -v python3)"
fi

if [[ "$USE_VENV" == "1" ]]; then  # --no-venv: the current environment is used as it is
  run pip.log "$PY" -m pip install --upgrade pip torch numpy tqdm ninja pytest setuptools wheel || exit 1
fi
if [[ "$MLX" == "1" ]]; then
  run mlx.log "$PY" -m pip install mlx || echo "note: mlx did not install; the benchmark runs without the MLX column"
fi
run build.log "$PY" -m pip install --no-build-isolation -e . || { echo "mac_check.sh: the build failed (see above)" >&2; exit 1; }

# The Apple GPU suite, the emulator / strict-shader suites that run everywhere, for comparison.
run tests.log "$PY" -m pytest -q -rs tests/test_mps.py tests/test_metal_emu.py tests/test_shader_strict.py
TEST_RC=$?

BENCH_ARGS=(--device mps --dtype float16)
[[ "$QUICK" == "1" ]] && BENCH_ARGS+=(--quick)
if [[ "$BENCH" == "1" ]]; then
  run bench.log "$PY" -m torch_uqr bench "${BENCH_ARGS[@]}"
fi

[[ "$DRY" == "1" ]] && exit 0

{
  echo "## torch-uqr mac_check report"
  echo
  echo '```'
  echo "machine:  $(sysctl -n machdep.cpu.brand_string 2>/dev/null) ($(sysctl -n hw.ncpu) cores, $(( $(sysctl -n hw.memsize) / 1073741824 )) GiB)"
  echo "GPU:      $(system_profiler SPDisplaysDataType 2>/dev/null | awk -F': ' '/Chipset Model|Total Number of Cores/ {printf "%s ", $2}')"
  echo "macOS:    $(sw_vers -productVersion) ($(sw_vers -buildVersion))"
  echo "SDK:      $(xcrun --show-sdk-version 2>/dev/null || echo unknown)"
  echo "python:   $("$PY" -c 'import sys; print(sys.version.split()[0])')"
  echo "torch:    $("$PY" -c 'import torch; print(torch.__version__, "mps available:", torch.backends.mps.is_available())')"
  echo "mlx:      $("$PY" -c 'import mlx.core as mx; print(mx.__version__)' 2>/dev/null || echo 'not installed')"
  echo "commit:   $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null) $(git -C "$ROOT" status --porcelain 2>/dev/null | grep -q . && echo '(with local changes)')"
  echo '```'
  echo
  echo "### Tests (exit code $TEST_RC)"
  echo '```'
  grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed|error" "$LOG_DIR/tests.log" | tail -40
  echo '```'
  if [[ "$BENCH" == "1" && -f "$LOG_DIR/bench.log" ]]; then
    echo
    echo "### Benchmark (python -m torch_uqr bench ${BENCH_ARGS[*]})"
    echo
    grep -E "^\||^device=|^MPS peers" "$LOG_DIR/bench.log"
  fi
} > "$REPORT"

echo
echo "==================== paste everything below into the issue ===================="
cat "$REPORT"
echo "(also written to $REPORT; full logs in $LOG_DIR)"
exit "$TEST_RC"
