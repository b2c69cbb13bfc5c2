"""The CPU fast paths for bf16 / fp16 activations, against float64 references.

Which path a call takes (csrc/cpu/gemm_cpu.cpp): bf16 with more than 8 rows, and fp16 with at
least 256 rows, decode the weights into x's dtype and multiply with ATen's mm ("library" path);
everything else runs the exact fp32 kernels. Each case is checked twice:

* against `x @ W.T` in float64 with the usual 1e-2 relative bound, and
* element by element against the reference the path claims to compute: the exact paths must
  equal the float64 product rounded once to x's dtype, the library path the float64 product with
  W rounded to x's dtype, each within half an ulp of the output dtype plus fp32 accumulation
  error. The exact bound fails for rounded weights and the rounded bound fails for exact weights
  (the per-weight rounding error, summed over K, is far above the accumulation error), so these
  also tell which path ran.

Outputs are NaN-poisoned so an unwritten element fails the finiteness check.
"""
from __future__ import annotations

import pytest
import torch

import torch_uqr as uqr
from torch_uqr.formats import table as format_table
from gemm_helpers import FORMAT_CASES, FORMAT_IDS, SEED, assert_close, randn, reference, weights

N_ODD = 70
FP16_LIBRARY_MIN_ROWS = 256  # kHalfFp16MinRows in gemm_cpu.cpp


pytestmark = pytest.mark.usefixtures("poisoned_outputs")


def k_for(fmt: str) -> int:
    return 256 if format_table.spec(fmt).block == 256 else 384


def library_path(dtype: torch.dtype, rows: int, path: str) -> bool:
    if path == "vec":
        return False
    return rows > 8 if dtype == torch.bfloat16 else rows >= FP16_LIBRARY_MIN_ROWS


def assert_rounded_from(y: torch.Tensor, exact: torch.Tensor, what: str) -> None:
    """y == exact rounded to y's dtype, to half an ulp plus fp32 accumulation error."""
    half_ulp = 2.0 ** (-8 if y.dtype == torch.bfloat16 else -11)
    bound = exact.abs() * half_ulp * 1.01 + 2e-5 * exact.abs().max().item()
    worst = ((y.double() - exact).abs() - bound).max().item()
    assert worst <= 0, f"{what}: an element is {worst:.3g} past its rounding bound (seed={SEED})"


def check(y, x, qt, W, out_heads, in_heads, rows, path, what):
    dtype = x.dtype
    ref = reference(x, W, out_heads, in_heads)
    assert_close(y, ref, dtype, what)
    if library_path(dtype, rows, path):
        ref = reference(x, W.to(dtype).double(), out_heads, in_heads)
    assert_rounded_from(y, ref, what)


def paths_for(fmt: str) -> list[str]:
    return ["auto", "vec"] if fmt == "ternary" else ["auto"]


@pytest.mark.parametrize("fmt,g", FORMAT_CASES, ids=FORMAT_IDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("M", [1, 7, 9, 33, 129])
def test_plain(fmt, g, dtype, M):
    K = k_for(fmt)
    qt, W = weights(fmt, g, N_ODD, K)
    # 2 x 129 rows reach the fp16 library path.
    leads = [(), (3,)] if M == 1 else [(2,)] if M == 129 else [()]
    for lead in leads:
        x = randn(*lead, M, K, dtype=dtype)
        rows = x.numel() // K
        for path in paths_for(fmt):
            y = uqr.gemm(x, qt, path=path)
            check(y, x, qt, W, 0, False, rows, path, f"{fmt} {dtype} M={M} lead={lead} path={path}")


# (out_heads, in_heads, x heads): direct-head output, head-strided input, and both.
LAYOUTS = [(5, False, 0), (0, True, 4), (7, True, 8)]


@pytest.mark.parametrize("fmt,g", FORMAT_CASES, ids=FORMAT_IDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("out_heads,in_heads,h_in", LAYOUTS, ids=["out_heads", "in_heads", "both"])
@pytest.mark.parametrize("M", [1, 7, 9, 33, 129])
def test_head_layouts(fmt, g, dtype, out_heads, in_heads, h_in, M):
    K = k_for(fmt)
    qt, W = weights(fmt, g, N_ODD, K)
    lead = (2,) if M >= 9 else () if M == 1 else (1,)
    x = randn(*lead, h_in, M, K // h_in, dtype=dtype) if in_heads else randn(*lead, M, K, dtype=dtype)
    rows = x.numel() // K
    for path in paths_for(fmt):
        y = uqr.gemm(x, qt, out_heads=out_heads, in_heads=in_heads, path=path)
        check(y, x, qt, W, out_heads, in_heads, rows, path,
              f"{fmt} {dtype} heads=({out_heads},{in_heads}) M={M} lead={lead} path={path}")


def test_strided_rows_and_large_panel():
    """x rows with a stride larger than K (a view, no gather) and N above one decoded panel."""
    qt, W = weights("q4_0", None, 1100, 128)
    x = randn(40, 200, dtype=torch.bfloat16)[:, 30:158]
    y = uqr.gemm(x, qt)
    check(y, x, qt, W, 0, False, 40, "auto", "strided rows, N > panel")
    y = uqr.gemm(x.unsqueeze(0), qt, out_heads=11)
    check(y, x.unsqueeze(0), qt, W, 11, False, 40, "auto", "strided rows, N > panel, heads")
