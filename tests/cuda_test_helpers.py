"""Helpers shared by the tests of the CUDA C++ kernels (run only where a GPU is present)."""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

import pytest
import torch


def router_variants(fits) -> list[tuple[str, int]]:
    """(format, group size or 0) of every table variant, in table order, that the CUDA router's
    predicate ``fits`` (dispatch.qmma_fits, int8_fits) would send to a kernel, asked with an
    aligned one-row call whose K is whole stages of every format. Needs no GPU."""
    from torch_uqr.formats.table import format_cases, spec

    K = 4096
    x = torch.zeros(1, K, dtype=torch.bfloat16)
    out = []
    for fmt, g in format_cases():
        elems, nbytes = spec(fmt).block_geometry(g or 0)
        w = torch.zeros(16, K // elems * nbytes, dtype=torch.uint8)
        if fits(x, w, fmt, K, g or 0, False, 1):
            out.append((fmt, g or 0))
    return out


def _tc_formats() -> list[tuple[str, int]]:
    from torch_uqr.backends.cuda.dispatch import qmma_fits
    return router_variants(qmma_fits)


# Every format / mlx4 group the tensor-core kernels take, as (fmt, group_size) test parameters:
# what the router's own predicate accepts, so a new format is tested the day it gets a kernel.
TC_FORMATS = _tc_formats()
TC_FORMAT_IDS = [f"{f}{g or ''}" for f, g in TC_FORMATS]
# The tensor-core kernels' bound on y's relative error: y's rounding (bf16 2^-9, fp16 2^-12) plus
# the fp32 sums, with each weight rounded to x's dtype at most once.
HALF_TOL = {torch.bfloat16: 6e-3, torch.float16: 1.5e-3}


def check_half(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """y in x's half dtype and within HALF_TOL of the float64 reference (element-wise within 4x)."""
    assert y.dtype == dtype, (what, y.dtype)
    check_close(y, ref, HALF_TOL[dtype], what, worst_factor=4)


def require_qmma_kernel() -> None:
    """Skip unless torch_uqr._C was built with the CUDA C++ tensor-core kernels."""
    ops = pytest.importorskip("torch_uqr.ops")
    from torch_uqr.backends.cuda.dispatch import qmma_available
    if not ops.op_available() or not qmma_available():
        pytest.skip("torch_uqr._C was built without the CUDA kernels")


@contextlib.contextmanager
def poisoned() -> Iterator[None]:
    """Every fresh output NaN-filled inside the block (torch_uqr.ops.poison_outputs), so an element
    a kernel skips fails the finiteness check; off again after it."""
    from torch_uqr.ops import poison_outputs
    poison_outputs(True)
    try:
        yield
    finally:
        poison_outputs(False)


@pytest.fixture
def poisoned_outputs() -> Iterator[None]:
    """Fixture form of ``poisoned`` for one test (import it into the test module)."""
    with poisoned():
        yield


def fresh_seed() -> int:
    """A new seed every run (fresh random data); the failing assert's message carries the shape."""
    return int.from_bytes(os.urandom(3), "little")


def check_close(y: torch.Tensor, ref: torch.Tensor, tol: float, what: str, worst_factor: float | None = None) -> None:
    """y finite (so NaN-poisoned, unwritten outputs fail), shaped like ref, within tol of it.

    The norm-wise relative error is bounded by ``tol``; with ``worst_factor`` every element must also
    be within ``worst_factor * tol`` of max |ref|, so one wrong row cannot hide in the norm.
    """
    assert y.shape == ref.shape, (what, y.shape, ref.shape)
    assert torch.isfinite(y).all(), f"{what}: unwritten (NaN) outputs"
    err = float((y.double() - ref).norm() / ref.norm())
    assert err < tol, f"{what}: rel err {err:.2e}"
    if worst_factor is not None:
        worst = float(((y.double() - ref).abs() / ref.abs().max()).max())
        assert worst < worst_factor * tol, f"{what}: worst element err {worst:.2e}"


def check_layouts(op, fmt: str, N: int, cases: tuple, K: int = 2048) -> None:
    """Batched x, head-strided x and direct-head y through ``op`` (a uqr::gemm-like op taking
    (x, w, fmt, N, K, group_size, out_heads, in_heads)) against float64, for (batch, M) cases."""
    from packed_reference import random_packed, reference_dequantize
    from torch_uqr.formats.table import spec
    g = spec(fmt).default_group_size
    H_in, H_out = 8, 4  # x heads of 256: whole stages
    w = random_packed(fmt, N, K, g, seed=fresh_seed(), device="cuda")
    wref = reference_dequantize(w, fmt, N, K, g)
    for batch, M in cases:
        x = torch.randn(batch, H_in, M, K // H_in, device="cuda", dtype=torch.bfloat16)
        flat = x.transpose(1, 2).reshape(batch, M, K).double() @ wref.t()
        heads = flat.reshape(batch, M, H_out, N // H_out).transpose(1, 2)
        check_half(op(x, w, fmt, N, K, g, H_out, True), heads, torch.bfloat16, f"{fmt} heads b={batch} M={M}")
        xp = x.transpose(1, 2).reshape(batch, M, K).contiguous()
        check_half(op(xp, w, fmt, N, K, g, 0, False), flat, torch.bfloat16, f"{fmt} batch b={batch} M={M}")
        check_half(op(xp, w, fmt, N, K, g, H_out, False), heads, torch.bfloat16, f"{fmt} y heads b={batch} M={M}")
