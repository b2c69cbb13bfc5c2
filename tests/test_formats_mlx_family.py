"""Every bit width of the MLX affine family (mlx2 ... mlx8, from the format table) against MLX:
decode equal to ``mx.dequantize`` in float32, ``uqr.gemm`` against ``mx.quantized_matmul``, a
lossless ``from_mlx`` / ``to_mlx`` round trip, ``bits`` / ``group_size`` inferred from shapes; and
``uqr.gemm`` on the CPU and the emulated Metal shaders against a float64 reference.

Two sources of MLX outputs, as in test_formats_mlx.py: the committed golden file
(tests/golden/mlx_family_golden.npz, made by tests/golden/make_mlx_golden.py) and live ``mlx.core``
with fresh fp16 weights (skipped where mlx cannot be installed).
"""
import importlib.util
import os

import numpy as np
import pytest
import torch

import gemm_helpers
import torch_uqr as uqr
from torch_uqr.formats.table import family, mlx_format

GOLDEN_DIR = os.path.join(os.path.dirname(__file__), "golden")
CASES = [(f.name, g) for f in family("mlx") for g in f.group_sizes]
IDS = [f"{f}-g{g}" for f, g in CASES]


def bits_of(fmt: str) -> int:
    return int(fmt[len("mlx"):])


def load_maker():
    spec = importlib.util.spec_from_file_location("make_mlx_golden", os.path.join(GOLDEN_DIR, "make_mlx_golden.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_against_mlx(ref: dict, fmt: str, g: int) -> None:
    bits = bits_of(fmt)
    key = f"b{bits}_g{g}_"
    wq, scales, biases = ref[key + "wq"], ref[key + "scales"], ref[key + "biases"]
    assert scales.dtype == np.float16 and wq.dtype == np.uint32
    assert wq.shape[1] * 32 == ref[key + "w"].shape[1] * bits  # MLX packs bits per weight, no padding
    qt = uqr.from_mlx(wq, scales, biases, group_size=g, bits=bits)
    assert qt.fmt == fmt and qt.group_size == g and qt.shape == ref[key + "w"].shape
    # bits follow from the shapes given the group size, and the group size given bits
    assert torch.equal(uqr.from_mlx(wq, scales, biases, group_size=g).data, qt.data)
    assert uqr.from_mlx(wq, scales, biases, bits=bits).group_size == g
    uqr.QTensor.from_bytes(qt.data, fmt, qt.shape, group_size=g)  # valid blocks
    ours = uqr.dequantize(qt).numpy()
    # MLX with float32 scales computes scale*q + bias in float32: bit-identical to our decode.
    np.testing.assert_array_equal(ours, ref[key + "dequant32"])
    x = ref[key + "x"]
    expect = x.astype(np.float64) @ ours.astype(np.float64).T
    np.testing.assert_allclose(ref[key + "qmm"], expect, rtol=1e-5, atol=1e-5 * np.abs(expect).max())
    if uqr.ops.op_available():
        y = uqr.gemm(torch.from_numpy(x), qt).numpy()
        np.testing.assert_allclose(y, ref[key + "qmm"], rtol=1e-5, atol=1e-5 * np.abs(expect).max())
    back = uqr.to_mlx(qt)
    for mine, theirs in zip(back, (wq, scales, biases)):
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
        assert mine.tobytes() == theirs.tobytes()


@pytest.mark.parametrize("fmt,g", CASES, ids=IDS)
def test_against_golden_mlx_outputs(fmt, g):
    ref = dict(np.load(os.path.join(GOLDEN_DIR, "mlx_family_golden.npz")))
    if f"b{bits_of(fmt)}_g{g}_wq" not in ref:
        pytest.skip(f"{fmt} g={g} is not in the golden file: rerun tests/golden/make_mlx_golden.py")
    check_against_mlx(ref, fmt, g)


@pytest.mark.parametrize("fmt,g", CASES, ids=IDS)
def test_against_live_mlx(fmt, g):
    pytest.importorskip("mlx.core", reason="mlx is not installed here; the golden-file test covers the family")
    seed = int.from_bytes(os.urandom(2), "little")
    ref = load_maker().golden_family(seed=seed, bits_list=(bits_of(fmt),), n=7, k=384, m=5)
    check_against_mlx(ref, fmt, g)


@pytest.mark.parametrize("fmt,g", CASES, ids=IDS)
def test_our_quantizer_round_trips_through_mlx(fmt, g):
    gen = torch.Generator().manual_seed(g + bits_of(fmt))
    w = torch.randn(4, 256, generator=gen) * 0.02
    qt = uqr.quantize(w, fmt, group_size=g)
    wq, scales, biases = uqr.to_mlx(qt)
    bits = bits_of(fmt)
    assert wq.dtype == np.uint32 and wq.shape == (4, 256 * bits // 32) and scales.shape == (4, 256 // g)
    again = uqr.from_mlx(wq, scales, biases, group_size=g)
    assert again.fmt == fmt and torch.equal(again.data, qt.data)
    try:
        import mlx.core as mx
    except ImportError:
        return
    y = np.array(mx.dequantize(mx.array(wq), mx.array(scales.astype(np.float32)),
                               mx.array(biases.astype(np.float32)), group_size=g, bits=bits))
    np.testing.assert_array_equal(y, uqr.dequantize(qt).numpy())


def test_from_mlx_rejects_shapes_that_match_no_width():
    ok = np.full((2, 2), 0.5, np.float32)
    with pytest.raises(ValueError, match="bits=7 has no format"):
        uqr.from_mlx(np.zeros((2, 14), np.uint32), ok, ok, group_size=32)  # 14 words = 2 groups of 32 x 7 bits
    with pytest.raises(ValueError, match="does not match bits"):
        uqr.from_mlx(np.zeros((2, 8), np.uint32), ok, ok, group_size=32, bits=8)
    with pytest.raises(ValueError, match="not a whole number of bits"):
        uqr.from_mlx(np.zeros((2, 5), np.uint32), ok, ok, group_size=64)
    with pytest.raises(ValueError, match="group_size"):
        uqr.from_mlx(np.zeros((2, 2), np.uint32), ok, ok, bits=2)  # g = 16
    assert mlx_format(3).name == "mlx3"
    with pytest.raises(ValueError, match="MLX format"):
        uqr.to_mlx(uqr.quantize(torch.zeros(1, 32), "q4_0"))


MS = [1, 7, 33, 127, 129, 300]
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
N_ODD, K_GEMM = 70, 256  # 70 rows: no whole tile or panel; K / 2 heads = 128, whole groups for every g


def _x(layout: str, M: int, dtype: torch.dtype):
    """(x, out_heads, in_heads): plain [M, K], or attention's head split (x a [2, 2, M, K/2]
    transposed view of [2, M, 2, K/2], y in 2 heads of 35)."""
    if layout == "plain":
        return gemm_helpers.randn(M, K_GEMM, dtype=dtype), 0, False
    return gemm_helpers.randn(2, M, 2, K_GEMM // 2, dtype=dtype).transpose(1, 2), 2, True


@pytest.mark.parametrize("backend", [None, "metal-emu"], ids=["cpu", "metal-emu"])
@pytest.mark.parametrize("fmt,g", CASES, ids=IDS)
def test_gemm_matches_float64_reference(fmt, g, backend):
    """uqr.gemm on the CPU kernels and the emulated Metal shaders, odd M, both head layouts, every x dtype."""
    if not uqr.ops.op_available():
        pytest.skip("torch_uqr._C not built")
    qt, W = gemm_helpers.weights(fmt, g, N_ODD, K_GEMM)
    for i, M in enumerate(MS):
        for j, dtype in enumerate(DTYPES):
            # The emulator is slow: there the layouts take turns, so that every M and every dtype
            # still meets both of them.
            for layout in ("plain", "heads") if backend is None else (("plain", "heads")[(i + j) % 2],):
                x, out_heads, in_heads = _x(layout, M, dtype)
                ref = gemm_helpers.reference(x, W, out_heads, in_heads)
                y = uqr.gemm(x, qt, out_heads=out_heads, in_heads=in_heads, backend=backend)
                gemm_helpers.assert_close(y, ref, dtype, f"{fmt} g={g} {backend} M={M} {layout} {dtype}")


def test_cuda_tensor_core_kernels_take_mlx4_only():
    """The qmma_* kernels have traits for mlx4's nibbles only: the router leaves the other widths
    (table: cuda_qmma=False) to the Triton and decode-to-dense paths, which test_triton_interpret.py
    and test_cuda_build.py (dequant.cu instantiates every group size of every width) cover."""
    from torch_uqr.backends.cuda import configs, dispatch
    x = torch.zeros(1, 256, dtype=torch.float16)
    for row in family("mlx"):
        qt = uqr.quantize(torch.randn(8, 256), row.name)
        fits = dispatch.qmma_fits(x, qt.data, row.name, 256, qt.group_size, False, 1)
        assert fits == row.cuda_qmma == (row.name in configs.QMMA_FORMATS) == (row.name == "mlx4")
