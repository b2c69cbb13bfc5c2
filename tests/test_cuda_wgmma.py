"""The Hopper wgmma kernel (csrc/cuda/qmma_wgmma.cu, op uqr::_wgmma_cuda) on a real sm_90 GPU
against float64.

Skipped without an sm_90 device or without the op (CPU torch; CI compiles the .cu files with nvcc
in test_cuda_build.py). y is NaN-poisoned (torch_uqr.ops.poison_outputs) so an unwritten output fails. N is not a
multiple of a CTA's 128 weight rows, K spans several stages, rows cover partial 64- and 128-row
column tiles (and the odd counts of the brief: 1, 7, 33, 127, 129), fresh random bytes every run.
"""
from __future__ import annotations

import pytest
import torch

from cuda_test_helpers import TC_FORMAT_IDS, TC_FORMATS, check_half, check_layouts, fresh_seed

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                reason="needs an sm_90 GPU")


@pytest.fixture(autouse=True)
def _needs_kernel():
    ops = pytest.importorskip("torch_uqr.ops")
    from torch_uqr.backends.cuda.dispatch import wgmma_available
    if not ops.op_available() or not wgmma_available(torch.cuda.current_device()):
        pytest.skip("torch_uqr._C was built without the wgmma kernel")
    from cuda_test_helpers import poisoned
    with poisoned():
        yield


def _wgmma(x, w, fmt, N, K, g=0, out_heads=0, in_heads=False):
    from torch_uqr.backends.cuda.dispatch import run_wgmma
    return run_wgmma(x, w, fmt, N, K, g, out_heads, in_heads)


_check = check_half  # weights rounded to x's dtype once (as the mid-M kernel), fp32 accumulation


@pytest.mark.parametrize("fmt,g", TC_FORMATS, ids=TC_FORMAT_IDS)
def test_wgmma_every_format(fmt: str, g: int) -> None:
    from packed_reference import random_packed, reference_dequantize
    K = 3072 if g == 128 else 1536
    for N, Ms in ((200, (1, 7, 33, 64, 65, 127, 129)), (16 * 131, (17, 256, 300))):
        w = random_packed(fmt, N, K, g, seed=fresh_seed(), device="cuda")
        wref = reference_dequantize(w, fmt, N, K, g)
        for dtype in (torch.bfloat16, torch.float16):
            for M in Ms:
                x = torch.randn(M, K, device="cuda").to(dtype)
                _check(_wgmma(x, w, fmt, N, K, g), x.double() @ wref.t(), dtype, f"{fmt} {N}x{K} M={M} {dtype}")


@pytest.mark.parametrize("fmt", ["q4_0", "q4_k", "mlx4", "exl3", "ternary"])
def test_wgmma_layouts(fmt: str) -> None:
    """Batched x, head-strided x (gathered by the pre-pass) and direct-head y."""
    check_layouts(_wgmma, fmt, 264, ((3, 11), (1, 40), (2, 70)))


def test_wgmma_large_m_and_errors() -> None:
    """A 2047-row call on a full-size shape, the dispatcher's kernel override, and refusals."""
    from torch_uqr.backends.cuda.dispatch import gemm_cuda_route
    from packed_reference import random_packed, reference_dequantize
    N, K = 4096, 4096
    w = random_packed("q4_k", N, K, 0, seed=fresh_seed(), device="cuda")
    wref = reference_dequantize(w, "q4_k", N, K)
    x = torch.randn(2047, K, device="cuda", dtype=torch.bfloat16)
    _check(gemm_cuda_route(x, w, "q4_k", N, K, kernel="wgmma"), x.double() @ wref.t(), torch.bfloat16, "M=2047")
    with pytest.raises(RuntimeError, match="unsupported call"):
        _wgmma(x.float(), w, "q4_k", N, K)
    x8 = torch.randn(40 * K + 4, device="cuda", dtype=torch.bfloat16)[4:].view(40, K)
    with pytest.raises(RuntimeError, match="8-element copies"):
        _wgmma(x8, w, "q4_k", N, K)


@pytest.mark.parametrize("fmt,g", [("q4_0", 0), ("q4_k", 0), ("mlx4", 128), ("exl3", 0)], ids=["q4_0", "q4_k", "mlx4_128", "exl3"])
def test_wgmma_split_k(fmt: str, g: int) -> None:
    """Few weight rows and a long K: the kernel splits K over CTAs and sums fp32 partials, into a
    plain and a direct-head y, from a plain and a head-strided x."""
    from packed_reference import random_packed, reference_dequantize
    N, K, H = 264, 4096, 4
    w = random_packed(fmt, N, K, g, seed=fresh_seed(), device="cuda")
    wref = reference_dequantize(w, fmt, N, K, g)
    for M in (1, 33, 129):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        ref = x.double() @ wref.t()
        _check(_wgmma(x, w, fmt, N, K, g), ref, torch.bfloat16, f"{fmt} split M={M}")
        _check(_wgmma(x, w, fmt, N, K, g, H), ref.reshape(M, H, N // H).transpose(0, 1), torch.bfloat16,
               f"{fmt} split y heads M={M}")
        xh = x.reshape(M, 2, K // 2).transpose(0, 1).contiguous()
        _check(_wgmma(xh, w, fmt, N, K, g, 0, True), ref, torch.bfloat16, f"{fmt} split x heads M={M}")


WGMMA_FORCED = {"bm64": dict(wgmma_bm=64), "bm128": dict(wgmma_bm=128), "ctas1": dict(wgmma_ctas=1),
                "ctas2": dict(wgmma_ctas=2), "no_pdl": dict(pdl=False)}


@pytest.mark.parametrize("knobs", list(WGMMA_FORCED), ids=list(WGMMA_FORCED))
@pytest.mark.parametrize("fmt,g", [("q4_0", 0), ("q8_0", 0), ("mlx4", 128), ("exl3", 0)],
                         ids=["q4_0", "q8_0", "mlx4_128", "exl3"])
def test_wgmma_forced_config(fmt: str, g: int, knobs: str) -> None:
    """Column tiles and CTAs an SM the default does not pick for these rows (tuning overrides; a
    build whose stages do not fit keeps the default's), and the dependent launch off."""
    from torch_uqr.backends.cuda import tuning
    from torch_uqr.backends.cuda.dispatch import launch_plan
    from packed_reference import random_packed, reference_dequantize
    N, K = 264, 3072
    w = random_packed(fmt, N, K, g, seed=fresh_seed(), device="cuda")
    wref = reference_dequantize(w, fmt, N, K, g)
    with tuning.override(**WGMMA_FORCED[knobs]):
        for M in (7, 40, 100):
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            plan = launch_plan("wgmma", x, fmt, N, K, g)
            if knobs == "bm64":
                assert plan.bm == 64
            if knobs == "ctas1":
                assert plan.ctas == 1
            _check(_wgmma(x, w, fmt, N, K, g), x.double() @ wref.t(), torch.bfloat16, f"{fmt} {knobs} M={M} {plan}")


@pytest.mark.parametrize("fmt,g", TC_FORMATS, ids=TC_FORMAT_IDS)
def test_wgmma_every_build_the_extension_reports(fmt: str, g: int) -> None:
    """The plan takes its tile builds from the extension (uqr::_cuda_residency "wgmma"): each build
    it reports runs and matches float64, each it reports as not fitting is refused by the op, and
    the plans path auto and the overrides make for this format use reported builds only."""
    from torch_uqr.backends.cuda import tuning
    from torch_uqr.backends.cuda.dispatch import WGMMA_BUILDS, WgmmaPlan, launch_plan
    from packed_reference import random_packed, reference_dequantize
    builds = torch.ops.uqr._cuda_residency("wgmma", fmt, g, True, 1, 0, torch.device("cuda"))
    assert len(builds) == len(WGMMA_BUILDS) and builds[1] == 1, builds  # BM 64, one CTA: every format
    N, K = 264, 3072
    w = random_packed(fmt, N, K, g, seed=fresh_seed(), device="cuda")
    wref = reference_dequantize(w, fmt, N, K, g)
    x = torch.randn(40, K, device="cuda", dtype=torch.bfloat16)
    ref = x.double() @ wref.t()
    for (bm, ctas), fit in zip(WGMMA_BUILDS, builds):
        plan = WgmmaPlan(bm=bm, ctas=ctas, splits=1, pdl=True)
        if fit:
            assert fit == ctas
            _check(_wgmma_plan(x, w, fmt, N, K, g, plan), ref, torch.bfloat16, f"{fmt} {plan}")
        else:
            with pytest.raises(RuntimeError, match="do not fit|does not fit"):
                _wgmma_plan(x, w, fmt, N, K, g, plan)
    for knobs in (dict(), dict(wgmma_bm=128), dict(wgmma_ctas=2)):
        with tuning.override(**knobs):
            for M in (7, 40, 100, 200):
                plan = launch_plan("wgmma", x[:1].expand(M, K), fmt, N, K, g)
                assert builds[WGMMA_BUILDS.index((plan.bm, plan.ctas))], (knobs, M, plan)


def _wgmma_plan(x, w, fmt, N, K, g, plan):
    from torch_uqr.backends.cuda.dispatch import run_wgmma
    return run_wgmma(x, w, fmt, N, K, g, plan=plan)
