"""Per-format decoders in Triton: packed bytes -> fp32 weight tiles (bit-exact to formats-spec.md).

Every format is cut into 32-element sub-blocks (q4_k / var_affine / exl3 sub-blocks, mlx4 groups in
32-element slices, whole blocks for the 32-element formats), so one interface serves all:

    decode_<fmt>(w_ptr, row_off, s, t, mask, ...) -> fp32 [BN, NS, 32]

``row_off`` [BN,1,1] is the byte offset of each weight row, ``s`` [1,NS,1] the global index of each
sub-block along K, ``t`` [1,1,32] the element inside it, ``mask`` [BN,NS,1] which sub-blocks exist.
Per-block fields (scales, mins) are loaded on the [BN,NS,1] shape and broadcast, so a scale is read
once per sub-block rather than once per element; the repeated byte reads of the nibble formats (two
elements share a byte) are served by L1.
"""
from __future__ import annotations

import triton
import triton.language as tl

Q4_0: tl.constexpr = tl.constexpr(0)
Q4_1: tl.constexpr = tl.constexpr(1)
Q8_0: tl.constexpr = tl.constexpr(2)
Q4_K: tl.constexpr = tl.constexpr(3)
MLX4: tl.constexpr = tl.constexpr(4)
VAR_AFFINE: tl.constexpr = tl.constexpr(5)
EXL3: tl.constexpr = tl.constexpr(6)
TERNARY: tl.constexpr = tl.constexpr(7)


@triton.jit
def _u8(ptr, mask):
    """Unsigned byte(s) as int32 (masked lanes read 0)."""
    return tl.load(ptr, mask=mask, other=0).to(tl.int32)


@triton.jit
def _i8(ptr, mask):
    """Signed byte(s) as int32."""
    return tl.load(ptr.to(tl.pointer_type(tl.int8)), mask=mask, other=0).to(tl.int32)


@triton.jit
def _f16(ptr, mask):
    """fp16 field(s) as fp32; every fp16 field of every format sits at an even byte offset."""
    return tl.load(ptr.to(tl.pointer_type(tl.float16)), mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _stream_bits(qs_ptr, bit, width, nbytes: tl.constexpr, mask):
    """``width``-bit LSB-first values at ``bit`` of a byte stream; widths <= 9 span at most 2 bytes."""
    byte = bit >> 3
    lo = _u8(qs_ptr + byte, mask)
    hi = _u8(qs_ptr + byte + 1, mask & (byte + 1 < nbytes))
    return ((lo | (hi << 8)) >> (bit & 7)) & ((1 << width) - 1)


@triton.jit
def decode_q4_0(w_ptr, row_off, s, t, mask):
    blk = w_ptr + row_off + s.to(tl.int64) * 18
    d = _f16(blk, mask)
    q = (_u8(blk + 2 + (t & 15), mask) >> ((t >> 4) * 4)) & 15
    return (q - 8).to(tl.float32) * d


@triton.jit
def decode_q4_1(w_ptr, row_off, s, t, mask):
    blk = w_ptr + row_off + s.to(tl.int64) * 20
    d = _f16(blk, mask)
    m = _f16(blk + 2, mask)
    q = (_u8(blk + 4 + (t & 15), mask) >> ((t >> 4) * 4)) & 15
    return q.to(tl.float32) * d + m


@triton.jit
def decode_q8_0(w_ptr, row_off, s, t, mask):
    blk = w_ptr + row_off + s.to(tl.int64) * 34
    d = _f16(blk, mask)
    return _i8(blk + 2 + t, mask).to(tl.float32) * d


@triton.jit
def decode_q4_k(w_ptr, row_off, s, t, mask):
    blk = w_ptr + row_off + (s >> 3).to(tl.int64) * 144
    j = s & 7
    d = _f16(blk, mask)
    dmin = _f16(blk + 2, mask)
    # ggml's 6-bit packing: j < 4 reads scales[j], scales[j+4]; j >= 4 combines scales[j+4]'s
    # nibbles with the top two bits of scales[j-4] (scale) and scales[j] (min).
    a = _u8(blk + 4 + j, mask)
    b = _u8(blk + 8 + j, mask)
    c = _u8(blk + 4 + tl.where(j < 4, j, j - 4), mask)
    sc = tl.where(j < 4, a & 63, (b & 15) | ((c >> 6) << 4))
    mn = tl.where(j < 4, b & 63, (b >> 4) | ((a >> 6) << 4))
    q = (_u8(blk + 16 + (j >> 1) * 32 + t, mask) >> ((j & 1) * 4)) & 15
    return (d * sc.to(tl.float32)) * q.to(tl.float32) - dmin * mn.to(tl.float32)


@triton.jit
def decode_mlx4(w_ptr, row_off, s, t, mask, GROUP: tl.constexpr):
    SUBS: tl.constexpr = GROUP // 32
    blk = w_ptr + row_off + (s // SUBS).to(tl.int64) * (4 + GROUP // 2)
    scale = _f16(blk, mask)
    bias = _f16(blk + 2, mask)
    i = (s % SUBS) * 32 + t
    q = (_u8(blk + 4 + (i >> 1), mask) >> ((i & 1) * 4)) & 15
    return q.to(tl.float32) * scale + bias


@triton.jit
def _super_block_header(w_ptr, row_off, s, mask, BLOCK_BYTES: tl.constexpr):
    """The header var_affine and exl3 share: half d, half bias, then two u8[8] per-sub-block
    multipliers; returns the block pointer, sub-block j, d, bias and sub-block j's two multipliers."""
    blk = w_ptr + row_off + (s >> 3).to(tl.int64) * BLOCK_BYTES
    j = s & 7
    a = _u8(blk + 4 + j, mask).to(tl.float32)
    b = _u8(blk + 12 + j, mask).to(tl.float32)
    return blk, j, _f16(blk, mask), _f16(blk + 2, mask), a, b


@triton.jit
def decode_var_affine(w_ptr, row_off, s, t, mask):
    blk, j, d, bias, sj, bj = _super_block_header(w_ptr, row_off, s, mask, 160)
    # Sub-block j starts after the codes of sub-blocks 0..j-1: sum their depths (all 8 modes
    # bytes are read as a [.., 8] strip; L1 serves the repeats).
    jj = tl.arange(0, 8)[None, None, :]
    depths = _u8(blk + 20 + jj, mask) & 7
    start = 32 * tl.sum(tl.where(jj < j, depths, 0), axis=2)[:, :, None]
    depth = tl.sum(tl.where(jj == j, depths, 0), axis=2)[:, :, None]
    q = _stream_bits(blk + 32, start + t * depth, depth, 128, mask)
    return (d * sj) * q.to(tl.float32) + bias * bj


@triton.jit
def decode_exl3(w_ptr, row_off, s, t, mask):
    blk, j, d, bias, sj, rj = _super_block_header(w_ptr, row_off, s, mask, 144)
    k = _stream_bits(blk + 48, 3 * (j * 32 + t), 3, 96, mask)
    p = _i8(blk + 20 + k, mask).to(tl.float32)
    r = _i8(blk + 28 + k, mask).to(tl.float32)
    return d * (sj * p + rj * r) + bias


@triton.jit
def ternary_codes(w_ptr, row_off, s, t, mask):
    """Ternary codes (0, 1, 2 = -1, 0, +1) and the block scale, for the decode and the vec path."""
    blk = w_ptr + row_off + s.to(tl.int64) * 12
    d = _f16(blk, mask)
    code = (_u8(blk + 4 + (t >> 2), mask) >> ((t & 3) * 2)) & 3
    return code, d


@triton.jit
def decode_ternary(w_ptr, row_off, s, t, mask):
    code, d = ternary_codes(w_ptr, row_off, s, t, mask)
    return (code - 1).to(tl.float32) * d


@triton.jit
def decode_tile(w_ptr, row_off, s, t, mask, FMT: tl.constexpr, GROUP: tl.constexpr):
    """Decode [BN, NS, 32] weights of format code ``FMT`` (formats_meta.FORMAT_CODES) to fp32."""
    if FMT == Q4_0:
        w = decode_q4_0(w_ptr, row_off, s, t, mask)
    elif FMT == Q4_1:
        w = decode_q4_1(w_ptr, row_off, s, t, mask)
    elif FMT == Q8_0:
        w = decode_q8_0(w_ptr, row_off, s, t, mask)
    elif FMT == Q4_K:
        w = decode_q4_k(w_ptr, row_off, s, t, mask)
    elif FMT == MLX4:
        w = decode_mlx4(w_ptr, row_off, s, t, mask, GROUP)
    elif FMT == VAR_AFFINE:
        w = decode_var_affine(w_ptr, row_off, s, t, mask)
    elif FMT == EXL3:
        w = decode_exl3(w_ptr, row_off, s, t, mask)
    else:
        w = decode_ternary(w_ptr, row_off, s, t, mask)
    return w
