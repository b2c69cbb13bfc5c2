"""CI has nvcc but no GPU: compile the CUDA C++ kernels for both targets setup.py builds.

The .cu needs no torch headers, so plain nvcc compiles it. ptxas's report is checked too: a kernel
that spills its accumulators to local memory would lose the bandwidth it exists for. The PTX of
the kernels that wait for the previous kernel (programmatic dependent launch) has no read-only loads.
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


# (source, kernel name, instantiations per target): the tensor-core small-M kernel is 10
# format/group variants (all eight formats, mlx4 at g = 32 / 64 / 128) x {bf16, fp16} x {1, 2}
# column tiles; the mid-M kernel 10 x 2 x {2 (9-16 rows, split K), 4, 8} column tiles (of 8 activation rows), plus
# the 9-16-row build at 128 registers (the stream-K plan's wide_regs) for the 9 variants not already built so; the
# decode-to-dense kernel 10 format/group variants x {bf16, fp16, fp32} outputs; the Hopper wgmma
# kernel 10 x 2 x {64, 128} column tiles less mlx4 g128 at 128 (its stage does not fit shared memory),
# plus 64-row tiles at two CTAs an SM for the 8 variants whose stages fit half the shared memory;
# the int8-activation kernel q4_0 / q4_k x {bf16, fp16} x {one row (x staged, global, or global a
# stage ahead in registers, or a block a column), 1 and 2 column tiles}, and mlx4 g = 32 / 64, ternary,
# var_affine and exl3 x {bf16, fp16} in block columns.
KERNELS = [("qmma_small_m.cu", "qmma_small_m_kernel", 40), ("qmma_mid_m.cu", "qmma_mid_m_kernel", 78),
           ("dequant.cu", "dequant_kernel", 30), ("qmma_wgmma.cu", "qmma_wgmma_kernel", 54),
           ("qmma_int8.cu", "qmma_int8_kernel", 34)]


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (CUDA toolkit not installed)")
@pytest.mark.parametrize("source,kernel,per_target", KERNELS, ids=[k[0] for k in KERNELS])
def test_cuda_kernel_compiles_for_sm80_and_sm90a(tmp_path, source: str, kernel: str, per_target: int) -> None:
    obj = tmp_path / "kernel.o"
    cmd = [NVCC, "-std=c++17", "-O3", "--threads", "2", "-Xptxas", "-v",
           "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90a,code=sm_90a",
           "-I", os.path.join(ROOT, "csrc", "include"),
           "-c", os.path.join(ROOT, "csrc", "cuda", source), "-o", str(obj)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    assert obj.stat().st_size > 0
    report = res.stdout + res.stderr
    builds = re.findall(rf"Compiling entry function '(\w*{kernel}\w*)' for '(sm_\w+)'", report)
    assert len(set(builds)) == 2 * per_target, f"expected {2 * per_target} kernel builds, got {len(set(builds))}"
    assert {arch for _, arch in builds} == {"sm_80", "sm_90a"}
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", report)]
    assert spills and max(spills) == 0, "a kernel spills registers to local memory"


# Every source whose kernels call pdl_wait() (cuda_common.cuh): those kernels start while the
# previous kernel may still write x, so a read-only-path load (ld.global.nc: __ldg, or a
# const __restrict__ pointer) is not allowed in them - ptxas may schedule it above the wait.
PDL_SOURCES = sorted(f for f in os.listdir(os.path.join(ROOT, "csrc", "cuda"))
                     if f.endswith(".cu") and "pdl_wait()" in open(os.path.join(ROOT, "csrc", "cuda", f)).read())


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (CUDA toolkit not installed)")
@pytest.mark.parametrize("source", PDL_SOURCES)
def test_no_read_only_loads_in_kernels_that_wait(tmp_path, source: str) -> None:
    """Seen once: the ternary int8 kernel's __ldg of the pre-pass's x codes ran before griddepcontrol.wait
    in its SASS and read the previous call's x when the pre-pass was late (wrong outputs under load,
    none with the dependent launch off). The PTX of each kernel that waits has no ld.global.nc."""
    ptx = tmp_path / "k.ptx"
    cmd = [NVCC, "-std=c++17", "-O3", "-gencode", "arch=compute_90a,code=sm_90a", "-ptx",
           "-I", os.path.join(ROOT, "csrc", "include"), os.path.join(ROOT, "csrc", "cuda", source), "-o", str(ptx)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    entries = re.split(r"\n\.entry ", ptx.read_text())[1:]
    waiting = [e for e in entries if "griddepcontrol.wait" in e]
    assert waiting, f"{source}: no kernel with griddepcontrol.wait found in the PTX"
    bad = [e.split("(")[0] for e in waiting if "ld.global.nc" in e]
    assert not bad, f"{source}: ld.global.nc in kernels that wait for the previous kernel: {bad[:3]}"
