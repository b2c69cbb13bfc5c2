#!/usr/bin/env bash
# Build and test torch-uqr against the newest torch that pip can install here, in a throwaway venv
# beside the main install (other test dependencies are taken from the system site-packages), on a
# copy of the tracked tree so the main build is left alone. Usage: scripts/test_newest_torch.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv --system-site-packages "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install -q --upgrade torch
echo "torch $("$py" -c 'import torch; print(torch.__version__)') in $work/venv"
mkdir "$work/src"
git ls-files -z | xargs -0 cp --parents -t "$work/src"
cp -r .torch-headers "$work/src/" 2>/dev/null || true
cd "$work/src"
start=$(date +%s)
# CPU kernels only: the CUDA kernels' compile against these headers is checked by
# tests/test_build_torch_headers.py, and a CUDA build here would have no GPU to run on.
UQR_CUDA=0 "$py" setup.py -q build_ext --inplace
echo "build took $(( $(date +%s) - start )) s"
"$py" -m pytest -q tests "$@"
