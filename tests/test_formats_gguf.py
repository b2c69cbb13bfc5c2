"""Bit-exactness against the ``gguf`` package (ggml's reference Python implementation)."""
import numpy as np
import pytest
import torch

import torch_uqr as uqr
from torch_uqr.formats import get, table

gguf = pytest.importorskip("gguf", reason="the gguf package is the reference for the GGUF formats")
T = gguf.GGMLQuantizationType
GGUF_TYPES = {f.name: T[f.gguf_type] for f in table.TABLE if f.gguf_type}
# Byte offsets of each GGUF format's fp16 fields (test data: where random blocks get finite scales).
F16_FIELDS = {"q4_0": (0,), "q4_1": (0, 2), "q8_0": (0,), "q4_k": (0, 2), "q5_0": (0,), "q5_1": (0, 2),
              "q6_k": (208,), "q5_k": (0, 2), "iq4_nl": (0,), "iq4_xs": (0,), "q3_k": (108,), "q2_k": (80, 82),
              "mxfp4": ()}


def tricky_weights(N: int, K: int, gen: torch.Generator) -> torch.Tensor:
    """Gaussian rows plus rows that stress rounding: zeros, constants, exact halves, sign ties."""
    w = torch.randn(N, K, generator=gen)
    w[0] = 0.0
    w[1] = 0.375
    w[2] = torch.randint(-16, 17, (K,), generator=gen).float() / 4     # many exact .5 quotients
    w[3, ::2], w[3, 1::2] = 1.0, -1.0                                      # |max| tie of both signs
    w[4] = torch.randn(K, generator=gen) * 1e-6                            # subnormal fp16 scales
    w[5] = torch.distributions.StudentT(2.0).sample((K,)) * 30
    return w


@pytest.mark.filterwarnings("ignore::torch_uqr.QuantizationWarning")  # row 4 is tiny on purpose
@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q8_0"])
def test_quantizer_bytes_equal_ggml(fmt, gen):
    w = tricky_weights(9, 96, gen)
    ours = uqr.quantize(w, fmt).data.numpy()
    theirs = gguf.quants.quantize(w.numpy(), GGUF_TYPES[fmt])
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("fmt", list(GGUF_TYPES))
def test_decode_equals_gguf_on_random_blocks(fmt, gen):
    N, K = 4, 3 * get(fmt).BLOCK
    data = get(fmt).random_blocks(N, K, gen)
    ours = uqr.dequantize(uqr.QTensor.from_bytes(data, fmt, (N, K)))
    theirs = gguf.quants.dequantize(data.numpy(), GGUF_TYPES[fmt])
    np.testing.assert_array_equal(ours.numpy(), theirs)


@pytest.mark.parametrize("fmt", list(GGUF_TYPES))
def test_decode_equals_gguf_on_any_finite_scale_bits(fmt, gen):
    """Random bytes everywhere, fp16 fields drawn from every finite bit pattern (subnormals, 65504)."""
    N, K = 8, 4 * get(fmt).BLOCK
    data = torch.randint(0, 256, (N * K // get(fmt).BLOCK, get(fmt).BLOCK_BYTES), generator=gen,
                         dtype=torch.uint8)
    for off in F16_FIELDS[fmt]:
        bits = torch.randint(0, 1 << 16, (data.shape[0],), generator=gen).to(torch.int16).view(torch.float16)
        finite = torch.where(torch.isfinite(bits), bits, torch.tensor(65504.0, dtype=torch.float16))
        data[:, off:off + 2] = finite.reshape(-1, 1).view(torch.uint8)
    if fmt == "mxfp4":  # its scale is an exponent byte; above 252 the weights overflow and are refused
        data[:, 0] = data[:, 0] % 253
    data = data.reshape(N, -1)
    ours = uqr.dequantize(uqr.QTensor.from_bytes(data, fmt, (N, K)))
    np.testing.assert_array_equal(ours.numpy(), gguf.quants.dequantize(data.numpy(), GGUF_TYPES[fmt]))


@pytest.mark.filterwarnings("ignore::torch_uqr.QuantizationWarning")  # row 4 is tiny on purpose
@pytest.mark.parametrize("fmt", list(GGUF_TYPES))
def test_decode_equals_gguf_on_quantized_data(fmt, gen):
    N, K = 6, 2 * get(fmt).BLOCK
    w = tricky_weights(N, K, gen)
    qt = uqr.quantize(w, fmt)
    np.testing.assert_array_equal(uqr.dequantize(qt).numpy(),
                                  gguf.quants.dequantize(qt.data.numpy(), GGUF_TYPES[fmt]))
    # and bytes gguf made decode identically through our path
    if fmt in ("q4_0", "q4_1", "q8_0", "q5_0", "q5_1"):  # the types gguf's Python can quantize
        theirs = gguf.quants.quantize(w.numpy(), GGUF_TYPES[fmt])
        ours = uqr.dequantize(uqr.QTensor.from_bytes(theirs, fmt, (N, K)))
        np.testing.assert_array_equal(ours.numpy(), gguf.quants.dequantize(theirs, GGUF_TYPES[fmt]))


@pytest.mark.parametrize("search", [False, True])
def test_q4_k_search_beats_plain_min_max(gen, rel_rms, search):
    """ggml's scale search and ours must do better than q4_1-style min/max rounding at the same 32-groups."""
    w = torch.distributions.StudentT(3.0).sample((64, 512))
    err_k = rel_rms(get("q4_k").decode(get("q4_k").quantize(w, search=search), 64, 512), w)
    err_1 = rel_rms(uqr.dequantize(uqr.quantize(w, "q4_1")), w)
    assert err_k < 0.97 * err_1, (err_k, err_1)


def _rows(kind: str, N: int, K: int, gen: torch.Generator) -> torch.Tensor:
    """Weights of one kind: Gaussian, heavy-tailed, zero, tiny (subnormal fp16 scales), huge."""
    if kind == "t":
        return torch.distributions.StudentT(2.0).sample((N, K)) * 0.05
    if kind == "zero":
        w = torch.zeros(N, K)
        w[1, :K // 2] = torch.randn(K // 2, generator=gen)  # zero sub-blocks next to normal ones
        return w
    scale = {"normal": 1.0, "tiny": 1e-6, "huge": 1e4}[kind]
    return torch.randn(N, K, generator=gen) * scale


@pytest.mark.filterwarnings("ignore::torch_uqr.QuantizationWarning")  # the tiny rows warn on purpose
@pytest.mark.parametrize("kind", ["normal", "t", "zero", "tiny", "huge"])
@pytest.mark.parametrize("fmt", list(GGUF_TYPES))
def test_quantizer_bytes_equal_ggml_reference(fmt, kind, gen):
    """Every GGUF quantizer gives the bytes of ggml's reference quantizer (libgguf's binding of it)."""
    libgguf = pytest.importorskip("libgguf", reason="libgguf binds ggml's reference quantizers")
    K = 2 * get(fmt).BLOCK if get(fmt).BLOCK == 256 else 8 * get(fmt).BLOCK
    w = _rows(kind, 6, K, gen)
    ours = uqr.quantize(w, fmt).data.numpy()
    theirs = np.asarray(libgguf.quantize_rows(w.numpy(), libgguf.GGMLQuantizationType[GGUF_TYPES[fmt].name]))
    np.testing.assert_array_equal(ours, theirs.reshape(ours.shape))


@pytest.mark.parametrize("kind", ["TQ1_0", "TQ2_0"])
def test_gguf_ternary_import_matches_gguf_decoder(kind, gen):
    N, K = 3, 512
    w = torch.randn(N, K, generator=gen).numpy()
    raw = gguf.quants.quantize(w, T[kind])
    qt = uqr.from_gguf_ternary(raw.tobytes(), kind, (N, K))
    assert qt.fmt == "ternary" and qt.shape == (N, K)
    np.testing.assert_array_equal(uqr.dequantize(qt).numpy(), gguf.quants.dequantize(raw, T[kind]))
    # every base-3 byte pattern of TQ1_0 is valid: random payloads must decode identically too
    size = raw.shape[1] // (K // 256)
    rnd = torch.randint(0, 256, raw.shape, generator=gen, dtype=torch.uint8).numpy()
    blocks = rnd.reshape(-1, size)
    blocks[:, -2:] = np.frombuffer(np.float16([0.25]).tobytes(), np.uint8)
    if kind == "TQ2_0":
        trits = torch.randint(0, 3, (blocks.shape[0], 64, 4), generator=gen).numpy().astype(np.uint8)
        blocks[:, :64] = (trits << np.array([0, 2, 4, 6], np.uint8)).sum(-1).astype(np.uint8)
    got = uqr.from_gguf_ternary(rnd, kind, (N, K))
    np.testing.assert_array_equal(uqr.dequantize(got).numpy(), gguf.quants.dequantize(rnd, T[kind]))


def test_tq2_code_3_is_rejected(gen):
    raw = gguf.quants.quantize(torch.randn(1, 256, generator=gen).numpy(), T.TQ2_0).copy()
    raw[0, 5] |= 0b11
    with pytest.raises(ValueError, match="code 3"):
        uqr.from_gguf_ternary(raw, "TQ2_0", (1, 256))
    with pytest.raises(ValueError, match="expected"):
        uqr.from_gguf_ternary(raw[:, :-1], "TQ2_0", (1, 256))
    with pytest.raises(ValueError, match="multiple of 256"):
        uqr.from_gguf_ternary(raw, "TQ2_0", (2, 128))
