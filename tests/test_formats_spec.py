"""Every decoder against a literal, one-block-at-a-time reading of docs/formats.md in float64.

The readers below use ``struct`` and Python integers only, so they share no code with the
vectorized decoders; random valid blocks and quantized data both go through them.
"""
import struct

import pytest
import torch

import torch_uqr as uqr
from torch_uqr.formats import get, block_geometry
from torch_uqr.formats.table import family, format_cases, spec


def f16(b, o):
    return struct.unpack_from("<e", b, o)[0]


def bits(b, start, width):
    return sum(((b[(start + t) // 8] >> ((start + t) % 8)) & 1) << t for t in range(width))


def read_q4_0(b, g):
    d = f16(b, 0)
    return [((b[2 + j % 16] >> (4 * (j // 16))) & 15) * d - 8 * d for j in range(32)]


def read_q4_1(b, g):
    d, m = f16(b, 0), f16(b, 2)
    return [((b[4 + j % 16] >> (4 * (j // 16))) & 15) * d + m for j in range(32)]


def read_q8_0(b, g):
    d = f16(b, 0)
    return [v * d for v in struct.unpack_from("<32b", b, 2)]


def read_q4_k(b, g, five=False):
    d, dmin = f16(b, 0), f16(b, 2)
    s = b[4:16]
    out = []
    for i in range(256):
        j, l = i // 32, i % 32
        if j < 4:
            sc, m = s[j] & 63, s[j + 4] & 63
        else:
            sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4)
            m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4)
        if five:  # q5_k: qh[32] before qs; bit j of qh[l] is bit 4 of sub-block j's element l
            q = ((b[48 + 32 * (j // 2) + l] >> (4 * (j % 2))) & 15) + 16 * ((b[16 + l] >> j) & 1)
        else:
            q = (b[16 + 32 * (j // 2) + l] >> (4 * (j % 2))) & 15
        out.append(d * sc * q - dmin * m)
    return out


def read_q5_k(b, g):
    return read_q4_k(b, g, five=True)


def read_q5_0(b, g, qh_at=2):
    qh = struct.unpack_from("<I", b, qh_at)[0]
    return [((b[qh_at + 4 + j % 16] >> (4 * (j // 16))) & 15) + 16 * ((qh >> j) & 1) for j in range(32)]


def read_q5_0_values(b, g):
    d = f16(b, 0)
    return [(q - 16) * d for q in read_q5_0(b, g)]


def read_q5_1(b, g):
    d, m = f16(b, 0), f16(b, 2)
    return [q * d + m for q in read_q5_0(b, g, qh_at=4)]


def read_q6_k(b, g):
    d = f16(b, 208)
    scales = struct.unpack_from("<16b", b, 192)
    out = []
    for i in range(256):
        h, e = divmod(i, 128)
        low = (b[64 * h + e % 64] >> (4 * (e // 64))) & 15
        high = (b[128 + 32 * h + e % 32] >> (2 * (e // 32))) & 3
        out.append(d * scales[i // 16] * (low + 16 * high - 32))
    return out


def read_mlx(width):
    """The MLX family: element i is bits [width i, width i + width) of the codes after two halves."""
    def read(b, g):
        scale, bias = f16(b, 0), f16(b, 2)
        return [scale * bits(b[4:], width * i, width) + bias for i in range(g)]
    return read


def read_var_affine(b, g):
    d, bias = f16(b, 0), f16(b, 2)
    depth = [m & 7 for m in b[20:28]]
    out = []
    for j in range(8):
        start = 32 * sum(depth[:j])
        for t in range(32):
            out.append(d * b[4 + j] * bits(b[32:], start + t * depth[j], depth[j]) + bias * b[12 + j])
    return out


def read_exl3(b, g):
    d, bias = f16(b, 0), f16(b, 2)
    book = struct.unpack_from("<16b", b, 20)
    out = []
    for i in range(256):
        j, k = i // 32, bits(b[48:], 3 * i, 3)
        out.append(d * (b[4 + j] * book[k] + b[12 + j] * book[8 + k]) + bias)
    return out


def read_ternary(b, g):
    d = f16(b, 0)
    qs = struct.unpack_from("<2I", b, 4)
    return [d * (((qs[i // 16] >> (2 * (i % 16))) & 3) - 1) for i in range(32)]


IQ4 = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
FP4X2 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def read_iq4_nl(b, g):
    d = f16(b, 0)
    return [d * IQ4[(b[2 + j % 16] >> (4 * (j // 16))) & 15] for j in range(32)]


def read_iq4_xs(b, g):
    d, high = f16(b, 0), struct.unpack_from("<H", b, 2)[0]
    out = []
    for j in range(8):
        ls = ((b[4 + j // 2] >> (4 * (j % 2))) & 15) | (((high >> (2 * j)) & 3) << 4)
        out += [d * (ls - 32) * IQ4[(b[8 + 16 * j + t % 16] >> (4 * (t // 16))) & 15] for t in range(32)]
    return out


def read_q3_k(b, g):
    d, out = f16(b, 108), []
    for e in range(256):
        j, h, s, l = e // 16, e // 128, (e // 32) % 4, e % 32
        q = ((b[32 + 32 * h + l] >> (2 * s)) & 3) | (((b[l] >> (e // 32)) & 1) << 2)
        sc = ((b[96 + j % 8] >> (4 * (j // 8))) & 15) | (((b[104 + j % 4] >> (2 * (j // 4))) & 3) << 4)
        out.append(d * (sc - 32) * (q - 4))
    return out


def read_q2_k(b, g):
    d, dmin, out = f16(b, 80), f16(b, 82), []
    for e in range(256):
        q = (b[16 + 32 * (e // 128) + e % 32] >> (2 * ((e // 32) % 4))) & 3
        sc = b[e // 16]
        out.append(d * (sc & 15) * q - dmin * (sc >> 4))
    return out


def read_mxfp4(b, g):
    return [2.0 ** (b[0] - 128) * FP4X2[(b[1 + j % 16] >> (4 * (j // 16))) & 15] for j in range(32)]


READERS = {"iq4_nl": read_iq4_nl, "iq4_xs": read_iq4_xs, "q3_k": read_q3_k, "q2_k": read_q2_k, "mxfp4": read_mxfp4,
           "q4_0": read_q4_0, "q4_1": read_q4_1, "q8_0": read_q8_0, "q4_k": read_q4_k,
           **{f.name: read_mlx(f.code_bits) for f in family("mlx")},
           "var_affine": read_var_affine, "exl3": read_exl3, "ternary": read_ternary,
           "q5_0": read_q5_0_values, "q5_1": read_q5_1, "q6_k": read_q6_k, "q5_k": read_q5_k}
CASES = [(f, g or 0) for f, g in format_cases()]


def literal_decode(qt):
    """float64 [N, K] by the readers above, block by block."""
    raw = bytes(qt.data.cpu().numpy().tobytes())
    size = qt.block_bytes
    values = []
    for o in range(0, len(raw), size):
        values += READERS[qt.fmt](raw[o:o + size], qt.block_size)
    return torch.tensor(values, dtype=torch.float64).reshape(qt.N, qt.K)


def test_registry_order_and_a_reader_per_format():
    assert uqr.formats()[:8] == ["q4_0", "q4_1", "q8_0", "q4_k", "mlx4", "var_affine", "exl3", "ternary"]
    assert set(READERS) == set(uqr.formats())


@pytest.mark.parametrize("fmt,g", CASES)
def test_decode_matches_literal_reading_on_random_blocks(fmt, g, gen):
    block = block_geometry(fmt, g or None)[0]
    N, K = 3, 2 * block
    data = get(fmt).random_blocks(N, K, gen, **({"group_size": g} if g else {}))
    qt = uqr.QTensor.from_bytes(data, fmt, (N, K), group_size=g or None)
    got = uqr.dequantize(qt)
    ref = literal_decode(qt)
    assert not torch.isnan(got).any()
    # Decoders compute in float32; the reading is float64. Each decoder rounds at most twice.
    torch.testing.assert_close(got.double(), ref, rtol=2 ** -22, atol=1e-30)


@pytest.mark.parametrize("fmt,g", CASES)
def test_decode_matches_literal_reading_on_quantized_data(fmt, g, gen, rel_rms):
    block = block_geometry(fmt, g or None)[0]
    N, K = 5, 3 * block
    w = torch.randn(N, K, generator=gen) * 0.02
    qt = uqr.quantize(w, fmt, group_size=g or None)
    got = uqr.dequantize(qt)
    torch.testing.assert_close(got.double(), literal_decode(qt), rtol=2 ** -22, atol=1e-30)
    assert rel_rms(got, w) < 0.5


@pytest.mark.parametrize("fmt,g", CASES)
def test_layout_properties(fmt, g):
    qt = uqr.quantize(torch.randn(2, 256), fmt, group_size=g or None)
    block, size = block_geometry(fmt, g or None)
    assert (qt.block_size, qt.block_bytes) == (block, size)
    assert qt.data.dtype == torch.uint8 and tuple(qt.data.shape) == (2, 256 // block * size)
    assert qt.bits_per_weight == 8 * size / block and qt.nbytes == qt.data.numel()
    assert qt.group_size == g and (qt.N, qt.K) == (2, 256) and qt.K % qt.block_size == 0
    assert fmt in repr(qt)
    expected_bpw = {"q4_0": 4.5, "q4_1": 5.0, "q8_0": 8.5, "q4_k": 4.5, "var_affine": 5.0, "exl3": 4.5,
                    "ternary": 3.0, "q5_0": 5.5, "q5_1": 6.0, "q6_k": 6.5625, "q5_k": 5.5,
                    "iq4_nl": 4.5, "iq4_xs": 4.25, "q3_k": 3.4375, "q2_k": 2.625, "mxfp4": 4.25}.get(fmt)
    if spec(fmt).family == "mlx":  # codes plus 32 bits of scale and bias per group
        expected_bpw = spec(fmt).code_bits + 32 / g
    assert qt.bits_per_weight == expected_bpw


@pytest.mark.parametrize("fmt,g", CASES)
def test_round_trip_through_bytes_is_identical(fmt, g, gen):
    block = block_geometry(fmt, g or None)[0]
    w = torch.distributions.StudentT(3.0).sample((7, 2 * block)) * 0.1
    qt = uqr.quantize(w, fmt, group_size=g or None)
    raw = qt.data.numpy().tobytes()
    again = uqr.QTensor.from_bytes(raw, fmt, (7, 2 * block), group_size=g or None)
    assert torch.equal(again.data, qt.data)
    assert torch.equal(uqr.dequantize(again), uqr.dequantize(qt))
    # quantizing the decoded values needs not give the same bytes, but to() must keep them
    assert torch.equal(qt.to("cpu").data, qt.data)


def accelerators():
    devices = []
    if torch.cuda.is_available():
        devices.append("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        devices.append("mps")
    return devices or [pytest.param("cuda", marks=pytest.mark.skip(reason="no CUDA or MPS device here"))]


@pytest.mark.parametrize("device", accelerators())
@pytest.mark.parametrize("fmt,g", CASES)
def test_decode_and_quantize_on_accelerator(fmt, g, device, gen):
    """The decoder is the kernels' reference on every device: same bits as on the CPU."""
    block = block_geometry(fmt, g or None)[0]
    N, K = 33, 4 * block
    data = get(fmt).random_blocks(N, K, gen, **({"group_size": g} if g else {}))
    qt = uqr.QTensor.from_bytes(data.to(device), fmt, (N, K), group_size=g or None)
    assert qt.data.device.type == device
    on_device = uqr.dequantize(qt)
    assert on_device.device.type == device
    assert torch.equal(on_device.cpu(), uqr.dequantize(qt.to("cpu")))
    w = torch.randn(N, K, generator=gen)
    qd = uqr.quantize(w.to(device), fmt, group_size=g or None)
    assert qd.data.device.type == device
    # float reductions may order differently per device, so compare quality, not bytes
    err_dev = (uqr.dequantize(qd).cpu() - w).pow(2).mean()
    err_cpu = (uqr.dequantize(uqr.quantize(w, fmt, group_size=g or None)) - w).pow(2).mean()
    assert err_dev <= err_cpu * 1.05


@pytest.mark.parametrize("fmt,g", [("q4_k", 0), ("var_affine", 0), ("mlx4", 32), ("ternary", 0)])
def test_row_slicing_is_invisible(fmt, g, gen, monkeypatch):
    """quantize/dequantize/from_bytes work in row slices on big matrices; slices must not show."""
    import torch_uqr.qtensor as qtensor_module
    block = block_geometry(fmt, g or None)[0]
    w = torch.randn(11, 2 * block, generator=gen)
    whole = uqr.quantize(w, fmt, group_size=g or None)
    monkeypatch.setattr(qtensor_module, "_SLICE_WEIGHTS", 5 * block)   # 2 rows per slice, ragged end
    sliced = uqr.quantize(w, fmt, group_size=g or None)
    assert torch.equal(sliced.data, whole.data)
    again = uqr.QTensor.from_bytes(sliced.data, fmt, (11, 2 * block), group_size=g or None)
    assert torch.equal(uqr.dequantize(again), whole.dequantize())
    bad = whole.data.clone()
    bad[10, 0:2] = torch.tensor([0x00, 0x7C], dtype=torch.uint8)   # +Inf scale in the last slice
    with pytest.raises(ValueError, match=r"block 0 has a non-finite.*counted from row 10; 2 blocks per row"):
        uqr.QTensor.from_bytes(bad, fmt, (11, 2 * block), group_size=g or None)
