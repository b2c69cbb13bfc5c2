"""NaN and Inf in x: one rule on every format, path, dtype and backend (docs/operator.md).

A non-finite x element makes every output it feeds non-finite, as a float matmul does (w·NaN is NaN
for any w; w·Inf is ±Inf, or NaN for w = 0 or when +Inf and -Inf meet), and leaves every other
output finite and correct. The expected mask is the float64 reference's own: ``~isfinite(x @ W.T)``.
Outputs start poisoned with NaN, so an output a kernel skips fails the finiteness check too.
"""
from __future__ import annotations

import pytest
import torch

import torch_uqr as uqr
from torch_uqr.formats import table as format_table
from gemm_helpers import FORMAT_CASES, FORMAT_IDS, assert_close, randn, reference, weights

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
N, K = 40, 512
# Backends of uqr.gemm (its `backend` / the device) -> the format table's backend name.
BACKENDS = {"cpu": "cpu", "metal-emu": "metal", "cuda": "cuda"}
# Row counts per call: the small-M kernels (fused, matrix-vector) and the larger-M ones (panel,
# half-precision library, tiled MMA).
ROWS = (4, 40)


def poisoned_x(M: int, dtype: torch.dtype) -> torch.Tensor:
    """Random x [M, K] with NaN, +Inf and -Inf placed in some rows (first, last and middle
    columns, one row with two kinds), the other rows finite."""
    x = randn(M, K, dtype=dtype)
    x[0, 0] = float("nan")
    x[1, K - 1] = float("inf")
    x[M - 1, K // 2 + 3] = float("-inf")
    if M > 8:
        x[5, 37] = float("nan")
        x[5, 300] = float("inf")
        x[M // 2, 1] = float("-inf")
    return x


def cases(backend: str) -> list:
    out = []
    for (fmt, g), fid in zip(FORMAT_CASES, FORMAT_IDS):
        for path in format_table.spec(fmt).paths(BACKENDS[backend]):
            out.append(pytest.param(fmt, g, path, id=f"{fid}-{path}"))
    return out


def check(fmt: str, g: int | None, path: str, dtype: torch.dtype, backend: str) -> None:
    qt, W = weights(fmt, g, N, K)
    device = "cuda" if backend == "cuda" else "cpu"
    for M in ROWS:
        x = poisoned_x(M, dtype)
        ref = reference(x, W)
        bad = ~torch.isfinite(ref)
        assert bad.any(dim=1).sum() >= 3  # the poisoned rows are non-finite in the float reference
        y = uqr.gemm(x.to(device), qt.to(device), path=path,
                     backend="metal-emu" if backend == "metal-emu" else None).cpu()
        what = f"{backend} {fmt} g={g} {path} {dtype} M={M}"
        got = ~torch.isfinite(y)
        wrong = (got != bad).nonzero().tolist()
        assert not wrong, f"{what}: non-finite pattern differs from a float matmul's at (m, n) {wrong[:8]}"
        clean = ~bad.any(dim=1)
        if path == "int8":
            # int8 rounding of x: check only that clean rows stay finite (done above) and close.
            scale = ref[clean].abs().max().item()
            assert (y[clean].double() - ref[clean]).abs().max().item() < 0.05 * scale, what
        else:
            assert_close(y[clean], ref[clean], dtype, what)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fmt,group_size,path", cases("cpu"))
@pytest.mark.skipif(not uqr.ops.op_available(), reason="torch_uqr._C (CPU backend) not built")
def test_cpu(poisoned_outputs, fmt, group_size, path, dtype) -> None:
    check(fmt, group_size, path, dtype, "cpu")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.slow
@pytest.mark.parametrize("fmt,group_size,path", cases("metal-emu"))
def test_metal_emulator(poisoned_outputs, fmt, group_size, path, dtype) -> None:
    check(fmt, group_size, path, dtype, "metal-emu")


@pytest.mark.skipif(not (torch.cuda.is_available() and uqr.ops.op_available()), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fmt,group_size,path", cases("cuda"))
def test_cuda(poisoned_outputs, fmt, group_size, path, dtype) -> None:
    check(fmt, group_size, path, dtype, "cuda")


@pytest.mark.skipif(not uqr.ops.op_available(), reason="torch_uqr._C (CPU backend) not built")
def test_weight_on_another_device_is_refused() -> None:
    """A CPU x with a meta w reaches the fake kernel (dispatch picks it for any meta argument): it
    must refuse, not return an uninitialised CPU tensor."""
    qt, _ = weights("q4_0", None, N, K)
    x = randn(2, K)
    with pytest.raises(ValueError, match=r"w: expected a tensor on x's device"):
        torch.ops.uqr.gemm(x, qt.data.to("meta"), "q4_0", N, K, 0, 0, False, "auto")
    with pytest.raises(ValueError, match=r"the weights w are on"):
        torch.ops.uqr.gemm(x.to("meta"), qt.data, "q4_0", N, K, 0, 0, False, "auto")
