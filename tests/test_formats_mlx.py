"""mlx4 against MLX: lossless import/export, dequantize and quantized_matmul, g = 32/64/128.

Two sources of MLX outputs: the committed golden file (always; made by
tests/golden/make_mlx_golden.py) and live ``mlx.core`` with fresh data (skipped, with the reason,
where mlx cannot be installed).
"""
import importlib.util
import os

import numpy as np
import pytest
import torch

import torch_uqr as uqr

GOLDEN_DIR = os.path.join(os.path.dirname(__file__), "golden")
GROUP_SIZES = (32, 64, 128)


def load_maker():
    spec = importlib.util.spec_from_file_location("make_mlx_golden", os.path.join(GOLDEN_DIR, "make_mlx_golden.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_against_mlx(ref: dict, g: int) -> None:
    wq, scales, biases = ref[f"g{g}_wq"], ref[f"g{g}_scales"], ref[f"g{g}_biases"]
    assert (scales < 0).any() and (scales > 0).any(), "MLX's quantizer should give both signs"
    qt = uqr.from_mlx(wq, scales, biases, group_size=g)
    assert qt.fmt == "mlx4" and qt.group_size == g and qt.shape == (wq.shape[0], wq.shape[1] * 8)
    # the repacked blocks are valid blocks
    uqr.QTensor.from_bytes(qt.data, "mlx4", qt.shape, group_size=g)
    ours = uqr.dequantize(qt).numpy()
    # MLX with float32 scales computes scale*q + bias in float32: bit-identical to our decode.
    np.testing.assert_array_equal(ours, ref[f"g{g}_dequant32"])
    # With fp16 scales MLX rounds scale*q to half, then adds the bias in half: same codes, same
    # fields, so emulating those two roundings on our nibbles must reproduce it exactly.
    q = ((wq[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15).reshape(wq.shape[0], -1)
    s16, b16 = np.repeat(scales, g, 1), np.repeat(biases, g, 1)
    np.testing.assert_array_equal((s16 * q.astype(np.float16)) + b16, ref[f"g{g}_dequant16"])
    np.testing.assert_array_equal(q * s16.astype(np.float32) + b16.astype(np.float32), ours)
    # The values are within one step of the fp16 weights they came from (MLX's quantizer moves the
    # scale so that an edge value is exact, hence up to one step, not half of one).
    w = ref[f"g{g}_w"].astype(np.float32)
    assert (np.abs(ours - w) <= np.abs(s16.astype(np.float32)) * 1.001).all()
    x = ref[f"g{g}_x"].astype(np.float64)
    expect = x @ ours.astype(np.float64).T
    np.testing.assert_allclose(ref[f"g{g}_qmm"], expect, rtol=1e-5, atol=1e-5 * np.abs(expect).max())
    back = uqr.to_mlx(qt)
    for mine, theirs in zip(back, (wq, scales, biases)):
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
        assert mine.tobytes() == theirs.tobytes()


@pytest.mark.parametrize("g", GROUP_SIZES)
def test_against_golden_mlx_outputs(g):
    ref = dict(np.load(os.path.join(GOLDEN_DIR, "mlx4_golden.npz")))
    check_against_mlx(ref, g)


@pytest.mark.parametrize("g", GROUP_SIZES)
def test_against_live_mlx(g):
    pytest.importorskip("mlx.core", reason="mlx is not installed here; the golden-file test covers mlx4")
    ref = load_maker().golden(seed=int.from_bytes(os.urandom(2), "little"))
    check_against_mlx(ref, g)


def test_our_quantizer_exports_to_mlx(gen):
    w = torch.randn(4, 256, generator=gen) * 0.02
    qt = uqr.quantize(w, "mlx4", group_size=32)
    wq, scales, biases = uqr.to_mlx(qt)
    assert wq.dtype == np.uint32 and wq.shape == (4, 32) and scales.shape == (4, 8)
    again = uqr.from_mlx(torch.from_numpy(wq.astype(np.int64)).numpy().astype(np.uint32),
                         torch.from_numpy(scales), biases, group_size=32)
    assert torch.equal(again.data, qt.data)
    try:
        import mlx.core as mx
    except ImportError:
        return
    y = np.array(mx.dequantize(mx.array(wq), mx.array(scales.astype(np.float32)),
                               mx.array(biases.astype(np.float32)), group_size=32, bits=4))
    np.testing.assert_array_equal(y, uqr.dequantize(qt).numpy())


def test_from_mlx_rejects_what_fp16_cannot_hold():
    wq = np.zeros((2, 8), np.uint32)
    ok = np.full((2, 2), 0.5, np.float32)
    uqr.from_mlx(wq, ok, ok, group_size=32)
    bad = ok.copy()
    bad[1, 1] = 0.1  # not a binary fraction fp16 can hold exactly
    with pytest.raises(ValueError, match=r"scales\[1, 1\].*fp16"):
        uqr.from_mlx(wq, bad, ok, group_size=32)
    big = ok.copy()
    big[0, 0] = 1e6
    with pytest.raises(ValueError, match=r"biases\[0, 0\].*fp16"):
        uqr.from_mlx(wq, ok, big, group_size=32)
    with pytest.raises(ValueError, match="shape"):
        uqr.from_mlx(wq, ok[:, :1], ok, group_size=32)
    with pytest.raises(ValueError, match="uint32"):
        uqr.from_mlx(wq.astype(np.int32), ok, ok, group_size=32)
    with pytest.raises(ValueError, match="group_size"):
        uqr.from_mlx(wq, ok, ok, group_size=16)
    with pytest.raises(ValueError, match="mlx4"):
        uqr.to_mlx(uqr.quantize(torch.zeros(1, 32), "q4_0"))
