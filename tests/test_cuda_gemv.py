"""The CUDA C++ small-M kernel (csrc/cuda/gemv_small_m.cu) on a real GPU against float64.

Skipped without a CUDA device or when torch_uqr._C was built without the kernel (CPU torch). y is
NaN-poisoned (UQR_POISON=1) so unwritten outputs fail; shapes are odd on purpose: N not a multiple
of a CTA's rows, K long enough to K-tile x at 8 rows, rows whose bytes are not 16-byte aligned.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

FORMATS = ["q4_0", "q4_1", "q8_0", "q4_k", "mlx4", "var_affine", "exl3", "ternary"]
# Decode is exact and accumulation fp32, so the error is y's own rounding (bf16: 2^-9) plus fp32 sums.
TOL = {torch.bfloat16: 6e-3, torch.float16: 1e-3, torch.float32: 2e-5}


@pytest.fixture(autouse=True)
def _needs_kernel(monkeypatch):
    ops = pytest.importorskip("torch_uqr.ops")
    from torch_uqr.triton_kernels.dispatch import cuda_gemv_available
    if not ops.op_available() or not cuda_gemv_available():
        pytest.skip("torch_uqr._C was built without the CUDA kernel")
    monkeypatch.setenv("UQR_POISON", "1")


def _seed() -> int:
    return int.from_bytes(os.urandom(3), "little")


def _check(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    assert y.dtype == dtype and y.shape == ref.shape, (what, y.shape, ref.shape)
    assert torch.isfinite(y).all(), f"{what}: unwritten (NaN) outputs"
    err = float((y.double() - ref).norm() / ref.norm())
    assert err < TOL[dtype], f"{what}: rel err {err:.2e}"


def _gemv(x, w, fmt, N, K, g=0, out_heads=0, in_heads=False):
    return torch.ops.uqr._gemv_cuda(x, w, fmt, N, K, g, out_heads, in_heads)


@pytest.mark.parametrize("fmt", FORMATS)
def test_gemv_cuda_every_m_and_dtype(fmt: str) -> None:
    from torch_uqr.triton_kernels.testing import random_packed, reference_dequantize
    g = 64 if fmt == "mlx4" else 0
    # K = 4608: at 8 rows x no longer fits the 64 KB fp32 budget in one tile (2048 per tile).
    for N, K in ((200, 1280), (37, 4608)):
        w = random_packed(fmt, N, K, g, seed=_seed(), device="cuda")
        wref = reference_dequantize(w, fmt, N, K, g)
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for M in (1, 2, 7, 8):
                x = torch.randn(M, K, device="cuda").to(dtype)
                _check(_gemv(x, w, fmt, N, K, g), x.double() @ wref.t(), dtype, f"{fmt} {N}x{K} M={M} {dtype}")
        x = torch.randn(K, device="cuda", dtype=torch.bfloat16)  # 1-D x
        _check(_gemv(x, w, fmt, N, K, g), x.double() @ wref.t(), torch.bfloat16, f"{fmt} 1-D")


@pytest.mark.parametrize("fmt", ["q4_0", "q8_0", "mlx4", "ternary"])
def test_gemv_cuda_unaligned_rows(fmt: str) -> None:
    """Rows of 54 bytes (q4_0 K = 96) and a base 2 bytes off 16: the byte-copy fallback."""
    from torch_uqr.triton_kernels.testing import random_packed, reference_dequantize
    g = 32 if fmt == "mlx4" else 0
    N, K = 45, 96
    w0 = random_packed(fmt, N, K, g, seed=_seed(), device="cuda")
    buf = torch.empty(w0.numel() + 2, dtype=torch.uint8, device="cuda")
    w = buf[2:].view(w0.shape)
    w.copy_(w0)
    wref = reference_dequantize(w, fmt, N, K, g)
    for M in (1, 8):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        _check(_gemv(x, w, fmt, N, K, g), x.double() @ wref.t(), torch.bfloat16, f"{fmt} unaligned M={M}")


@pytest.mark.parametrize("fmt", ["q4_0", "q4_k", "exl3"])
def test_gemv_cuda_layouts(fmt: str) -> None:
    """Batched x, head-strided x and direct-head y, all through the stride params (no copies)."""
    from torch_uqr.triton_kernels.testing import random_packed, reference_dequantize
    N, K, H_in, H_out = 256, 1024, 8, 4
    w = random_packed(fmt, N, K, 0, seed=_seed(), device="cuda")
    wref = reference_dequantize(w, fmt, N, K)
    for batch, M in ((2, 3), (1, 7), (4, 2)):
        x = torch.randn(batch, H_in, M, K // H_in, device="cuda", dtype=torch.bfloat16)
        flat = x.transpose(1, 2).reshape(batch, M, K).double() @ wref.t()
        heads = flat.reshape(batch, M, H_out, N // H_out).transpose(1, 2)
        _check(_gemv(x, w, fmt, N, K, 0, H_out, True), heads, torch.bfloat16, f"{fmt} heads b={batch} M={M}")
        xp = x.transpose(1, 2).reshape(batch, M, K)
        _check(_gemv(xp, w, fmt, N, K), flat, torch.bfloat16, f"{fmt} batch b={batch} M={M}")
        xs = torch.randn(batch, M, 2 * K, device="cuda", dtype=torch.bfloat16)[..., ::2]  # strided columns
        _check(_gemv(xs, w, fmt, N, K), xs.double() @ wref.t(), torch.bfloat16, f"{fmt} strided b={batch}")


def test_gemv_cuda_rejects_too_many_rows() -> None:
    """In a subprocess: on the H200 (v8) this check's C++ exception aborted the process instead of
    raising, so the test reports that as a failure without taking the session down with it."""
    code = (
        "import torch, torch_uqr.ops\n"
        "from torch_uqr.triton_kernels.testing import random_packed\n"
        "w = random_packed('q4_0', 64, 256, 0, seed=1, device='cuda')\n"
        "try:\n"
        "    torch.ops.uqr._gemv_cuda(torch.randn(3, 3, 256, device='cuda'), w, 'q4_0', 64, 256, 0, 0, False)\n"
        "except RuntimeError as e:\n"
        "    print('raised:', e)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert res.returncode == 0, f"process died ({res.returncode}): {res.stderr[-1500:]}"
    assert "at most 8 activation rows" in res.stdout, res.stdout + res.stderr[-1500:]


def test_dispatch_routes_small_m_to_cuda_kernel(monkeypatch) -> None:
    """gemm_triton's auto choice reaches the kernel at <= 8 rows (and the registered op with it)."""
    from torch_uqr.triton_kernels import configs, dispatch
    from torch_uqr.triton_kernels.testing import random_packed, reference_dequantize
    called = []
    real = torch.ops.uqr._gemv_cuda
    monkeypatch.setattr(dispatch, "cuda_gemv_available", lambda: True)
    monkeypatch.setattr(configs, "CUDA_GEMV_ENABLED", True)
    monkeypatch.setattr(torch.ops.uqr, "_gemv_cuda", lambda *a: called.append(a) or real(*a), raising=False)
    w = random_packed("q4_1", 96, 512, 0, seed=2, device="cuda")
    x = torch.randn(2, 4, 512, device="cuda", dtype=torch.bfloat16)
    y = dispatch.gemm_triton(x, w, "q4_1", 96, 512)
    assert len(called) == 1
    _check(y, x.double() @ reference_dequantize(w, "q4_1", 96, 512).t(), torch.bfloat16, "dispatch")
    dispatch.gemm_triton(torch.randn(9, 512, device="cuda", dtype=torch.bfloat16), w, "q4_1", 96, 512)
    assert len(called) == 1, "9 rows must stay on Triton"
