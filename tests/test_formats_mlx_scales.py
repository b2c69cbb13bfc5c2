"""The MLX family's bf16 and fp32 header rows (``mlxB_bf16``, ``mlxB_f32``, from the format table)
against live MLX: MLX keeps scales and biases in the model's dtype, so ``mx.quantize`` of bf16 /
fp32 weights gives bf16 / fp32 scales, which ``from_mlx`` must import without rounding.

For every such row and group size: the import decodes bit for bit as ``mx.dequantize`` in float32,
``uqr.gemm`` matches ``mx.quantized_matmul``, ``to_mlx(from_mlx(...))`` gives back identical arrays
of the same dtypes (numpy, torch and mlx inputs). Plus a bf16 scale fp16 cannot hold (-6.9e-7),
the row choice (``scale_dtype``, ``compact``) and load_mlx on bf16 / fp32 checkpoints.
"""
import json

import numpy as np
import pytest
import torch

import torch_uqr as uqr
from torch_uqr.formats.table import family, mlx_format, spec

HEADER_ROWS = [f for f in family("mlx") if f.scale_dtype != "f16"]
CASES = [(f.name, g) for f in HEADER_ROWS for g in f.group_sizes]
IDS = [f"{f}-g{g}" for f, g in CASES]


def _mx():
    return pytest.importorskip("mlx.core", reason="mlx is not installed here")


def _mx_dtype(mx, dtype: str):
    return {"bf16": mx.bfloat16, "f32": mx.float32, "f16": mx.float16}[dtype]


def _mx_bytes(a) -> bytes:
    """Raw bytes of an mlx array (bfloat16 has no numpy dtype: viewed as uint16)."""
    import mlx.core as mx
    return np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a).tobytes()


def _bytes(a) -> bytes:
    if isinstance(a, torch.Tensor):
        return a.contiguous().view(torch.uint8).numpy().tobytes() if a.dtype != torch.uint32 else \
            a.view(torch.int32).numpy().tobytes()
    if isinstance(a, np.ndarray):
        return a.tobytes()
    return _mx_bytes(a)


def _quantize(mx, fmt: str, g: int, n: int = 7, k: int = 384, seed: int = 0):
    row = spec(fmt)
    rng = np.random.default_rng(seed + 97 * g + row.id)
    w = (rng.standard_t(3.0, size=(n, k)) * 0.05).astype(np.float32)
    wm = mx.array(w).astype(_mx_dtype(mx, row.scale_dtype))
    wq, scales, biases = mx.quantize(wm, group_size=g, bits=row.code_bits)
    assert scales.dtype == biases.dtype == _mx_dtype(mx, row.scale_dtype), "MLX keeps the weights' dtype"
    return wq, scales, biases


@pytest.mark.parametrize("fmt,g", CASES, ids=IDS)
def test_mx_quantize_imports_bit_exact(fmt, g):
    mx = _mx()
    row = spec(fmt)
    bits = row.code_bits
    wq, scales, biases = _quantize(mx, fmt, g)
    qt = uqr.from_mlx(wq, scales, biases, group_size=g, bits=bits)
    assert qt.fmt == fmt and qt.group_size == g and qt.shape == (7, 384)
    assert uqr.from_mlx(wq, scales, biases, bits=bits).group_size == g  # shapes give the group size
    uqr.QTensor.from_bytes(qt.data, fmt, qt.shape, group_size=g)  # valid blocks
    # the import is exact: MLX's own dequantize in float32 equals our decode bit for bit
    s32, b32 = scales.astype(mx.float32), biases.astype(mx.float32)
    ref = np.array(mx.dequantize(wq, s32, b32, group_size=g, bits=bits))
    ours = uqr.dequantize(qt).numpy()
    np.testing.assert_array_equal(ours, ref)
    # uqr.gemm against mx.quantized_matmul
    x = np.random.default_rng(g + bits).standard_normal((5, 384)).astype(np.float32)
    qmm = np.array(mx.quantized_matmul(mx.array(x), wq, s32, b32, transpose=True, group_size=g, bits=bits))
    expect = x.astype(np.float64) @ ours.astype(np.float64).T
    np.testing.assert_allclose(qmm, expect, rtol=1e-5, atol=1e-5 * np.abs(expect).max())
    if uqr.ops.op_available():
        y = uqr.gemm(torch.from_numpy(x), qt).numpy()
        np.testing.assert_allclose(y, qmm, rtol=1e-5, atol=1e-5 * np.abs(expect).max())
    # to_mlx gives back MLX's arrays, same dtypes, byte for byte
    for back in (uqr.to_mlx(qt, array="mlx"),):
        for mine, theirs in zip(back, (wq, scales, biases)):
            assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
            assert _mx_bytes(mine) == _mx_bytes(theirs)
    wq_a, sc_a, bi_a = uqr.to_mlx(qt)  # default: numpy, bf16 fields as torch.bfloat16
    assert wq_a.dtype == np.uint32 and wq_a.tobytes() == _mx_bytes(wq)
    want = torch.bfloat16 if row.scale_dtype == "bf16" else np.float32
    assert sc_a.dtype == want and bi_a.dtype == want
    assert _bytes(sc_a) == _mx_bytes(scales) and _bytes(bi_a) == _mx_bytes(biases)
    # the same import from torch and numpy inputs, and back as torch
    wq_t, sc_t, bi_t = uqr.to_mlx(qt, array="torch")
    assert sc_t.dtype == {"bf16": torch.bfloat16, "f32": torch.float32}[row.scale_dtype]
    assert wq_t.dtype == torch.uint32
    again = uqr.from_mlx(wq_t.view(torch.int32).numpy().view(np.uint32), sc_t, bi_t, group_size=g)
    assert again.fmt == fmt and torch.equal(again.data, qt.data)
    again = uqr.from_mlx(wq_a, sc_a, bi_a, group_size=g)
    assert again.fmt == fmt and torch.equal(again.data, qt.data)


@pytest.mark.parametrize("bits", sorted({f.code_bits for f in family("mlx")}))
def test_bf16_scale_fp16_cannot_hold_imports_and_round_trips(bits):
    g, N, K = 32, 3, 128
    rng = np.random.default_rng(bits)
    scales = torch.tensor(rng.uniform(-0.05, 0.05, (N, K // g)), dtype=torch.bfloat16)
    biases = torch.tensor(rng.uniform(-0.5, 0.5, (N, K // g)), dtype=torch.bfloat16)
    scales[1, 2] = -6.9e-7  # below fp16's normal range: fp16 would keep 1 significant bit of it
    biases[2, 0] = 3.0e38   # beyond fp16's range altogether
    assert float(scales[1, 2].to(torch.float16).float()) != float(scales[1, 2].float())
    q = rng.integers(0, 1 << bits, (N, K), dtype=np.uint64)
    stream = ((q[:, :, None] >> np.arange(bits, dtype=np.uint64)) & 1).reshape(N, K * bits)
    wq = (stream.reshape(N, -1, 32) << np.arange(32, dtype=np.uint64)).sum(-1).astype(np.uint32)
    qt = uqr.from_mlx(wq, scales, biases, group_size=g)
    assert qt.fmt == f"mlx{bits}_bf16"
    s32, b32 = scales.float().numpy().repeat(g, 1), biases.float().numpy().repeat(g, 1)
    np.testing.assert_array_equal(uqr.dequantize(qt).numpy(), q.astype(np.float32) * s32 + b32)
    wq2, sc2, bi2 = uqr.to_mlx(qt)
    assert np.array_equal(wq2, wq) and sc2.dtype == bi2.dtype == torch.bfloat16
    assert torch.equal(sc2.view(torch.int16), scales.view(torch.int16)) and torch.equal(bi2.view(torch.int16),
                                                                                      biases.view(torch.int16))
    assert uqr.from_mlx(wq, scales, biases, group_size=g, compact=True).fmt == f"mlx{bits}_bf16"  # not fp16-exact
    with pytest.raises(ValueError, match=r"scales\[1, 2\].*fp16"):
        uqr.from_mlx(wq, scales, biases, group_size=g, scale_dtype="f16")
    # fp32 holds every bf16 value: the same weights as mlx<bits>_f32
    as_f32 = uqr.from_mlx(wq, scales, biases, group_size=g, scale_dtype="f32")
    assert as_f32.fmt == f"mlx{bits}_f32" and torch.equal(uqr.dequantize(as_f32), uqr.dequantize(qt))
    mx = pytest.importorskip("mlx.core", reason="mlx is not installed here")
    ms, mb = mx.array(scales), mx.array(biases)
    assert ms.dtype == mx.bfloat16
    ref = np.array(mx.dequantize(mx.array(wq), ms.astype(mx.float32), mb.astype(mx.float32), group_size=g, bits=bits))
    np.testing.assert_array_equal(uqr.dequantize(qt).numpy(), ref)
    assert torch.equal(uqr.from_mlx(mx.array(wq), ms, mb, group_size=g).data, qt.data)


def test_row_choice_follows_the_dtype():
    wq = np.zeros((2, 8), np.uint32)
    half = np.full((2, 2), 0.5, np.float16)
    bf = torch.full((2, 2), 0.5, dtype=torch.bfloat16)
    assert uqr.from_mlx(wq, half, half, group_size=32).fmt == "mlx4"
    assert uqr.from_mlx(wq, bf, bf, group_size=32).fmt == "mlx4_bf16"
    assert uqr.from_mlx(wq, bf, bf, group_size=32, compact=True).fmt == "mlx4"  # 0.5 is an fp16 value
    assert uqr.from_mlx(wq, half.astype(np.float32), half, group_size=32).fmt == "mlx4_f32"  # mixed: fp32 holds both
    assert uqr.from_mlx(wq, torch.from_numpy(half), bf, group_size=32).fmt == "mlx4_f32"
    # float64 (no MLX dtype): the narrowest header that holds every value
    assert uqr.from_mlx(wq, half.astype(np.float64), half.astype(np.float64), group_size=32).fmt == "mlx4"
    tiny = np.full((2, 2), 2.0 ** -30)
    assert uqr.from_mlx(wq, tiny, tiny, group_size=32).fmt == "mlx4_bf16"
    assert uqr.from_mlx(wq, tiny + 2.0 ** -40, tiny, group_size=32).fmt == "mlx4_f32"
    with pytest.raises(ValueError, match="fp32"):
        uqr.from_mlx(wq, tiny + 2.0 ** -60, tiny, group_size=32)
    assert mlx_format(4, "f32").header_bytes == 8 and mlx_format(4, "bf16").header_bytes == 4
    with pytest.raises(ValueError, match="numpy has no bfloat16"):
        uqr.to_mlx(uqr.from_mlx(wq, bf, bf, group_size=32), array="numpy")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_load_mlx_keeps_the_scales_dtype(tmp_path, dtype):
    from safetensors.torch import save_file
    g, N, K, bits = 32, 4, 128, 6
    rng = np.random.default_rng(3)
    q = rng.integers(0, 1 << bits, (N, K), dtype=np.uint64)
    stream = ((q[:, :, None] >> np.arange(bits, dtype=np.uint64)) & 1).reshape(N, K * bits)
    wq = (stream.reshape(N, -1, 32) << np.arange(32, dtype=np.uint64)).sum(-1).astype(np.uint32)
    scales = torch.tensor(rng.uniform(-0.05, 0.05, (N, K // g)), dtype=dtype)
    scales[0, 0] = -6.9e-7
    biases = torch.tensor(rng.uniform(-0.5, 0.5, (N, K // g)), dtype=dtype)
    save_file({"l.weight": torch.from_numpy(wq.view(np.int32)).view(torch.uint32), "l.scales": scales,
               "l.biases": biases}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"quantization": {"group_size": g, "bits": bits}}))
    qt = uqr.load_mlx(tmp_path)["l.weight"]
    assert qt.fmt == f"mlx{bits}_" + ("bf16" if dtype == torch.bfloat16 else "f32")
    expect = q.astype(np.float32) * scales.float().numpy().repeat(g, 1) + biases.float().numpy().repeat(g, 1)
    np.testing.assert_array_equal(uqr.dequantize(qt).numpy(), expect)
    _, sc, bi = uqr.to_mlx(qt, array="torch")
    assert sc.dtype == dtype and torch.equal(sc, scales) and torch.equal(bi, biases)
