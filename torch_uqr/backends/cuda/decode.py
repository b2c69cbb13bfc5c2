"""Per-format decoders in Triton: packed bytes -> fp32 weight tiles (docs/formats.md, exact up to
fp32 rounding of the scale products).

One interface for every format:

    w, kl = decode_tile(w_ptr, row_off, n_ok, s0, n_sub, FMT, GROUP, BN, NS)

decodes rows ``row_off`` (byte offsets, [BN,1,1]) over the NS 32-element sub-blocks starting at
sub-block ``s0`` (K columns [32*s0, 32*(s0+NS))) into ``w`` [BN, 32*NS] fp32, *in storage order*:
column e of w holds weight column 32*s0 + kl[e]. A dot product does not care about the order of
k, so the kernels load x at the same ``kl`` and never shuffle the weights back.

Why storage order: the bytes must be loaded contiguously along the tile's fastest dim, or Triton
lays the tile out with lanes across rows and every warp load touches 32 rows (measured: 7x slower
for q4_0). So nibble formats load [.., 16] bytes per sub-block and tl.join the
low and high nibbles; bitstream formats load the sub-block's bytes contiguously and pick each
code's bytes with tl.gather (a register shuffle). Per-block fields (scales, mins) are loaded on
[BN, NS, 1] shapes and broadcast.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .formats_meta import FORMAT_CODES

# The format codes decode_tile branches on: the table's ids (formats_meta.FORMAT_CODES).
Q4_0: tl.constexpr = tl.constexpr(FORMAT_CODES["q4_0"])
Q4_1: tl.constexpr = tl.constexpr(FORMAT_CODES["q4_1"])
Q8_0: tl.constexpr = tl.constexpr(FORMAT_CODES["q8_0"])
Q4_K: tl.constexpr = tl.constexpr(FORMAT_CODES["q4_k"])
MLX4: tl.constexpr = tl.constexpr(FORMAT_CODES["mlx4"])
VAR_AFFINE: tl.constexpr = tl.constexpr(FORMAT_CODES["var_affine"])
EXL3: tl.constexpr = tl.constexpr(FORMAT_CODES["exl3"])
TERNARY: tl.constexpr = tl.constexpr(FORMAT_CODES["ternary"])
Q5_0: tl.constexpr = tl.constexpr(FORMAT_CODES["q5_0"])
Q5_1: tl.constexpr = tl.constexpr(FORMAT_CODES["q5_1"])
Q6_K: tl.constexpr = tl.constexpr(FORMAT_CODES["q6_k"])
Q5_K: tl.constexpr = tl.constexpr(FORMAT_CODES["q5_k"])
IQ4_NL: tl.constexpr = tl.constexpr(FORMAT_CODES["iq4_nl"])
IQ4_XS: tl.constexpr = tl.constexpr(FORMAT_CODES["iq4_xs"])
Q3_K: tl.constexpr = tl.constexpr(FORMAT_CODES["q3_k"])
Q2_K: tl.constexpr = tl.constexpr(FORMAT_CODES["q2_k"])
MXFP4: tl.constexpr = tl.constexpr(FORMAT_CODES["mxfp4"])
MLX2: tl.constexpr = tl.constexpr(FORMAT_CODES["mlx2"])
MLX3: tl.constexpr = tl.constexpr(FORMAT_CODES["mlx3"])
MLX5: tl.constexpr = tl.constexpr(FORMAT_CODES["mlx5"])
MLX6: tl.constexpr = tl.constexpr(FORMAT_CODES["mlx6"])
MLX8: tl.constexpr = tl.constexpr(FORMAT_CODES["mlx8"])


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
def _sub_blocks(n_ok, s0, n_sub, NS: tl.constexpr):
    """Global sub-block indices [1,NS,1] from s0 and which (row, sub-block) pairs exist."""
    s = s0 + tl.arange(0, NS)[None, :, None]
    return s, n_ok & (s < n_sub)


@triton.jit
def _nibble_pairs_kl(NS: tl.constexpr):
    """kl of a tile stored as (sub-block, byte j, nibble h) where element = h*16 + j (q4_0, q4_1)."""
    e = tl.arange(0, NS * 32)
    el = e & 31
    return (e >> 5) * 32 + (el & 1) * 16 + (el >> 1)


@triton.jit
def _join_nibbles(lo, hi, BN: tl.constexpr, NS: tl.constexpr, NATURAL: tl.constexpr):
    """[BN, X, 16|32] low/high-nibble values -> [BN, NS*32]: each byte's two values adjacent
    (storage order), or with NATURAL all low nibbles then all high ones (a register shuffle)."""
    pairs = tl.join(lo, hi)
    if NATURAL:
        pairs = tl.permute(pairs, (0, 1, 3, 2))
    return tl.reshape(pairs, (BN, NS * 32))


@triton.jit
def _decode_q4_01(w_ptr, row_off, n_ok, s0, n_sub, ASYM: tl.constexpr, BN: tl.constexpr, NS: tl.constexpr,
                  NATURAL: tl.constexpr):
    """q4_0 (y = (q - 8) d) and q4_1 (y = q d + m): 16 bytes per block after the halves."""
    s, ok = _sub_blocks(n_ok, s0, n_sub, NS)
    blk = w_ptr + row_off + s.to(tl.int64) * (20 if ASYM else 18)
    d = _f16(blk, ok)
    qs = _u8(blk + (4 if ASYM else 2) + tl.arange(0, 16)[None, None, :], ok)
    if ASYM:
        m = _f16(blk + 2, ok)
        lo = (qs & 15).to(tl.float32) * d + m
        hi = (qs >> 4).to(tl.float32) * d + m
    else:
        lo = ((qs & 15) - 8).to(tl.float32) * d
        hi = ((qs >> 4) - 8).to(tl.float32) * d
    if NATURAL:
        return _join_nibbles(lo, hi, BN, NS, True), tl.arange(0, NS * 32)
    return _join_nibbles(lo, hi, BN, NS, False), _nibble_pairs_kl(NS)


@triton.jit
def _decode_q5_01(w_ptr, row_off, n_ok, s0, n_sub, ASYM: tl.constexpr, BN: tl.constexpr, NS: tl.constexpr,
                  NATURAL: tl.constexpr):
    """q5_0 (y = (q - 16) d) and q5_1 (y = q d + m): q4_0's nibbles plus bit 4 of element e in bit e
    of the 4 bytes qh (byte e / 8), which follow the halves."""
    s, ok = _sub_blocks(n_ok, s0, n_sub, NS)
    blk = w_ptr + row_off + s.to(tl.int64) * (24 if ASYM else 22)
    qh = blk + (4 if ASYM else 2)
    d = _f16(blk, ok)
    j = tl.arange(0, 16)[None, None, :]
    qs = _u8(qh + 4 + j, ok)
    hi_lo = (_u8(qh + (j >> 3), ok) >> (j & 7)) & 1        # elements 0..15
    hi_hi = (_u8(qh + 2 + (j >> 3), ok) >> (j & 7)) & 1    # elements 16..31
    q_lo = (qs & 15) | (hi_lo << 4)
    q_hi = (qs >> 4) | (hi_hi << 4)
    if ASYM:
        m = _f16(blk + 2, ok)
        lo = q_lo.to(tl.float32) * d + m
        hi = q_hi.to(tl.float32) * d + m
    else:
        lo = (q_lo - 16).to(tl.float32) * d
        hi = (q_hi - 16).to(tl.float32) * d
    if NATURAL:
        return _join_nibbles(lo, hi, BN, NS, True), tl.arange(0, NS * 32)
    return _join_nibbles(lo, hi, BN, NS, False), _nibble_pairs_kl(NS)


@triton.jit
def _decode_q6_k(w_ptr, row_off, n_ok, s0, n_sub, BN: tl.constexpr, NS: tl.constexpr):
    """Sub-block j (32 elements) of a block: half h = j / 4, its 32 low nibbles (high for j % 4 >= 2)
    at ql[64h + 32 (j % 2)], its 2-bit tops at bits 2 (j % 4) of qh[32h..], two int8 scales."""
    s, ok = _sub_blocks(n_ok, s0, n_sub, NS)
    blk = w_ptr + row_off + (s >> 3).to(tl.int64) * 210
    j = s & 7
    t = tl.arange(0, 32)[None, None, :]
    lo = (_u8(blk + 64 * (j >> 2) + 32 * (j & 1) + t, ok) >> (4 * ((j >> 1) & 1))) & 15
    hi = (_u8(blk + 128 + 32 * (j >> 2) + t, ok) >> (2 * (j & 3))) & 3
    sc = _i8(blk + 192 + 2 * j + (t >> 4), ok).to(tl.float32)
    w = (_f16(blk + 208, ok) * sc) * ((lo | (hi << 4)) - 32).to(tl.float32)
    return tl.reshape(w, (BN, NS * 32)), tl.arange(0, NS * 32)


@triton.jit
def _decode_q8_0(w_ptr, row_off, n_ok, s0, n_sub, BN: tl.constexpr, NS: tl.constexpr):
    s, ok = _sub_blocks(n_ok, s0, n_sub, NS)
    blk = w_ptr + row_off + s.to(tl.int64) * 34
    q = _i8(blk + 2 + tl.arange(0, 32)[None, None, :], ok)
    w = q.to(tl.float32) * _f16(blk, ok)
    return tl.reshape(w, (BN, NS * 32)), tl.arange(0, NS * 32)


@triton.jit
def _q4_k_scale_min(scales, j, ok):
    """ggml's 6-bit packing: j < 4 reads scales[j], scales[j+4]; j >= 4 combines scales[j+4]'s
    nibbles with the top two bits of scales[j-4] (scale) and scales[j] (min)."""
    a = _u8(scales + j, ok)
    b = _u8(scales + 4 + j, ok)
    c = _u8(scales + tl.where(j < 4, j, j - 4), ok)
    sc = tl.where(j < 4, a & 63, (b & 15) | ((c >> 6) << 4))
    mn = tl.where(j < 4, b & 63, (b >> 4) | ((a >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _decode_q4_k(w_ptr, row_off, n_ok, s0, n_sub, FIVE: tl.constexpr, BN: tl.constexpr, NS: tl.constexpr,
                 NATURAL: tl.constexpr):
    """q4_k and (FIVE) q5_k. Sub-blocks 2c and 2c+1 share qs[32c .. 32c+31] (low / high nibbles):
    decode them as pairs. s0 and NS are even (configs guarantee it), so a tile never splits a pair.
    q5_k: bit 4 of sub-block j's element t is bit j of qh[t] (32 bytes after the scales)."""
    P: tl.constexpr = NS // 2
    c = s0 // 2 + tl.arange(0, P)[None, :, None]           # global pair index
    ok = n_ok & (2 * c < n_sub)
    blk = w_ptr + row_off + (c >> 2).to(tl.int64) * (176 if FIVE else 144)
    cp = c & 3
    d = _f16(blk, ok)
    dmin = _f16(blk + 2, ok)
    sc0, mn0 = _q4_k_scale_min(blk + 4, 2 * cp, ok)
    sc1, mn1 = _q4_k_scale_min(blk + 4, 2 * cp + 1, ok)
    t = tl.arange(0, 32)[None, None, :]
    qs = _u8(blk + (48 if FIVE else 16) + cp * 32 + t, ok)
    q0 = qs & 15
    q1 = qs >> 4
    if FIVE:
        qh = _u8(blk + 16 + t, ok)
        q0 = q0 | (((qh >> (2 * cp)) & 1) << 4)
        q1 = q1 | (((qh >> (2 * cp + 1)) & 1) << 4)
    lo = (d * sc0) * q0.to(tl.float32) - dmin * mn0
    hi = (d * sc1) * q1.to(tl.float32) - dmin * mn1
    if NATURAL:
        return _join_nibbles(lo, hi, BN, NS, True), tl.arange(0, NS * 32)
    e = tl.arange(0, NS * 32)
    el = e & 63
    kl = (e >> 6) * 64 + (el & 1) * 32 + (el >> 1)
    return _join_nibbles(lo, hi, BN, NS, False), kl


@triton.jit
def _decode_mlx4(w_ptr, row_off, n_ok, s0, n_sub, GROUP: tl.constexpr, BN: tl.constexpr, NS: tl.constexpr):
    """Element i of a group is byte i/2, low nibble for even i: joined nibbles are already in order."""
    SUBS: tl.constexpr = GROUP // 32
    s, ok = _sub_blocks(n_ok, s0, n_sub, NS)
    blk = w_ptr + row_off + (s // SUBS).to(tl.int64) * (4 + GROUP // 2)
    scale = _f16(blk, ok)
    bias = _f16(blk + 2, ok)
    qs = _u8(blk + 4 + (s % SUBS) * 16 + tl.arange(0, 16)[None, None, :], ok)
    lo = (qs & 15).to(tl.float32) * scale + bias
    hi = (qs >> 4).to(tl.float32) * scale + bias
    return _join_nibbles(lo, hi, BN, NS, False), tl.arange(0, NS * 32)


@triton.jit
def _decode_mlx_bits(w_ptr, row_off, n_ok, s0, n_sub, GROUP: tl.constexpr, BITS: tl.constexpr, BN: tl.constexpr,
                     NS: tl.constexpr):
    """The MLX family's other widths: a sub-block's 32 codes are the 4·BITS bytes (<= 32) from byte
    4·BITS·(its index in the group) of the group's codes, an LSB-first bitstream."""
    SUBS: tl.constexpr = GROUP // 32
    s, ok = _sub_blocks(n_ok, s0, n_sub, NS)
    blk = w_ptr + row_off + (s // SUBS).to(tl.int64) * (4 + GROUP * BITS // 8)
    scale = _f16(blk, ok)
    bias = _f16(blk + 2, ok)
    t = tl.arange(0, 32)[None, None, :]
    raw = _u8(blk + 4 + (s % SUBS) * (4 * BITS) + t, ok & (t < 4 * BITS))
    q = _gather_bits(raw, t * BITS, BITS)
    w = q.to(tl.float32) * scale + bias
    return tl.reshape(w, (BN, NS * 32)), tl.arange(0, NS * 32)


@triton.jit
def _gather_bits(raw, bit, width):
    """``width``-bit LSB-first values at ``bit`` of the 32 bytes ``raw`` [.., 32] each sub-block
    loaded; a value of <= 9 bits spans 2 bytes, picked by register shuffles (tl.gather)."""
    byte = tl.broadcast_to(bit >> 3, raw.shape)
    bit = tl.broadcast_to(bit, raw.shape)
    lo = tl.gather(raw, byte, axis=2)
    hi = tl.gather(raw, tl.minimum(byte + 1, 31), axis=2)
    return ((lo | (hi << 8)) >> (bit & 7)) & ((1 << width) - 1)


@triton.jit
def _super_block_header(w_ptr, row_off, s, ok, BLOCK_BYTES: tl.constexpr):
    """The header var_affine and exl3 share: half d, half bias, then two u8[8] per-sub-block
    multipliers; returns the block pointer, sub-block j, d, bias and sub-block j's two multipliers."""
    blk = w_ptr + row_off + (s >> 3).to(tl.int64) * BLOCK_BYTES
    j = s & 7
    a = _u8(blk + 4 + j, ok).to(tl.float32)
    b = _u8(blk + 12 + j, ok).to(tl.float32)
    return blk, j, _f16(blk, ok), _f16(blk + 2, ok), a, b


@triton.jit
def _decode_var_affine(w_ptr, row_off, n_ok, s0, n_sub, BN: tl.constexpr, NS: tl.constexpr):
    s, ok = _sub_blocks(n_ok, s0, n_sub, NS)
    blk, j, d, bias, sj, bj = _super_block_header(w_ptr, row_off, s, ok, 160)
    # Sub-block j's codes start after those of sub-blocks 0..j-1 (32 * depth bits each, a
    # multiple of 4 bytes); at most 5 bits x 32 = 20 bytes, so 32 loaded bytes always cover it.
    # Depth mode & 7 clamped to [3, 5] and the start to 128 - 4 depth: formats.h's reading of any bytes.
    jj = tl.arange(0, 8)[None, None, :]
    depths = tl.minimum(tl.maximum(_u8(blk + 20 + jj, ok) & 7, 3), 5)
    depth = tl.sum(tl.where(jj == j, depths, 0), axis=2)[:, :, None]
    start_byte = tl.minimum(4 * tl.sum(tl.where(jj < j, depths, 0), axis=2)[:, :, None], 128 - 4 * depth)
    t = tl.arange(0, 32)[None, None, :]
    raw = _u8(blk + 32 + start_byte + t, ok & (start_byte + t < 128))
    q = _gather_bits(raw, t * depth, depth)
    w = (d * sj) * q.to(tl.float32) + bias * bj
    return tl.reshape(w, (BN, NS * 32)), tl.arange(0, NS * 32)


@triton.jit
def _decode_exl3(w_ptr, row_off, n_ok, s0, n_sub, BN: tl.constexpr, NS: tl.constexpr):
    s, ok = _sub_blocks(n_ok, s0, n_sub, NS)
    blk, j, d, bias, sj, rj = _super_block_header(w_ptr, row_off, s, ok, 144)
    # 32 indices x 3 bits = 12 bytes per sub-block, starting at byte 12 j of qs.
    t = tl.arange(0, 32)[None, None, :]
    raw = _u8(blk + 48 + 12 * j + t, ok & (t < 12))
    k = _gather_bits(raw, 3 * t, 3)
    # The 16 codebook bytes are loaded once per sub-block and looked up by register shuffle, not
    # by two 1-byte global loads per weight (measured: exl3 was 10x slower than q4_0 at M = 1).
    cb = _i8(blk + 20 + tl.arange(0, 16)[None, None, :], ok)
    p = tl.gather(cb, k, axis=2).to(tl.float32)
    r = tl.gather(cb, k + 8, axis=2).to(tl.float32)
    w = d * (sj * p + rj * r) + bias
    return tl.reshape(w, (BN, NS * 32)), tl.arange(0, NS * 32)


@triton.jit
def ternary_codes(w_ptr, row_off, n_ok, s0, n_sub, BN: tl.constexpr, NS: tl.constexpr):
    """Ternary codes [BN, NS, 32] (0, 1, 2 = -1, 0, +1; the invalid 3 read as 1) in k order, and
    the scales [BN, NS, 1].
    Byte j holds elements 4j .. 4j+3 (2 bits each, LSB first): nested joins keep that order."""
    s, ok = _sub_blocks(n_ok, s0, n_sub, NS)
    blk = w_ptr + row_off + s.to(tl.int64) * 12
    d = _f16(blk, ok)
    qs = _u8(blk + 4 + tl.arange(0, 8)[None, None, :], ok)
    qs = qs & ~((qs & 0x55) << 1)  # invalid code 3 -> 1, a zero trit (formats.h's rule)
    codes = tl.join(tl.join(qs & 3, (qs >> 4) & 3), tl.join((qs >> 2) & 3, qs >> 6))
    return tl.reshape(codes, (BN, NS, 32)), d


@triton.jit
def _decode_ternary(w_ptr, row_off, n_ok, s0, n_sub, BN: tl.constexpr, NS: tl.constexpr):
    codes, d = ternary_codes(w_ptr, row_off, n_ok, s0, n_sub, BN, NS)
    return tl.reshape((codes - 1).to(tl.float32) * d, (BN, NS * 32)), tl.arange(0, NS * 32)


@triton.jit
def _lut16(q, MX: tl.constexpr):
    """Level of 4-bit codes q in iq4_nl's table (or mxfp4's doubled E2M1 values with MX): four
    words of four signed bytes (formats.h's UQR_IQ4_WORDS / UQR_MXFP4_WORDS), picked by integer ops."""
    if MX:
        w = tl.where((q & 8) != 0, tl.where((q & 4) != 0, -185009412, -33620224),
                     tl.where((q & 4) != 0, 201852420, 50462976))
    else:
        w = tl.where((q & 8) != 0, tl.where((q & 4) != 0, 1901675829, 639175937),
                     tl.where((q & 4) != 0, -152379953, -1079142271))
    v = (w >> ((q & 3) * 8)) & 255
    return (v - ((v >> 7) << 8)).to(tl.float32)


@triton.jit
def _decode_lut_nibbles(w_ptr, row_off, n_ok, s0, n_sub, MX: tl.constexpr, BN: tl.constexpr, NS: tl.constexpr,
                        NATURAL: tl.constexpr):
    """iq4_nl (half d; qs[16]) and mxfp4 (u8 e; qs[16]): q4_0's nibble order, y = scale * level."""
    s, ok = _sub_blocks(n_ok, s0, n_sub, NS)
    if MX:
        blk = w_ptr + row_off + s.to(tl.int64) * 17
        e = _u8(blk, ok)
        scale = tl.where(e < 2, 0x00200000 << e, (e - 1) << 23).to(tl.float32, bitcast=True)
        qs = _u8(blk + 1 + tl.arange(0, 16)[None, None, :], ok)
    else:
        blk = w_ptr + row_off + s.to(tl.int64) * 18
        scale = _f16(blk, ok)
        qs = _u8(blk + 2 + tl.arange(0, 16)[None, None, :], ok)
    return _lut_tile(qs, scale, MX, BN, NS, NATURAL)


@triton.jit
def _lut_tile(qs, scale, MX: tl.constexpr, BN: tl.constexpr, NS: tl.constexpr, NATURAL: tl.constexpr):
    """16 bytes of q4_0-ordered nibbles per sub-block [BN, NS, 16] -> scale * level, as a tile."""
    lo = _lut16(qs & 15, MX) * scale
    hi = _lut16(qs >> 4, MX) * scale
    if NATURAL:
        return _join_nibbles(lo, hi, BN, NS, True), tl.arange(0, NS * 32)
    return _join_nibbles(lo, hi, BN, NS, False), _nibble_pairs_kl(NS)


@triton.jit
def _decode_iq4_xs(w_ptr, row_off, n_ok, s0, n_sub, BN: tl.constexpr, NS: tl.constexpr, NATURAL: tl.constexpr):
    """Sub-block j of a 136-byte block: 6-bit scale from scales_l / scales_h, qs[16j .. 16j+15]."""
    s, ok = _sub_blocks(n_ok, s0, n_sub, NS)
    blk = w_ptr + row_off + (s >> 3).to(tl.int64) * 136
    j = s & 7
    high = _u8(blk + 2, ok) | (_u8(blk + 3, ok) << 8)
    ls = ((_u8(blk + 4 + (j >> 1), ok) >> (4 * (j & 1))) & 15) | (((high >> (2 * j)) & 3) << 4)
    dl = _f16(blk, ok) * (ls - 32).to(tl.float32)
    qs = _u8(blk + 8 + 16 * j + tl.arange(0, 16)[None, None, :], ok)
    return _lut_tile(qs, dl, False, BN, NS, NATURAL)


@triton.jit
def _decode_q23_k(w_ptr, row_off, n_ok, s0, n_sub, Q3: tl.constexpr, BN: tl.constexpr, NS: tl.constexpr):
    """q3_k (110 bytes) and q2_k (84): 32-element sub-block j is quarter j % 4 of half j / 4 (element
    i's 2 low bits at bits 2 (j % 4) of qs[32 (j / 4) + i]); its two 16-element halves have their own
    scales (q3_k: 6-bit, - 32; q2_k: 4-bit scale and min)."""
    s, ok = _sub_blocks(n_ok, s0, n_sub, NS)
    j = s & 7
    i = tl.arange(0, 32)[None, None, :]
    first = i < 16
    if Q3:
        blk = w_ptr + row_off + (s >> 3).to(tl.int64) * 110
        low = (_u8(blk + 32 + 32 * (j >> 2) + i, ok) >> (2 * (j & 3))) & 3
        q = low | (((_u8(blk + i, ok) >> j) & 1) << 2)
        t0 = 2 * j
        t1 = t0 + 1
        sc0 = ((_u8(blk + 96 + (t0 & 7), ok) >> (4 * (t0 >> 3))) & 15) | (((_u8(blk + 104 + (t0 & 3), ok) >> (2 * (t0 >> 2))) & 3) << 4)
        sc1 = ((_u8(blk + 96 + (t1 & 7), ok) >> (4 * (t1 >> 3))) & 15) | (((_u8(blk + 104 + (t1 & 3), ok) >> (2 * (t1 >> 2))) & 3) << 4)
        d = _f16(blk + 108, ok)
        dl = tl.where(first, d * (sc0 - 32).to(tl.float32), d * (sc1 - 32).to(tl.float32))
        w = dl * (q - 4).to(tl.float32)
    else:
        blk = w_ptr + row_off + (s >> 3).to(tl.int64) * 84
        q = (_u8(blk + 16 + 32 * (j >> 2) + i, ok) >> (2 * (j & 3))) & 3
        sc = tl.where(first, _u8(blk + 2 * j, ok), _u8(blk + 2 * j + 1, ok))
        dl = _f16(blk + 80, ok) * (sc & 15).to(tl.float32)
        ml = _f16(blk + 82, ok) * (sc >> 4).to(tl.float32)
        w = dl * q.to(tl.float32) - ml  # dl * q is exact: a fused multiply-add gives the same bits
    return tl.reshape(w, (BN, NS * 32)), tl.arange(0, NS * 32)


@triton.jit
def decode_tile(w_ptr, row_off, n_ok, s0, n_sub, FMT: tl.constexpr, GROUP: tl.constexpr,
                BN: tl.constexpr, NS: tl.constexpr, NATURAL: tl.constexpr):
    """Decode format ``FMT`` (formats_meta.FORMAT_CODES); see the module docstring. NATURAL asks
    for k order (kl = arange) at the cost of a shuffle: for writing a dense matrix, not for dots."""
    if FMT == Q4_0:
        w, kl = _decode_q4_01(w_ptr, row_off, n_ok, s0, n_sub, False, BN, NS, NATURAL)
    elif FMT == Q4_1:
        w, kl = _decode_q4_01(w_ptr, row_off, n_ok, s0, n_sub, True, BN, NS, NATURAL)
    elif FMT == Q8_0:
        w, kl = _decode_q8_0(w_ptr, row_off, n_ok, s0, n_sub, BN, NS)
    elif FMT == Q4_K:
        w, kl = _decode_q4_k(w_ptr, row_off, n_ok, s0, n_sub, False, BN, NS, NATURAL)
    elif FMT == Q5_K:
        w, kl = _decode_q4_k(w_ptr, row_off, n_ok, s0, n_sub, True, BN, NS, NATURAL)
    elif FMT == Q5_0:
        w, kl = _decode_q5_01(w_ptr, row_off, n_ok, s0, n_sub, False, BN, NS, NATURAL)
    elif FMT == Q5_1:
        w, kl = _decode_q5_01(w_ptr, row_off, n_ok, s0, n_sub, True, BN, NS, NATURAL)
    elif FMT == Q6_K:
        w, kl = _decode_q6_k(w_ptr, row_off, n_ok, s0, n_sub, BN, NS)
    elif FMT == MLX4:
        w, kl = _decode_mlx4(w_ptr, row_off, n_ok, s0, n_sub, GROUP, BN, NS)
    elif FMT == MLX2:
        w, kl = _decode_mlx_bits(w_ptr, row_off, n_ok, s0, n_sub, GROUP, 2, BN, NS)
    elif FMT == MLX3:
        w, kl = _decode_mlx_bits(w_ptr, row_off, n_ok, s0, n_sub, GROUP, 3, BN, NS)
    elif FMT == MLX5:
        w, kl = _decode_mlx_bits(w_ptr, row_off, n_ok, s0, n_sub, GROUP, 5, BN, NS)
    elif FMT == MLX6:
        w, kl = _decode_mlx_bits(w_ptr, row_off, n_ok, s0, n_sub, GROUP, 6, BN, NS)
    elif FMT == MLX8:
        w, kl = _decode_mlx_bits(w_ptr, row_off, n_ok, s0, n_sub, GROUP, 8, BN, NS)
    elif FMT == VAR_AFFINE:
        w, kl = _decode_var_affine(w_ptr, row_off, n_ok, s0, n_sub, BN, NS)
    elif FMT == EXL3:
        w, kl = _decode_exl3(w_ptr, row_off, n_ok, s0, n_sub, BN, NS)
    elif FMT == IQ4_NL:
        w, kl = _decode_lut_nibbles(w_ptr, row_off, n_ok, s0, n_sub, False, BN, NS, NATURAL)
    elif FMT == MXFP4:
        w, kl = _decode_lut_nibbles(w_ptr, row_off, n_ok, s0, n_sub, True, BN, NS, NATURAL)
    elif FMT == IQ4_XS:
        w, kl = _decode_iq4_xs(w_ptr, row_off, n_ok, s0, n_sub, BN, NS, NATURAL)
    elif FMT == Q3_K:
        w, kl = _decode_q23_k(w_ptr, row_off, n_ok, s0, n_sub, True, BN, NS)
    elif FMT == Q2_K:
        w, kl = _decode_q23_k(w_ptr, row_off, n_ok, s0, n_sub, False, BN, NS)
    else:
        # A format without a branch here has no Triton decoder: fail at compile time, never decode
        # its bytes as another format's.
        tl.static_assert(FMT == TERNARY, "decode_tile: no Triton decoder for this format")
        w, kl = _decode_ternary(w_ptr, row_off, n_ok, s0, n_sub, BN, NS)
    return w, kl
