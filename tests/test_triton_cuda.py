"""The Triton kernels on a real CUDA device (skipped without one).

Unlike the interpreter tests these use the default configurations of configs.py (the ones the
benchmark times), real bf16 tensor cores and tf32 for fp32 activations.
"""
from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

from torch_uqr.formats.table import NAMES as FORMATS
from torch_uqr.formats.table import spec

# bf16 operands round every weight to 8 bits of mantissa; fp32 x may run as tf32 (10 bits) where
# torch.get_float32_matmul_precision() allows it.
TOL = {torch.bfloat16: 8e-3, torch.float16: 1.5e-3, torch.float32: 3e-3}


@pytest.fixture(autouse=True)
def _poison():
    from torch_uqr.ops import poison_outputs
    poison_outputs(True)
    yield
    poison_outputs(False)


def _check(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    assert y.dtype == dtype and y.shape == ref.shape, (what, y.shape, ref.shape)
    assert torch.isfinite(y).all(), f"{what}: unwritten (NaN) outputs"
    err = float((y.double() - ref).norm() / ref.norm())
    assert err < TOL[dtype], f"{what}: rel err {err:.2e}"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cuda_all_m_buckets(fmt: str, dtype: torch.dtype) -> None:
    from torch_uqr.backends.cuda.dispatch import gemm_cuda_route
    from packed_reference import random_packed, reference_dequantize
    g = spec(fmt).default_group_size
    N, K = 200, 1280
    w = random_packed(fmt, N, K, g, seed=int.from_bytes(os.urandom(3), "little"), device="cuda")
    wref = reference_dequantize(w, fmt, N, K, g)
    # One M per configuration bucket of configs.MMA_TABLE for bf16 (the benchmarked dtype).
    for M in (1, 9, 33, 100, 1100) if dtype == torch.bfloat16 else (1, 300):
        x = torch.randn(M, K, device="cuda").to(dtype)
        ref = x.double() @ wref.t()
        kernels = ("fused", "scratch") if M >= 300 else ("fused", "gemv") if M <= 9 else ("fused",)
        for kernel in kernels:
            _check(gemm_cuda_route(x, w, fmt, N, K, g, kernel=kernel), ref, dtype, f"{fmt} M={M} {kernel}")
    if fmt == "ternary":
        for M in (1, 5):
            x = torch.randn(2, M, K, device="cuda").to(dtype)
            _check(gemm_cuda_route(x, w, fmt, N, K, path="vec"), x.double() @ wref.t(), dtype, f"vec M={M}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_cuda_fp32_follows_matmul_precision(fmt: str) -> None:
    """fp32 x is fp32-accurate under PyTorch's default precision "highest" on every kernel and M,
    and may use tf32 under "high", as torch.matmul does."""
    from torch_uqr.backends.cuda.dispatch import gemm_cuda_route
    from packed_reference import random_packed, reference_dequantize
    g = spec(fmt).default_group_size
    N, K = 200, 1280
    w = random_packed(fmt, N, K, g, seed=int.from_bytes(os.urandom(3), "little"), device="cuda")
    wref = reference_dequantize(w, fmt, N, K, g)
    before = torch.get_float32_matmul_precision()
    try:
        for precision, tol in (("highest", 1e-5), ("high", 3e-3)):
            torch.set_float32_matmul_precision(precision)
            for M in (1, 2, 7, 33, 127, 129, 300):
                x = torch.randn(M, K, device="cuda")
                ref = x.double() @ wref.t()
                for kernel in ("auto", "fused", "gemv") if M <= 9 else ("auto", "fused", "scratch"):
                    y = gemm_cuda_route(x, w, fmt, N, K, g, kernel=kernel)
                    assert torch.isfinite(y).all(), f"{fmt} M={M} {kernel}: unwritten outputs"
                    err = float((y.double() - ref).norm() / ref.norm())
                    assert err < tol, f"{fmt} M={M} {kernel} {precision}: rel err {err:.2e}"
    finally:
        torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize("fmt", ["q4_0", "q4_k", "var_affine", "ternary"])
def test_cuda_head_layouts(fmt: str) -> None:
    from torch_uqr.backends.cuda.dispatch import gemm_cuda_route
    from packed_reference import random_packed, reference_dequantize
    N, K, H_in, H_out, M = 256, 1024, 8, 4, 37
    w = random_packed(fmt, N, K, 0, seed=3, device="cuda")
    wref = reference_dequantize(w, fmt, N, K)
    x = torch.randn(3, H_in, M, K // H_in, device="cuda", dtype=torch.bfloat16)
    ref = (x.transpose(1, 2).reshape(3, M, K).double() @ wref.t()).reshape(3, M, H_out, N // H_out).transpose(1, 2)
    for path in ("mma", "vec") if fmt == "ternary" else ("mma",):
        for kernel in ("fused", "scratch", "gemv"):
            y = gemm_cuda_route(x, w, fmt, N, K, 0, out_heads=H_out, in_heads=True, path=path, kernel=kernel)
            _check(y, ref, torch.bfloat16, f"{fmt} heads {path} {kernel}")


def test_cuda_registered_operator() -> None:
    """torch.ops.uqr.gemm on CUDA tensors reaches the Triton kernels."""
    ops = pytest.importorskip("torch_uqr.ops")
    if not ops.op_available():
        pytest.skip("torch_uqr._C is not built")
    from packed_reference import random_packed, reference_dequantize
    N, K = 96, 512
    w = random_packed("q4_k", N, K, 0, seed=5, device="cuda")
    x = torch.randn(4, K, device="cuda", dtype=torch.bfloat16)
    y = torch.ops.uqr.gemm(x, w, "q4_k", N, K, 0, 0, False, "auto")
    _check(y, x.double() @ reference_dequantize(w, "q4_k", N, K).t(), torch.bfloat16, "op")
