"""The CUDA C++ tensor-core kernels (csrc/cuda/qmma_small_m.cu, qmma_mid_m.cu) on a real GPU
against float64.

Skipped without a CUDA device or when torch_uqr._C was built without them (CPU torch; CI compiles
the .cu files with nvcc in test_cuda_build.py). y is NaN-poisoned (torch_uqr.ops.poison_outputs) so an
unwritten output fails; N is not a multiple of a CTA's 16 (small-M) or 128 (mid-M) rows, K spans several
stages and an uneven split over the small-M kernel's warps and over the split-K CTAs of 9-16 rows,
rows cover both 8-wide MMA column tiles and partial 32- and 64-row column tiles of the mid-M kernel, fresh random
bytes every run.
"""
from __future__ import annotations

import pytest
import torch

from cuda_test_helpers import (TC_FORMAT_IDS, TC_FORMATS, check_half, check_layouts, fresh_seed, poisoned,
                               require_qmma_kernel)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def _needs_kernel():
    require_qmma_kernel()
    with poisoned():
        yield


# Codes and products are exact, accumulation fp32: the error is y's rounding (bf16 2^-9, fp16 2^-12)
# plus fp32 sums of B + q (B = 128 / 1024) that cancel against the offset term. (exl3, and every
# format in the mid-M kernel, round each weight to x's dtype once: within the same bounds.)
_check = check_half


def _qmma(x, w, fmt, N, K, g=0, out_heads=0, in_heads=False):
    from torch_uqr.backends.cuda.dispatch import run_qmma
    return run_qmma(x, w, fmt, N, K, g, out_heads, in_heads)


@pytest.mark.parametrize("fmt,g", TC_FORMATS, ids=TC_FORMAT_IDS)
def test_qmma_every_m_and_dtype(fmt: str, g: int) -> None:
    from packed_reference import random_packed, reference_dequantize
    # K = 1536: 3 (mlx4 g128: 1.5 -> K 3072) stages of 512 / 6 of 256 over 4 warps (uneven split).
    for N, K in ((200, 1536), (37, 3072), (16, 512)):
        w = random_packed(fmt, N, K, g, seed=fresh_seed(), device="cuda")
        wref = reference_dequantize(w, fmt, N, K, g)
        for dtype in (torch.bfloat16, torch.float16):
            for M in (1, 2, 7, 8, 9, 16):
                x = torch.randn(M, K, device="cuda").to(dtype)
                _check(_qmma(x, w, fmt, N, K, g), x.double() @ wref.t(), dtype, f"{fmt} {N}x{K} M={M} {dtype}")
        x = torch.randn(K, device="cuda", dtype=torch.bfloat16)  # 1-D x
        _check(_qmma(x, w, fmt, N, K, g), x.double() @ wref.t(), torch.bfloat16, f"{fmt} 1-D")


@pytest.mark.parametrize("fmt,g", TC_FORMATS, ids=TC_FORMAT_IDS)
def test_qmma_split_k_rows(fmt: str, g: int) -> None:
    """9-16 rows run the mid-M kernel with K split over CTAs and a reduce kernel: N = 300 gives 3
    row tiles, so K = 4096 splits 8 ways (2 stages each; mlx4 g128 4 ways, 1 stage each), and
    K = 2816 (11 stages of 256) splits unevenly; N = 301 is not a multiple of 4, so the reduce kernel
    stores one output a thread."""
    from packed_reference import random_packed, reference_dequantize
    from torch_uqr.backends.cuda.dispatch import stage_elems
    for N, K in ((300, 4096), (301, 2816 if 2816 % stage_elems(fmt, g) == 0 else 3072)):
        w = random_packed(fmt, N, K, g, seed=fresh_seed(), device="cuda")
        wref = reference_dequantize(w, fmt, N, K, g)
        for M in (9, 12, 16):
            x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
            _check(_qmma(x, w, fmt, N, K, g), x.double() @ wref.t(), torch.bfloat16, f"{fmt} {N}x{K} M={M}")


@pytest.mark.parametrize("splits", [3, 12])
@pytest.mark.parametrize("fmt,g", [f for f in TC_FORMATS if f[0] in ("q4_0", "q4_k", "mlx4", "exl3")],
                         ids=[i for f, i in zip(TC_FORMATS, TC_FORMAT_IDS) if f[0] in ("q4_0", "q4_k", "mlx4", "exl3")])
def test_qmma_split_k_forced_splits(fmt: str, g: int, splits: int) -> None:
    """Split counts the default rule never picks (tuning knob split16_splits): 3 (not a power of
    two: uneven stage ranges at K = 4096) and 12 (1-2 stages a split at K = 4096; at K = 2816, 11
    stages, capped at one stage a split)."""
    from torch_uqr.backends.cuda import tuning
    from torch_uqr.backends.cuda.dispatch import launch_plan
    with tuning.override(split16_splits=splits):
        x = torch.randn(12, 4096, device="cuda", dtype=torch.bfloat16)
        plan = launch_plan("qmma", x, fmt, 300, 4096, g)
        assert plan.mid and plan.streamk_ctas == 0 and plan.splits == min(splits, 4096 // (512 if g == 128 else 256))
        test_qmma_split_k_rows(fmt, g)


@pytest.mark.parametrize("fmt,g", [f for f in TC_FORMATS if f[0] in ("q4_0", "q4_k", "mlx4", "var_affine", "exl3")],
                         ids=[i for f, i in zip(TC_FORMATS, TC_FORMAT_IDS) if f[0] in ("q4_0", "q4_k", "mlx4",
                                                                                         "var_affine", "exl3")])
def test_qmma_streamk_wide(fmt: str, g: int) -> None:
    """9-16 rows deal all tiles' stages out to 2 CTAs an SM (stream-K): N = 9000 is 71 row tiles (the
    last partial), so at K = 4096 (16 stages of 256, 8 of 512) most CTAs' ranges cross from one
    tile into the next and a tile's sum has 4-5 pieces."""
    from packed_reference import random_packed, reference_dequantize
    N, K = 9000, 4096
    w = random_packed(fmt, N, K, g, seed=fresh_seed(), device="cuda")
    wref = reference_dequantize(w, fmt, N, K, g)
    for M in (9, 16):
        x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
        _check(_qmma(x, w, fmt, N, K, g), x.double() @ wref.t(), torch.bfloat16, f"{fmt} {N}x{K} M={M}")


STREAMK_FORCED = {"ctas4": dict(streamk_ctas=4), "ctas7": dict(streamk_ctas=7), "per_sm3": dict(streamk_per_sm=3),
                  "off": dict(streamk=False), "everywhere_wide": dict(streamk=True, streamk_wide_regs=True),
                  "narrow": dict(streamk_wide_regs=False)}


@pytest.mark.parametrize("knobs", list(STREAMK_FORCED), ids=list(STREAMK_FORCED))
@pytest.mark.parametrize("fmt,g", TC_FORMATS, ids=TC_FORMAT_IDS)
def test_qmma_streamk_forced(fmt: str, g: int, knobs: str) -> None:
    """Stream-K grids the default never picks (tuning overrides): 4 and 7 CTAs for N = 300's 3 row
    tiles (ranges of 12 and ~7 stages crossing tiles at K = 4096), 3 an SM, stream-K off (K split in
    equal power-of-two ways), stream-K everywhere with its kernel built for 128 registers, and the
    85-register build that q4_k and exl3 do not take by default (every format for the register
    builds: each has its own there; the others for q4_0, q4_k, mlx4 and exl3)."""
    from torch_uqr.backends.cuda import tuning
    if "wide" not in knobs and knobs != "narrow" and fmt not in ("q4_0", "q4_k", "mlx4", "exl3"):
        pytest.skip("grid overrides: four formats suffice")
    with tuning.override(**STREAMK_FORCED[knobs]):
        test_qmma_split_k_rows(fmt, g)
        test_qmma_streamk_wide(fmt, g)


@pytest.mark.parametrize("fmt", ["q4_0", "q4_k", "mlx4", "var_affine", "ternary"])
def test_qmma_layouts(fmt: str) -> None:
    """Small-M rows (batch * M <= 16) in every layout."""
    check_layouts(_qmma, fmt, 256, ((2, 3), (1, 7), (4, 4), (2, 8)))


def test_qmma_dispatch_and_fallbacks() -> None:
    """gemm's auto path takes the kernel only where it fits; elsewhere Triton answers correctly."""
    import torch_uqr as uqr
    from torch_uqr.backends.cuda import configs, dispatch
    from packed_reference import random_packed, reference_dequantize
    N, K = 96, 512
    w = random_packed("q4_0", N, K, 0, seed=fresh_seed(), device="cuda")
    wref = reference_dequantize(w, "q4_0", N, K)
    x = torch.randn(5, K, device="cuda", dtype=torch.bfloat16)
    assert dispatch.qmma_fits(x, w, "q4_0", K, 0, False, 5)
    assert not dispatch.qmma_fits(x.float(), w, "q4_0", K, 0, False, 5), "fp32 x stays on Triton"
    # auto: small-M kernel to 16 rows; above, the mid-M kernel only for N >= QMMA_MID_MIN_N.
    lim, big = configs.QMMA_MAX_ROWS, configs.QMMA_MID_MIN_N
    assert dispatch.qmma_auto("q4_0", lim, 64) and not dispatch.qmma_auto("q4_0", lim + 1, big - 1)
    assert dispatch.qmma_auto("q4_0", lim + 1, big) and not dispatch.qmma_auto("q4_0", configs.QMMA_MID_MAX_ROWS + 1, big)
    # From 9 rows x is copied in 16-byte pieces: a base 8 bytes off is refused there, taken below.
    x8 = torch.randn(17 * K + 4, device="cuda", dtype=torch.bfloat16)[4:].view(17, K)
    assert not dispatch.qmma_fits(x8, w, "q4_0", K, 0, False, 17)
    assert not dispatch.qmma_fits(x8[:9], w, "q4_0", K, 0, False, 9)
    assert dispatch.qmma_fits(x8[:8], w, "q4_0", K, 0, False, 8)
    with pytest.raises(RuntimeError, match="8-element copies"):
        _qmma(x8, w, "q4_0", N, K)
    w_odd = random_packed("q4_0", N, 288, 0, seed=1, device="cuda")  # K = 288: not a multiple of the stage
    assert not dispatch.qmma_fits(torch.randn(1, 288, device="cuda", dtype=torch.bfloat16), w_odd, "q4_0", 288, 0,
                                  False, 1)
    y = dispatch.gemm_cuda_route(x, w, "q4_0", N, K)
    _check(y, x.double() @ wref.t(), torch.bfloat16, "auto")
    with pytest.raises(RuntimeError, match="unsupported call"):
        _qmma(x.float(), w, "q4_0", N, K)
    xh = torch.randn(4, 5, K // 4, device="cuda", dtype=torch.bfloat16)  # heads of 128 < a 256 stage
    assert not dispatch.qmma_fits(xh, w, "q4_0", K, 0, True, 5)
    _check(dispatch.gemm_cuda_route(xh, w, "q4_0", N, K, in_heads=True),
           xh.transpose(0, 1).reshape(5, K).double() @ wref.t(), torch.bfloat16, "heads of 128 via Triton")
    _check(uqr.gemm(x, uqr.QTensor(w, "q4_0", (N, K))), x.double() @ wref.t(), torch.bfloat16, "public gemm")


MID_M = (17, 33, 64, 100, 129)


@pytest.mark.parametrize("fmt,g", TC_FORMATS, ids=TC_FORMAT_IDS)
def test_qmma_mid_m(fmt: str, g: int) -> None:
    """More than 16 rows: the mid-M kernel, with 32-row column tiles (N = 200, few CTAs) and 64-row
    tiles (N = 16 * 1061: enough 128-row CTAs to fill an H200), partial tiles on both sides."""
    from packed_reference import random_packed, reference_dequantize
    K = 3072 if g == 128 else 1536
    for N, Ms in ((200, MID_M), (16 * 1061, (65, 129))):
        w = random_packed(fmt, N, K, g, seed=fresh_seed(), device="cuda")
        wref = reference_dequantize(w, fmt, N, K, g)
        for dtype in (torch.bfloat16, torch.float16):
            for M in Ms:
                x = torch.randn(M, K, device="cuda").to(dtype)
                _check(_qmma(x, w, fmt, N, K, g), x.double() @ wref.t(), dtype, f"{fmt} {N}x{K} M={M} {dtype}")


@pytest.mark.parametrize("fmt", ["q4_0", "q4_k", "mlx4", "exl3"])
def test_qmma_mid_m_layouts(fmt: str) -> None:
    """Mid-M rows (33, 40, 140: partial column tiles, batch boundaries inside a tile) in every layout."""
    check_layouts(_qmma, fmt, 264, ((3, 11), (1, 40), (2, 70)))
