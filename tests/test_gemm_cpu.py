"""torch.ops.uqr.gemm on CPU against the float64 reference: every format, path, dtype and layout.

Outputs are NaN-poisoned (``ops.poison_outputs``: the op allocates y filled with NaN), so an element a
kernel forgets to write fails the finiteness check. M <= 8 exercises the fused decode+dot kernel,
larger M the decode-panel + GEMM path; ternary runs both of its paths.
"""
from __future__ import annotations

import pytest
import torch

import torch_uqr as uqr
from torch_uqr.formats import table as format_table
from gemm_helpers import FORMAT_CASES, FORMAT_IDS, assert_close, quantized, randn, reference, weights

N_ODD = 70  # not a multiple of the 4-row tiles, the 64-row work units, or the 16-row panels
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


pytestmark = pytest.mark.usefixtures("poisoned_outputs")


def k_for(fmt: str) -> int:
    return 512 if format_table.spec(fmt).block == 256 else 384


def paths_for(fmt: str) -> list[str]:
    return ["auto", "mma", "vec"] if fmt == "ternary" else ["auto"]


@pytest.mark.parametrize("fmt,g", FORMAT_CASES, ids=FORMAT_IDS)
@pytest.mark.parametrize("M", [1, 2, 7, 8, 9, 23, 24, 33, 129])
def test_formats_and_paths_fp32(fmt, g, M):
    K = k_for(fmt)
    qt, W = weights(fmt, g, N_ODD, K)
    x = randn(M, K)
    ref = reference(x, W)
    for path in paths_for(fmt):
        assert_close(uqr.gemm(x, qt, path=path), ref, torch.float32, f"{fmt} M={M} path={path}")


@pytest.mark.parametrize("fmt,g", FORMAT_CASES, ids=FORMAT_IDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("M", [3, 127])
def test_half_dtypes(fmt, g, dtype, M):
    K = k_for(fmt)
    qt, W = weights(fmt, g, N_ODD, K)
    x = randn(2, M, K, dtype=dtype)
    ref = reference(x, W)
    for path in paths_for(fmt):
        assert_close(uqr.gemm(x, qt, path=path), ref, dtype, f"{fmt} {dtype} M={M} path={path}")


# (out_heads, in_heads, x heads): direct-head output, head-strided input, and both.
LAYOUTS = [(5, False, 0), (0, True, 4), (7, True, 8)]


@pytest.mark.parametrize("fmt,g", FORMAT_CASES, ids=FORMAT_IDS)
@pytest.mark.parametrize("out_heads,in_heads,h_in", LAYOUTS, ids=["out_heads", "in_heads", "both"])
@pytest.mark.parametrize("M", [1, 7, 33])
def test_head_layouts(fmt, g, out_heads, in_heads, h_in, M):
    K = k_for(fmt)
    qt, W = weights(fmt, g, N_ODD, K)
    dtype = DTYPES[(M + out_heads) % 3]
    lead = (2, 3) if M < 8 else (2,)
    x = randn(*lead, h_in, M, K // h_in, dtype=dtype) if in_heads else randn(*lead, M, K, dtype=dtype)
    ref = reference(x, W, out_heads, in_heads)
    for path in paths_for(fmt):
        y = uqr.gemm(x, qt, out_heads=out_heads, in_heads=in_heads, path=path)
        assert_close(y, ref, dtype, f"{fmt} heads=({out_heads},{in_heads}) M={M} {dtype} path={path}")


@pytest.mark.parametrize("fmt,g", [("q4_0", None), ("mlx4", 64), ("exl3", None), ("ternary", None)],
                         ids=["q4_0", "mlx4-g64", "exl3", "ternary"])
@pytest.mark.parametrize("M", [2047])
def test_tall_M_with_heads(fmt, g, M):
    K = k_for(fmt)
    qt, W = weights(fmt, g, 40, K)
    x = randn(4, M, K // 4, dtype=torch.bfloat16)
    ref = reference(x, W, 8, True)
    for path in paths_for(fmt):
        assert_close(uqr.gemm(x, qt, out_heads=8, in_heads=True, path=path), ref, torch.bfloat16,
                     f"{fmt} M={M} path={path}")


def test_tall_M_fp32_strided_rows():
    """The panel path reading fp32 rows whose stride is larger than K."""
    qt, W = weights("q4_k", None, N_ODD, 512)
    big = randn(2047, 600)
    x = big[:, 40:552]  # row stride 600, not contiguous
    assert_close(uqr.gemm(x, qt), reference(x, W), torch.float32, "strided rows")


def test_one_dim_x_and_empty_rows():
    qt, W = weights("q4_1", None, N_ODD, 384)
    x = randn(384)
    y = uqr.gemm(x, qt)
    assert y.shape == (N_ODD,)
    assert_close(y, reference(x, W), torch.float32, "1-D x")
    empty = uqr.gemm(randn(3, 0, 384), qt, out_heads=5)
    assert empty.shape == (3, 5, 0, 14)


def test_layouts_needing_a_copy_or_not():
    """Leading dims that do not collapse (copied), broadcast rows (stride 0), transposed views."""
    qt, W = weights("q8_0", None, N_ODD, 384)
    base = randn(3, 2, 5, 384, dtype=torch.float16)
    cases = {
        "non-collapsible batch": base.transpose(0, 1),
        "broadcast batch": randn(1, 5, 384).expand(4, 5, 384),
        "broadcast rows": randn(384).expand(6, 384),
        "K not unit stride": randn(384, 9).t(),
        "sliced M": randn(2, 40, 384)[:, 3:37],
    }
    for name, x in cases.items():
        for out_heads in (0, 10):
            assert_close(uqr.gemm(x, qt, out_heads=out_heads), reference(x, W, out_heads), x.dtype, name)


def test_in_heads_from_permuted_projection():
    """The typical attention input: [B, M, H, D] permuted to [B, H, M, D] (no copy needed)."""
    qt, W = weights("q4_0", None, 64, 384)
    x = randn(2, 11, 6, 64).permute(0, 2, 1, 3)
    assert_close(uqr.gemm(x, qt, in_heads=True, out_heads=4), reference(x, W, 4, True), torch.float32,
                 "permuted heads")


def test_op_called_directly_matches_wrapper():
    qt, W = weights("mlx4", 32, N_ODD, 384)
    x = randn(5, 384, dtype=torch.bfloat16)
    y = torch.ops.uqr.gemm(x, qt.data, "mlx4", N_ODD, 384, 32, 0, False, "auto")
    assert_close(y, reference(x, W), torch.bfloat16, "raw op")


@pytest.mark.parametrize("fmt,g", FORMAT_CASES, ids=FORMAT_IDS)
def test_quantizer_output(fmt, g):
    """Blocks from the real quantizer (not only random bytes) through both CPU paths."""
    K = k_for(fmt)
    qt, W = quantized(fmt, g, 24, K)
    for M in (4, 20):
        x = randn(M, K, dtype=torch.bfloat16)
        for path in paths_for(fmt):
            assert_close(uqr.gemm(x, qt, path=path), reference(x, W), torch.bfloat16, f"{fmt} M={M}")
