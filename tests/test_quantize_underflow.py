"""Quantizers report rows whose error is due to fp16 scale underflow (QuantizationWarning)."""
import warnings

import pytest
import torch

import torch_uqr as uqr


def _quantize(w, fmt, **kw):
    """(QTensor, the QuantizationWarnings raised)."""
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        qt = uqr.quantize(w, fmt, **kw)
    return qt, [r.message for r in rec if isinstance(r.message, uqr.QuantizationWarning)]


def _rel_rows(qt, w):
    w = w.double()
    return (uqr.dequantize(qt).double() - w).norm(dim=1) / w.norm(dim=1)


@pytest.mark.parametrize("fmt", uqr.formats())
def test_normal_weights_are_not_reported_and_bytes_unchanged(fmt):
    gen = torch.Generator().manual_seed(5)
    for std in (0.005, 0.02, 0.3):
        w = torch.randn(48, 512, generator=gen) * std
        qt, warned = _quantize(w, fmt)
        assert not warned, (std, str(warned[0]))
        # the check never alters what the quantizer writes
        from torch_uqr.formats import get
        assert torch.equal(qt.data, get(fmt).quantize(w, qt.group_size))


@pytest.mark.parametrize("fmt", uqr.formats())
def test_tiny_weights_either_keep_their_accuracy_or_are_reported(fmt):
    """At std 1e-7 every format is far below fp16's normal range: a row whose error exceeds what
    the same row gets at a normal magnitude is named, and the others are fine."""
    gen = torch.Generator().manual_seed(6)
    w = torch.randn(16, 512, generator=gen) * 1e-7
    qt, warned = _quantize(w, fmt)
    normal = _rel_rows(uqr.quantize(w * 2**24, fmt), w * 2**24)
    err = _rel_rows(qt, w)
    worse = set(torch.nonzero(err > 1.25 * normal + 0.01).reshape(-1).tolist())
    reported = set(warned[0].rows) if warned else set()
    assert worse <= reported, (worse, reported)
    # A ternary row at 1e-7 still has ~7 bits of scale, and mxfp4's power-of-two scale reaches
    # 2^-127: nothing to report for either. mlx2's and mlx3's few levels put their step near
    # 1e-7, where a subnormal fp16 scale costs little next to their own error (mlx2: relative
    # error ~0.37 against ~0.35, mlx3 ~0.19-0.27 against ~0.17): only some rows, or none, cross the
    # threshold, and the check above (every clearly worse row is named) is what holds for them.
    if fmt not in ("ternary", "mxfp4", "mlx2", "mlx3"):
        assert reported == set(range(16)) and "fp16" in str(warned[0])
    elif fmt == "mxfp4":
        assert not warned


@pytest.mark.parametrize("fmt,std", [("exl3", 1e-4), ("exl3", 3e-4), ("var_affine", 1e-5)])
def test_issue_cases_are_reported(fmt, std):
    w = torch.randn(8, 512, generator=torch.Generator().manual_seed(7)) * std
    qt, warned = _quantize(w, fmt)
    assert len(warned) == 1 and len(warned[0].rows) >= 6, warned
    assert f"{fmt}:" in str(warned[0]) and "rows" in str(warned[0])


def test_q8_0_tiny_rows_next_to_large_rows_are_named():
    w = torch.randn(6, 64, generator=torch.Generator().manual_seed(8))
    w[1] *= 1e-6
    w[4] *= 1e-6
    w[[0, 2, 3, 5]] *= 1e3
    qt, warned = _quantize(w, "q8_0")
    assert len(warned) == 1 and warned[0].rows == [1, 4]
    assert "rows 1, 4" in str(warned[0])
    assert torch.equal(uqr.dequantize(qt)[[1, 4]], torch.zeros(2, 64))  # what the warning is about


def test_bitnet_scales_outside_fp16_normal_range_are_reported():
    packed = torch.full((2, 64), 0b10011001, dtype=torch.uint8)  # codes 1, 2, 1, 2: trits 0, +1, 0, +1
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        uqr.from_bitnet(packed, torch.tensor([1.0]), 8)
        uqr.from_bitnet(packed, torch.tensor([1e-6] * 4 + [1.0] * 4), 8, convention="multiply")
        uqr.from_bitnet(packed, torch.tensor([1e9]), 8)  # divide: 1e-9 rounds to 0
    msgs = [r.message for r in rec if isinstance(r.message, uqr.QuantizationWarning)]
    assert len(msgs) == 2
    assert msgs[0].rows == [0, 1, 2, 3] and "below fp16's normal range" in str(msgs[0])
    assert msgs[1].rows == list(range(8)) and "rounds to 0" in str(msgs[1])
