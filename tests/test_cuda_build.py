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

from cuda_test_helpers import router_variants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC = shutil.which("nvcc") or next(
    (p for p in (os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"),) if os.path.exists(p)),
    None)


def _expected(source: str) -> set[tuple[str, int]]:
    from torch_uqr.backends.cuda import dispatch
    from torch_uqr.formats.table import format_cases

    if source == "dequant.cu":  # the decode-to-dense kernel takes every format
        return {(f, g or 0) for f, g in format_cases()}
    # wgmma_fits is qmma_fits plus an sm_90 device and K % 64 == 0, which the probe call meets.
    fits = {"qmma_small_m.cu": dispatch.qmma_fits, "qmma_mid_m.cu": dispatch.qmma_fits,
            "qmma_wgmma.cu": dispatch.qmma_fits, "qmma_int8.cu": dispatch.int8_fits}[source]
    return set(router_variants(fits))


def _variant(name: str) -> tuple[str, int]:
    """(format, group) of a kernel from its mangled template arguments: qmma::Traits<id> or
    qmma::Mlx4<g> (tensor-core kernels), <id, g, ...> (decode), <id or 0x100 | g, ...> (int8)."""
    from torch_uqr.formats.table import TABLE

    by_id = {f.id: f.name for f in TABLE}
    if m := re.search(r"4qmma6TraitsILi(\d+)E", name):
        return by_id[int(m.group(1))], 0
    if m := re.search(r"4qmma4Mlx4ILi(\d+)E", name):
        return "mlx4", int(m.group(1))
    if m := re.search(r"dequant_kernelILi(\d+)ELi(\d+)E", name):
        return by_id[int(m.group(1))], int(m.group(2))
    if m := re.search(r"qmma_int8_kernel\w*?ILi(\d+)E", name):
        key = int(m.group(1))
        return ("mlx4", key & 0xFF) if key & 0x100 else (by_id[key], 0)
    raise AssertionError(f"cannot tell the format of kernel {name}")


# (source, kernel name): each is compiled for both targets and must instantiate a kernel for
# exactly the format variants its router predicate accepts (every variant for the decoder).
KERNELS = [("qmma_small_m.cu", "qmma_small_m_kernel"), ("qmma_mid_m.cu", "qmma_mid_m_kernel"),
           ("dequant.cu", "dequant_kernel"), ("qmma_wgmma.cu", "qmma_wgmma_kernel"),
           ("qmma_int8.cu", "qmma_int8_kernel")]


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (CUDA toolkit not installed)")
@pytest.mark.parametrize("source,kernel", KERNELS, ids=[k[0] for k in KERNELS])
def test_cuda_kernel_compiles_for_sm80_and_sm90a(tmp_path, source: str, kernel: str) -> None:
    obj = tmp_path / "kernel.o"
    cmd = [NVCC, "-std=c++17", "-O3", "--threads", "2", "-Xptxas", "-v",
           "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90a,code=sm_90a",
           "-I", os.path.join(ROOT, "csrc", "include"),
           "-c", os.path.join(ROOT, "csrc", "cuda", source), "-o", str(obj)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    assert obj.stat().st_size > 0
    report = res.stdout + res.stderr
    builds = set(re.findall(rf"Compiling entry function '(\w*{kernel}\w*)' for '(sm_\w+)'", report))
    by_arch = {arch: {n for n, a in builds if a == arch} for arch in ("sm_80", "sm_90a")}
    assert by_arch["sm_80"] and by_arch["sm_80"] == by_arch["sm_90a"], "both targets build the same kernels"
    built = {_variant(n) for n in by_arch["sm_80"]}
    want = _expected(source)
    assert built == want, (f"{source}: kernels for {sorted(built - want)} that the router never picks, "
                           f"none for {sorted(want - built)} that it does")
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
