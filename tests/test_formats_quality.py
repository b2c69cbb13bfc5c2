"""The quantizers that search: each must earn its format's extra machinery."""
import itertools

import pytest
import torch

import torch_uqr as uqr
from torch_uqr.formats import var_affine
from torch_uqr.formats._fit import affine_codes, fit_affine


def uniform3(w: torch.Tensor, search: bool) -> torch.Tensor:
    """Uniform 3-bit codes per 32 weights with float (unrounded) scale and offset: min/max or searched."""
    x = w.reshape(-1, 32)
    if search:
        fit = fit_affine(x, 7)
        scale, offset = fit.scale, fit.offset
    else:
        offset = x.min(1).values
        scale = (x.max(1).values - offset) / 7
    q = affine_codes(x, scale, offset, 7)
    return (q * scale[:, None] + offset[:, None]).reshape(w.shape)


def test_exl3_beats_uniform_3bit(gen, rel_rms):
    """Same 3-bit index per weight: the fitted codebooks must beat uniform levels."""
    gauss = torch.randn(96, 1024, generator=gen)
    heavy = torch.distributions.StudentT(3.0).sample((96, 1024))
    for w, margin_mm, margin_ls in ((gauss, 0.92, 1.0), (heavy, 0.75, 0.9)):
        err = rel_rms(uqr.dequantize(uqr.quantize(w, "exl3")), w)
        assert err < margin_mm * rel_rms(uniform3(w, search=False), w)
        assert err < margin_ls * rel_rms(uniform3(w, search=True), w)


def test_var_affine_greedy_allocation_is_optimal_for_diminishing_returns(gen):
    """With convex error curves, one bit at a time to the largest drop is the exact optimum."""
    n = 24
    e3 = torch.rand(n, 8, generator=gen) * 10 + 5
    drop1 = torch.rand(n, 8, generator=gen) * e3 * 0.8
    drop2 = torch.rand(n, 8, generator=gen) * drop1          # second bit saves less than the first
    errors = torch.stack([e3, e3 - drop1, e3 - drop1 - drop2], 2)
    depth = var_affine.allocate_depths(errors)
    assert int(depth.sum(1).max()) <= 32 and int(depth.min()) >= 3 and int(depth.max()) <= 5
    combos = torch.tensor([c for c in itertools.product(range(3), repeat=8) if sum(c) <= 8])
    every = torch.stack([errors[:, j, combos[:, j]] for j in range(8)], 2).sum(2)   # [n, combos]
    got = torch.gather(errors, 2, (depth - 3).unsqueeze(2)).sum((1, 2))
    torch.testing.assert_close(got, every.min(1).values, rtol=1e-6, atol=0)


def test_var_affine_spends_bits_where_they_pay(gen, rel_rms):
    """Sub-blocks with wide spread get the deep codes; and the mix beats a flat 4 bits per weight."""
    w = torch.randn(16, 256, generator=gen)
    w[:, 64:96] *= 8       # sub-block 2 is loud
    w[:, 160:192] *= 0.01  # sub-block 5 is nearly silent
    qt = uqr.quantize(w, "var_affine")
    depth = qt.data.reshape(-1, 160)[:, 20:28].long() & 7
    assert (depth.sum(1) == 32).all()
    assert (depth[:, 2] == 5).all() and (depth[:, 5] == 3).all()
    err = rel_rms(uqr.dequantize(qt), w)
    flat4 = torch.cat([uniform_bits(w[:, i:i + 32], 15) for i in range(0, 256, 32)], 1)
    assert err < 0.8 * rel_rms(flat4, w)


def uniform_bits(w, qmax):
    fit = fit_affine(w.reshape(-1, 32), qmax, offset_le_zero=True)
    q = affine_codes(w.reshape(-1, 32), fit.scale, fit.offset, qmax)
    return (q * fit.scale[:, None] + fit.offset[:, None]).reshape(w.shape)


def test_ternary_quantizer_is_least_squares_optimal_per_block(gen):
    """Against brute force over every threshold, for one 32-weight block at a time."""
    w = torch.randn(8, 32, generator=gen)
    y = uqr.dequantize(uqr.quantize(w, "ternary"))
    for row in range(8):
        x = w[row].double()
        mags = x.abs().sort(descending=True).values
        best = min(float((x ** 2).sum() - mags[:n].sum() ** 2 / n) for n in range(1, 33))
        got = float(((y[row].double() - x) ** 2).sum())
        assert got <= best * (1 + 2e-3) + 1e-12   # only fp16 rounding of d may cost


@pytest.mark.parametrize("fmt", uqr.formats())
def test_quantizers_reach_expected_accuracy(fmt, gen, rel_rms):
    """Rough ceilings on Gaussian data (guards against a silently broken search or packing)."""
    ceiling = {"q4_0": 0.095, "q4_1": 0.085, "q8_0": 0.006, "q4_k": 0.075, "mlx4": 0.085,
               "var_affine": 0.075, "exl3": 0.15, "ternary": 0.45, "q5_0": 0.05, "q5_1": 0.045, "q6_k": 0.022,
               "q5_k": 0.043, "iq4_nl": 0.085, "iq4_xs": 0.085,
               "q3_k": 0.19, "q2_k": 0.36, "mxfp4": 0.125,
               "mlx2": 0.38, "mlx3": 0.19, "mlx5": 0.045, "mlx6": 0.023, "mlx8": 0.006}[fmt]
    w = torch.randn(64, 512, generator=gen) * 0.03
    assert rel_rms(uqr.dequantize(uqr.quantize(w, fmt)), w) < ceiling
