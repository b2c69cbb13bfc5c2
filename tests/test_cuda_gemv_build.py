"""CI has nvcc but no GPU: compile the small-M CUDA kernel for both targets setup.py builds.

The .cu needs no torch headers, so plain nvcc compiles it. ptxas's report is checked too: a kernel
that spills its accumulators to local memory would lose the bandwidth it exists for.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC = shutil.which("nvcc") or next(
    (p for p in (os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"),) if os.path.exists(p)),
    None)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (CUDA toolkit not installed)")
def test_gemv_small_m_compiles_for_sm80_and_sm90a(tmp_path) -> None:
    cmd = [NVCC, "-std=c++17", "-O3", "--threads", "2", "-Xptxas", "-v",
           "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90a,code=sm_90a",
           "-I", os.path.join(ROOT, "csrc", "include"),
           "-c", os.path.join(ROOT, "csrc", "cuda", "gemv_small_m.cu"), "-o", str(tmp_path / "gemv.o")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    assert (tmp_path / "gemv.o").stat().st_size > 0
    report = res.stdout + res.stderr
    # One ptxas line per kernel and target: 8 formats x 4 row counts x 2 targets.
    kernels = re.findall(r"Compiling entry function '(\w*gemv_small_m_kernel\w*)' for '(sm_\w+)'", report)
    assert len(set(kernels)) == 64, f"expected 64 kernel builds, got {len(set(kernels))}"
    assert {arch for _, arch in kernels} == {"sm_80", "sm_90a"}
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", report)]
    assert spills and max(spills) == 0, "a kernel spills registers to local memory"
