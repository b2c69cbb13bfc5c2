"""Path "int8" on CPU: x rounded to int8 (one fp32 scale per weight block: 32 elements, or 256 for
the super-block formats; per group for mlx4), integer dot products.

Two references: the float64 product of the SAME int8-rounded x (done here in torch, the rule of
docs/operator.md: scale = amax / 127, codes = round-half-even(x / scale), all-zero span -> 0),
which checks the kernel's integer math to fp32 accumulation error; and the plain float64
product, against which the error may be no more than the activation rounding can cause (half a
step of each x element times |w|, summed: int8_rounding_bound). Outputs are NaN-poisoned.
"""
from __future__ import annotations

import re

import numpy as np

import pytest
import torch

import torch_uqr as uqr
from torch_uqr.formats import table
from gemm_helpers import SEED, assert_close, int8_reference, int8_x_span, randn, reference, rows_of, weights

N_ODD = 70  # crosses the 4-row tiles and the 64-row work units
K = 512     # two q4_k super-blocks, sixteen q4_0 blocks
# Every format with path int8 on CPU (from the format table), a grouped one at each group size.
FORMATS = [(f, g) for f in table.names_with_path("int8", "cpu")
           for g in (table.spec(f).group_sizes if table.spec(f).grouped else (None,))]
FMT_IDS = [f if g is None else f"{f}-g{g}" for f, g in FORMATS]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Against the same-rounded x: fp32 accumulation only, or the rounding of y to fp16/bf16.
SAME_X_TOL = {torch.float32: 1e-5, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -8}


pytestmark = pytest.mark.usefixtures("poisoned_outputs")


def int8_rounding_bound(rows: torch.Tensor, W: torch.Tensor, out_heads: int, span: int) -> torch.Tensor:
    """Per output, the most the int8 rounding of x can move it: sum_k |W[n, k]| * step_k / 2, with
    step = amax / 127 of x's span holding k. (A fixed fraction of max |y| was flaky: with N = 9 and
    M = 1, max |y| itself can be small - CI saw 0.0212 against 0.02.)"""
    xf = rows.double()
    blocks = xf.reshape(-1, span)
    half_step = (blocks.abs().amax(dim=1, keepdim=True) / 127.0 / 2).expand_as(blocks).reshape(xf.shape)
    return reference(half_step, W.abs(), out_heads)


def check(y: torch.Tensor, x: torch.Tensor, W: torch.Tensor, dtype, what: str, out_heads: int = 0,
          in_heads: bool = False, fmt: str = "q4_0", g: int | None = None) -> None:
    rows = rows_of(x, in_heads)
    ref_same = int8_reference(x, W, fmt, out_heads, in_heads, g)
    ref_exact = reference(rows, W, out_heads)
    assert y.shape == ref_exact.shape and y.dtype == dtype, f"{what}: {y.shape} {y.dtype}"
    assert bool(torch.isfinite(y).all()), f"{what}: non-finite output (unwritten element?) seed={SEED}"
    scale = ref_exact.abs().max().item()
    err_same = (y.double() - ref_same).abs().max().item() / scale
    assert err_same < SAME_X_TOL[dtype], f"{what}: vs same-rounded x {err_same:.3g} (seed={SEED})"
    # Against the exact x: the rounding's bound plus what the same-x check already allows.
    excess = (y.double() - ref_exact).abs() - int8_rounding_bound(rows, W, out_heads, int8_x_span(fmt, g))
    worst = excess.max().item() / scale
    assert worst < SAME_X_TOL[dtype], f"{what}: vs exact x, {worst:.3g} beyond the int8 rounding bound (seed={SEED})"
    if dtype == torch.float32:
        # The tight check must tell int8 rounding from none: the two references differ by more.
        gap = (ref_same - ref_exact).abs().max().item() / scale
        assert gap > 10 * SAME_X_TOL[dtype], f"{what}: references too close to discriminate ({gap:.3g})"


@pytest.mark.parametrize("fmt,g", FORMATS, ids=FMT_IDS)
@pytest.mark.parametrize("M", [1, 3, 8, 9])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_int8_matches_same_rounding(fmt, g, M, dtype):
    qt, W = weights(fmt, g, N_ODD, K)
    x = randn(2, M, K, dtype=dtype)  # a batch dim too
    check(uqr.gemm(x, qt, path="int8"), x, W, dtype, f"{fmt} g={g} M={M} {dtype}", fmt=fmt, g=g)


@pytest.mark.parametrize("fmt,g", FORMATS, ids=FMT_IDS)
def test_int8_zero_blocks_and_rows(fmt, g):
    qt, W = weights(fmt, g, N_ODD, K)
    x = randn(3, K) * 4.0
    x[0, 32:64] = 0.0   # one all-zero block: scale 0 for q4_0, no division by zero
    x[0, 256:] = 0.0    # an all-zero span of q4_k's one scale per 256
    x[1] = 0.0          # a whole zero row: y exactly 0
    x[2, :32] = 1e-3    # a tiny block next to large ones: its own scale (q4_0), the span's (q4_k)
    y = uqr.gemm(x, qt, path="int8")
    check(y, x, W, torch.float32, f"{fmt} zero blocks", fmt=fmt, g=g)
    assert bool((y[1] == 0).all())


@pytest.mark.parametrize("fmt,g", FORMATS, ids=FMT_IDS)
@pytest.mark.parametrize("M", [1, 9])
def test_int8_head_layouts(fmt, g, M):
    qt, W = weights(fmt, g, N_ODD, K)
    x = randn(2, 4, M, K // 4)  # [B, H, M, D], read head-strided
    check(uqr.gemm(x, qt, in_heads=True, path="int8"), x, W, torch.float32, f"{fmt} in_heads", in_heads=True,
          fmt=fmt, g=g)
    x2 = randn(2, M, K, dtype=torch.bfloat16)
    check(uqr.gemm(x2, qt, out_heads=7, path="int8"), x2, W, torch.bfloat16, f"{fmt} out_heads", out_heads=7,
          fmt=fmt, g=g)


def test_int8_auto_is_unchanged():
    qt, W = weights("q4_0", None, N_ODD, K)
    x = randn(2, K)
    assert_close(uqr.gemm(x, qt), reference(x, W), torch.float32, "auto")  # fp32 accuracy, not int8's


def test_int8_errors():
    qt5, _ = weights("q5_k", None, 48, 256)
    # Python and C++ list the same formats, both from the format table.
    int8 = table.names_with_path("int8", "cpu")
    assert "q4_k" in int8 and "q6_k" in int8 and "q5_k" not in int8
    listed = re.escape(table.quoted_names(int8))
    with pytest.raises(ValueError, match=f"path='int8' .*supports fmt {listed}, not 'q5_k'"):
        uqr.gemm(randn(2, 256), qt5, path="int8")
    with pytest.raises(ValueError, match=f"path='int8' .*supports fmt {listed}, not 'q5_k'"):
        torch.ops.uqr.gemm(randn(2, 256), qt5.data, "q5_k", 48, 256, 0, 0, False, "int8")
    q4, _ = weights("q4_0", None, 48, 256)
    with pytest.raises(ValueError, match="path='int8' for fmt 'q4_0' exists only on the cpu and cuda backends.*metal-emu"):
        uqr.gemm(randn(2, 256), q4, path="int8", backend="metal-emu")
    meta_q4 = uqr.QTensor(q4.data.to("meta"), "q4_0", (48, 256))
    with pytest.raises(ValueError, match="path='int8' for fmt 'q4_0' exists only on the cpu and cuda backends.*'meta'"):
        uqr.gemm(torch.empty(2, 256, device="meta"), meta_q4, path="int8")
    from torch_uqr.backends import metal as metal_emu
    with pytest.raises(ValueError, match="path='int8'.*no kernels on the metal backend"):
        metal_emu.gemm(randn(2, 256), q4.data, "q4_0", 48, 256, 0, 0, False, "int8")


def test_int8_fake_kernel():
    qt = weights("q4_k", None, 32, 256)[0]
    torch.library.opcheck(torch.ops.uqr.gemm.default, (randn(3, 5, 256), qt.data, "q4_k", 32, 256, 0, 4, False, "int8"),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


@pytest.mark.parametrize("K_odd", [32, 96, 2144])
def test_int8_q4_0_odd_block_count(K_odd):
    # The kernel takes q4_0 blocks in pairs; an odd count leaves one for the single-block step.
    # 2144 at M = 9: several L1-sized K passes (1024 at 8 rows), the odd block in the last one.
    qt, W = weights("q4_0", None, N_ODD, K_odd)
    for M in (1, 9):
        x = randn(M, K_odd)
        check(uqr.gemm(x, qt, path="int8"), x, W, torch.float32, f"q4_0 K={K_odd} M={M}")


@pytest.mark.parametrize("K_tail", [128, 160, 224, 4128])
def test_int8_q4_0_quads_and_tail(K_tail):
    # The kernel takes q4_0 blocks four at a time (x stored per quad); 1-3 blocks past the last
    # whole quad go through the single-block step: 4 blocks (no tail), 5, 7, and 129 at K = 4128
    # (several K passes at M = 9, the tail in the last one).
    qt, W = weights("q4_0", None, N_ODD, K_tail)
    for M in range(1, 10):
        x = randn(M, K_tail)
        check(uqr.gemm(x, qt, path="int8"), x, W, torch.float32, f"q4_0 K={K_tail} M={M}")


@pytest.mark.parametrize("g,K", [(32, 608), (64, 576), (32, 4128), (128, 384), (64, 64)])
def test_int8_mlx4_packs_and_tail(g, K):
    # The kernel takes mlx4 128 elements (4, 2 or 1 groups) at a time (x stored per 128 as evens then
    # odds); groups past the last whole 128 go through the per-group step: 3 groups (g = 32, K =
    # 608), 1 (g = 64, K = 576), 1 after several K passes (4128 at M = 9), none, and only the tail.
    qt, W = weights("mlx4", g, N_ODD, K)
    for M in (1, 2, 5, 9):
        x = randn(M, K)
        check(uqr.gemm(x, qt, path="int8"), x, W, torch.float32, f"mlx4 g={g} K={K} M={M}", fmt="mlx4", g=g)


@pytest.mark.parametrize("K_k", [256, 768])
@pytest.mark.parametrize("N", [9, 67])
def test_int8_q4_k_every_row_count(K_k, N):
    # x's sub-blocks are stored per super-block as 0 2 1 3 4 6 5 7 (one 512-bit load of codes
    # covers four sub-blocks): every M from 1 to 9 (one and two passes of 8 rows), N with whole
    # 4-row tiles and a single-row rest, one and three super-blocks. (Not N = 1: with one output
    # per row the bound against the exact product, relative to max |y|, is not meaningful.)
    qt, W = weights("q4_k", None, N, K_k)
    for M in range(1, 10):
        x = randn(2, M, K_k)
        check(uqr.gemm(x, qt, path="int8"), x, W, torch.float32, f"q4_k N={N} K={K_k} M={M}", fmt="q4_k")


BLOCK_FORMATS = ["var_affine", "exl3"]  # 256-element blocks of d * (integer) + bias * (integer)


@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
@pytest.mark.parametrize("K_b", [256, 2304])
@pytest.mark.parametrize("N", [9, 67])
def test_int8_block_formats_row_counts(fmt, K_b, N):
    # M = 1 (4-row tiles), 7 and 33 (8-row groups and a single-row rest), N with whole tiles and a
    # rest, one block and nine (several L1-sized K passes at 8 rows, the last one short).
    qt, W = weights(fmt, None, N, K_b)
    for M in (1, 2, 7, 33):
        x = randn(M, K_b)
        check(uqr.gemm(x, qt, path="int8"), x, W, torch.float32, f"{fmt} N={N} K={K_b} M={M}", fmt=fmt)


@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
def test_int8_block_formats_round_x(fmt):
    # Path int8 really rounds x: y sits on the product of the int8-rounded x (to fp32 sums) and
    # clearly off the exact product, by about what the rounding moves it.
    qt, W = weights(fmt, None, N_ODD, K)
    x = randn(7, K)
    y = uqr.gemm(x, qt, path="int8").double()
    scale = reference(x, W).abs().max().item()
    off_exact = (y - reference(x, W)).abs().max().item() / scale
    off_same = (y - int8_reference(x, W, fmt)).abs().max().item() / scale
    assert off_same < 1e-5 and off_exact > 1e-4 and off_exact > 100 * off_same, \
        f"{fmt}: {off_same:.3g} from the int8-rounded product, {off_exact:.3g} from the exact one (seed={SEED})"
    assert not torch.equal(uqr.gemm(x, qt, path="int8"), uqr.gemm(x, qt)), f"{fmt}: int8 equals the exact path"


def _extreme_block(fmt):
    """One block whose integer sums are the largest the format allows (against x codes of -127):
    exl3 P = R = -128 with s_j = r_j = 255 (A = 2122383360, just under 2^31); var_affine five-bit
    codes of 31 where the budget allows (depths 5 5 5 5 3 3 3 3) with s_j = b_j = 255."""
    if fmt == "exl3":
        b = np.zeros(144, np.uint8)
        b[0:4] = np.frombuffer(np.float16([2.0 ** -10, 0.5]).tobytes(), np.uint8)
        b[4:20] = 255
        b[20:36] = 0x80  # codebook: int8 -128 everywhere
        b[48:] = np.arange(96, dtype=np.uint8) * 37  # any indices pick -128
        return b
    b = np.zeros(160, np.uint8)
    b[0:4] = np.frombuffer(np.float16([2.0 ** -10, -0.25]).tobytes(), np.uint8)
    b[4:20] = 255
    b[20:28] = [5, 5, 5, 5, 3, 3, 3, 3]
    b[32:] = 0xFF  # 4 * 20 + 4 * 12 = 128 bytes of codes, all ones
    return b


@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
def test_int8_block_formats_extreme_sums(fmt):
    # The int32 sums at their largest (no wrap-around: a wrapped sum would flip y's sign).
    blk = _extreme_block(fmt)
    nb = 3
    qt = uqr.QTensor.from_bytes(np.tile(blk, (5, nb)), fmt, (5, 256 * nb))
    W = uqr.dequantize(qt).double()
    for M in (1, 3):
        x = -torch.ones(M, 256 * nb)
        x[:, 1::2] *= 0.999  # codes -127 and -126.873 -> -127: still the extreme, not exactly -1
        y = uqr.gemm(x, qt, path="int8").double()
        ref = int8_reference(x, W, fmt)
        err = (y - ref).abs().max().item() / ref.abs().max().item()
        assert err < 1e-6, f"{fmt} extreme M={M}: {err:.3g} (y {y[0, 0].item()}, ref {ref[0, 0].item()})"


@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
def test_int8_block_formats_reject_invalid_blocks(fmt):
    # The bytes are checked once, when the QTensor is built (the kernels trust them), so a corrupted
    # block never reaches path int8, as it never reaches the others.
    qt, W = weights(fmt, None, 4, 512)
    x = randn(2, 512)
    check(uqr.gemm(x, qt, path="int8"), x, W, torch.float32, f"{fmt} valid", fmt=fmt)
    bad = qt.data.numpy().copy()
    if fmt == "var_affine":
        bad[2, 160 + 20 + 3] = 6  # row 2, block 1: a sub-block depth outside {3, 4, 5}
        message = "bit depth outside"
    else:
        bad[2, 144 + 40] = 1      # row 2, block 1: non-zero _pad
        message = "non-zero _pad"
    with pytest.raises(ValueError, match=message):
        uqr.QTensor.from_bytes(bad, fmt, (4, 512))


# The GGUF block formats whose codes the int8 kernel takes as 32 bytes per step (q6_k: with one
# int8 scale per 16 codes inside each 256-element super-block).
GGUF_BYTE_FORMATS = ["q4_1", "q5_0", "q5_1", "q8_0", "q6_k"]


@pytest.mark.parametrize("fmt", GGUF_BYTE_FORMATS)
def test_int8_gguf_blocks_row_counts(fmt):
    # M = 1 (4-row tiles) to 9 and 33, N with whole tiles and a rest, one block and enough blocks
    # for several L1-sized K passes (the last one short).
    block = table.spec(fmt).block
    for K_b in (block, 4096 + 4 * block):
        qt, W = weights(fmt, None, 67, K_b)
        for M in (1, 2, 5, 9, 33):
            x = randn(M, K_b)
            check(uqr.gemm(x, qt, path="int8"), x, W, torch.float32, f"{fmt} K={K_b} M={M}", fmt=fmt)


def _extreme_gguf_block(fmt: str) -> np.ndarray:
    """One block whose codes and scales are the largest in magnitude the format has: q8_0 codes of
    -128; q6_k codes of 0 (q - 32 = -32) with scales of -128; q5_x / q4_1 codes of 31 / 15."""
    spec = table.spec(fmt)
    b = np.zeros(spec.block_bytes, np.uint8)
    d = np.frombuffer(np.float16([2.0 ** -10]).tobytes(), np.uint8)
    if fmt == "q8_0":
        b[0:2] = d
        b[2:] = 0x80
    elif fmt == "q6_k":
        b[192:208] = 0x80   # int8 scales of -128, codes 0 (ql = qh = 0)
        b[208:210] = d
    else:
        b[:] = 0xFF          # every code at its top (q4_1 15, q5_x 31)
        b[0:2] = d
        if fmt in ("q4_1", "q5_1"):
            b[2:4] = np.frombuffer(np.float16([-0.25]).tobytes(), np.uint8)
    return b


@pytest.mark.parametrize("fmt", GGUF_BYTE_FORMATS)
def test_int8_gguf_blocks_extreme_sums(fmt):
    # The integer sums at their largest against x codes of -127 (no int16 saturation in the pair
    # sums, no int32 wrap-around: either would move y far from the reference).
    spec = table.spec(fmt)
    nb = 3
    qt = uqr.QTensor.from_bytes(np.tile(_extreme_gguf_block(fmt), (5, nb)), fmt, (5, spec.block * nb))
    W = uqr.dequantize(qt).double()
    for M in (1, 3):
        x = -torch.ones(M, spec.block * nb)
        x[:, 1::2] *= 0.999
        y = uqr.gemm(x, qt, path="int8").double()
        ref = int8_reference(x, W, fmt)
        err = (y - ref).abs().max().item() / ref.abs().max().item()
        assert err < 1e-6, f"{fmt} extreme M={M}: {err:.3g} (y {y[0, 0].item()}, ref {ref[0, 0].item()})"


def test_set_path_int8_on_a_model():
    # nn.set_path puts the layers whose format has path int8 on it, keeps the others exact, and
    # "auto" puts every layer back.
    from torch import nn

    from torch_uqr.nn import QuantLinear, set_path

    model = nn.Sequential(QuantLinear(weights("q4_1", None, 256, 256)[0]),
                          QuantLinear(weights("q5_k", None, 256, 256)[0]),
                          QuantLinear(weights("q6_k", None, 32, 256)[0]))
    x = randn(3, 256)
    exact = model(x)
    assert set_path(model, "int8") == {"set": 2, "kept": 1}
    assert [m.path for m in model] == ["int8", None, "int8"]
    y = model(x)
    h = uqr.gemm(x, model[0].qtensor, path="int8")
    h = uqr.gemm(h, model[1].qtensor)
    torch.testing.assert_close(y, uqr.gemm(h, model[2].qtensor, path="int8"), rtol=0, atol=0)
    assert not torch.equal(y, exact)
    assert set_path(model, "auto") == {"set": 3, "kept": 0}
    torch.testing.assert_close(model(x), exact, rtol=0, atol=0)
    with pytest.raises(ValueError, match="path: expected"):
        set_path(model, "fast")


def test_set_path_max_rows_keeps_prefill_exact():
    # With max_rows the path serves calls of up to that many rows (x's rows over every batch dim)
    # and larger calls take "auto".
    from torch_uqr.nn import QuantLinear, set_path

    layer = QuantLinear(weights("q4_1", None, 64, 256)[0])
    assert set_path(layer, "int8", max_rows=2) == {"set": 1, "kept": 0}
    qt = layer.qtensor
    small, big = randn(1, 2, 256), randn(3, 256)
    torch.testing.assert_close(layer(small), uqr.gemm(small, qt, path="int8"), rtol=0, atol=0)
    torch.testing.assert_close(layer(big), uqr.gemm(big, qt), rtol=0, atol=0)
    assert not torch.equal(layer(small), uqr.gemm(small, qt))
    with pytest.raises(ValueError, match="max_rows"):
        set_path(layer, "int8", max_rows=0)
