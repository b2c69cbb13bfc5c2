"""The GGUF formats iq4_nl, iq4_xs, q3_k, q2_k and mxfp4 against ggml.

Decoders: bit-exact with ``gguf.quants.dequantize`` on random valid blocks and on random bytes.
Quantizers: byte-identical with ggml's reference quantizers (no importance matrix), checked against
``libgguf.quantize_rows`` (ggml's quantizers compiled as a Python module: a test oracle only) on
Gaussian, heavy-tailed, all-zero, tiny (fp16-subnormal scales) and huge rows. ``load_gguf`` keeps
these types packed.
"""
import numpy as np
import pytest
import torch

import torch_uqr as uqr
from torch_uqr.formats import get, table

gguf = pytest.importorskip("gguf", reason="the gguf package is the reference for the GGUF formats")

FORMATS = ["iq4_nl", "iq4_xs", "q3_k", "q2_k", "mxfp4"]
QTYPE = {f: gguf.GGMLQuantizationType[table.spec(f).gguf_type] for f in FORMATS}


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(np.asarray(a, np.float32).view(np.uint32), np.asarray(b, np.float32).view(np.uint32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_equals_gguf_on_random_blocks(fmt, gen):
    N, K = 4, 3 * get(fmt).BLOCK
    data = get(fmt).random_blocks(N, K, gen)
    ours = uqr.dequantize(uqr.QTensor.from_bytes(data, fmt, (N, K)))
    assert _bits_equal(ours.numpy(), gguf.quants.dequantize(data.numpy(), QTYPE[fmt]))


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_equals_gguf_on_any_bytes(fmt, gen):
    """Random bytes everywhere: every scale pattern (subnormal and non-finite fp16 fields, every
    exponent) decodes as ggml decodes it, in the reference decoder used without validation."""
    N, K = 8, 4 * get(fmt).BLOCK
    data = torch.randint(0, 256, (N, K // get(fmt).BLOCK * get(fmt).BLOCK_BYTES), generator=gen, dtype=torch.uint8)
    ours = get(fmt).decode(data, N, K)
    with np.errstate(all="ignore"):
        theirs = gguf.quants.dequantize(data.numpy(), QTYPE[fmt])
    same = (ours.numpy().view(np.uint32) == theirs.view(np.uint32)) | (np.isnan(ours.numpy()) & np.isnan(theirs))
    assert same.all()


def _rows(kind: str, N: int, K: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "normal":
        return torch.randn(N, K, generator=gen)
    if kind == "student_t":
        return torch.distributions.StudentT(torch.tensor(2.0)).sample((N, K)) * 3
    if kind == "zero":
        return torch.zeros(N, K)
    if kind == "tiny":  # fp16-subnormal scales
        return torch.randn(N, K, generator=gen) * 1e-6
    if kind == "huge":
        return torch.randn(N, K, generator=gen) * 1e4
    # "mixed": exact quarter steps (ties in every rounding), a zero sub-block, a constant row
    w = torch.randint(-16, 17, (N, K), generator=gen).float() / 4
    w[0, :16] = 0.0
    w[1] = 0.375
    return w


@pytest.mark.filterwarnings("ignore::torch_uqr.QuantizationWarning")  # the tiny rows are tiny on purpose
@pytest.mark.parametrize("kind", ["normal", "student_t", "zero", "tiny", "huge", "mixed"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_quantizer_bytes_equal_ggml(fmt, kind, gen):
    libgguf = pytest.importorskip("libgguf", reason="ggml's quantizers (libgguf) are the oracle")
    w = _rows(kind, 12, 512, gen)
    ours = uqr.quantize(w, fmt).data.numpy()
    theirs = libgguf.quantize_rows(w.numpy(), int(QTYPE[fmt]))
    np.testing.assert_array_equal(ours, theirs)
    assert _bits_equal(uqr.dequantize(uqr.QTensor.from_bytes(theirs, fmt, tuple(w.shape))).numpy(),
                       gguf.quants.dequantize(theirs, QTYPE[fmt]))


def test_mxfp4_exponent_at_powers_of_two():
    """floor(log2(amax)) next to powers of two (where float32 log2 rounds up to the integer)."""
    libgguf = pytest.importorskip("libgguf", reason="ggml's quantizers (libgguf) are the oracle")
    vals = [np.float32(f) * np.float32(2.0) ** k for k in range(-40, 40, 3)
            for f in (1.0, np.nextafter(np.float32(1), np.float32(0)), 1.5, 0.75)]
    w = np.zeros((len(vals), 32), np.float32)
    w[:, 3], w[:, 17] = vals, -np.asarray(vals, np.float32) / 3
    np.testing.assert_array_equal(uqr.quantize(torch.from_numpy(w), "mxfp4").data.numpy(),
                                  libgguf.quantize_rows(w, int(QTYPE["mxfp4"])))


def test_mxfp4_rejects_exponents_that_overflow(gen):
    data = get("mxfp4").random_blocks(2, 64, gen)
    data.view(-1, 17)[3, 0] = 252
    uqr.QTensor.from_bytes(data, "mxfp4", (2, 64))
    data.view(-1, 17)[3, 0] = 253
    with pytest.raises(ValueError, match="block 3 has exponent e = 253"):
        uqr.QTensor.from_bytes(data, "mxfp4", (2, 64))


def test_load_gguf_keeps_the_new_types_packed(tmp_path, gen):
    libgguf = pytest.importorskip("libgguf", reason="ggml's quantizers (libgguf) write the tensors")
    path = tmp_path / "more.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    tensors = {}
    for fmt, shape in [("iq4_nl", (3, 64)), ("q3_k", (2, 512)), ("iq4_xs", (2, 256)), ("q2_k", (3, 256)),
                       ("mxfp4", (4, 96))]:
        raw = libgguf.quantize_rows(torch.randn(*shape, generator=gen).numpy(), int(QTYPE[fmt]))
        writer.add_tensor(fmt, raw, raw_dtype=QTYPE[fmt])
        tensors[fmt] = (raw, shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ck = uqr.load_gguf(path)
    assert ck.dequantized == []
    for fmt, (raw, shape) in tensors.items():
        qt = ck[fmt]
        assert isinstance(qt, uqr.QTensor) and qt.fmt == fmt and qt.shape == shape
        assert np.array_equal(qt.data.numpy(), raw)  # the file's bytes, untouched
        assert _bits_equal(uqr.dequantize(qt).numpy(), gguf.quants.dequantize(raw, QTYPE[fmt]))
