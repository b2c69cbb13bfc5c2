"""Random valid packed weights and an independent float64 decoder, for the CUDA and Triton tests.

Random *bytes* (not quantized weights) exercise every code path of a decoder: negative scales,
every nibble, every var_affine depth mix, every exl3 codebook index. The float64 decoder here is
written with whole-tensor torch ops, on purpose unlike the Triton per-tile decoders, so the two
cannot share a bug; it runs on any device, so GPU tests check kernels against it on the GPU.
"""
from __future__ import annotations

import torch

from torch_uqr.backends.cuda.formats_meta import block_geometry
from torch_uqr.formats.table import spec


def _half_bytes(shape: tuple[int, ...], scale: float, gen: torch.Generator, device) -> torch.Tensor:
    """fp16 values ~ N(0, scale^2) as their 2 little-endian bytes: uint8 [*shape, 2]."""
    v = (torch.randn(shape, generator=gen, device=device) * scale).to(torch.float16)
    return v.view(torch.uint8).reshape(*shape, 2)


def _rand_bytes(shape: tuple[int, ...], gen: torch.Generator, device, high: int = 256) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=gen, device=device, dtype=torch.uint8)


def _var_affine_depths(shape: tuple[int, int], gen: torch.Generator, device) -> torch.Tensor:
    """Per-sub-block depths in {3,4,5} with 32 * sum <= 1024 bits per block: int64 [*shape, 8]."""
    depths = torch.randint(3, 6, (*shape, 8), generator=gen, device=device)
    over = depths.sum(-1, keepdim=True) > 32
    # Over-budget blocks drop every 5 to 4, which always fits (sum <= 32) and keeps 3/4 mixes.
    return torch.where(over & (depths == 5), torch.full_like(depths, 4), depths)


def _bitstream_mask(used_bits: torch.Tensor, nbytes: int) -> torch.Tensor:
    """uint8 [..., nbytes] with bit n set iff n < used_bits (so unused trailing bits are zero)."""
    bit = torch.arange(nbytes * 8, device=used_bits.device)
    keep = (bit < used_bits.unsqueeze(-1)).to(torch.uint8).reshape(*used_bits.shape, nbytes, 8)
    weights = (2 ** torch.arange(8, device=used_bits.device)).to(torch.uint8)
    return (keep * weights).sum(-1).to(torch.uint8)


def random_packed(fmt: str, N: int, K: int, group_size: int = 0, seed: int = 0,
                  device: str | torch.device = "cpu", scale: float = 0.02) -> torch.Tensor:
    """A valid random weight of ``fmt``: uint8 [N, row_bytes] laid out as docs/formats.md says."""
    elems, nbytes = block_geometry(fmt, group_size)
    if K % elems:
        raise ValueError(f"K: must be a multiple of {fmt}'s block of {elems}, got {K}")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    nb = K // elems
    shp = (N, nb)
    if fmt == "q4_0":
        fields = [_half_bytes(shp, scale, gen, device), _rand_bytes((*shp, 16), gen, device)]
    elif fmt == "q4_1":
        fields = [_half_bytes(shp, scale, gen, device), _half_bytes(shp, 8 * scale, gen, device),
                  _rand_bytes((*shp, 16), gen, device)]
    elif fmt == "q8_0":
        fields = [_half_bytes(shp, scale / 8, gen, device), _rand_bytes((*shp, 32), gen, device)]
    elif fmt == "q4_k":
        fields = [_half_bytes(shp, scale / 64, gen, device), _half_bytes(shp, scale / 64, gen, device),
                  _rand_bytes((*shp, 12), gen, device), _rand_bytes((*shp, 128), gen, device)]
    elif spec(fmt).family == "mlx":
        fields = [_half_bytes(shp, scale * 16 / (1 << spec(fmt).code_bits), gen, device),
                  _half_bytes(shp, 8 * scale, gen, device),
                  _rand_bytes((*shp, group_size * spec(fmt).code_bits // 8), gen, device)]
    elif fmt == "var_affine":
        depths = _var_affine_depths(shp, gen, device)
        qs = _rand_bytes((*shp, 128), gen, device) & _bitstream_mask(32 * depths.sum(-1), 128)
        fields = [_half_bytes(shp, scale / 256, gen, device), _half_bytes(shp, scale / 256, gen, device),
                  _rand_bytes((*shp, 8), gen, device), _rand_bytes((*shp, 8), gen, device),
                  depths.to(torch.uint8), torch.zeros((*shp, 4), dtype=torch.uint8, device=device), qs]
    elif fmt == "exl3":
        fields = [_half_bytes(shp, scale / 4096, gen, device), _half_bytes(shp, scale, gen, device),
                  _rand_bytes((*shp, 8), gen, device), _rand_bytes((*shp, 8), gen, device),
                  _rand_bytes((*shp, 16), gen, device), torch.zeros((*shp, 12), dtype=torch.uint8, device=device),
                  _rand_bytes((*shp, 96), gen, device)]
    elif fmt == "ternary":
        codes = torch.randint(0, 3, (N, nb, 32), generator=gen, device=device)
        # Element i: byte 4 + i // 4 (u32 words are little-endian), bits 2 * (i % 4).
        packed = (codes.reshape(N, nb, 8, 4) << (2 * torch.arange(4, device=device))).sum(-1)
        fields = [_half_bytes(shp, scale, gen, device), torch.zeros((*shp, 2), dtype=torch.uint8, device=device),
                  packed.to(torch.uint8)]
    elif fmt in ("q5_0", "q5_1"):
        fields = [_half_bytes(shp, scale, gen, device)]
        fields += [_half_bytes(shp, 16 * scale, gen, device)] if fmt == "q5_1" else []
        fields += [_rand_bytes((*shp, 20), gen, device)]
    elif fmt == "q6_k":
        fields = [_rand_bytes((*shp, 208), gen, device), _half_bytes(shp, scale / 256, gen, device)]
    elif fmt == "q5_k":
        fields = [_half_bytes(shp, scale / 128, gen, device), _half_bytes(shp, scale / 128, gen, device),
                  _rand_bytes((*shp, 172), gen, device)]
    elif fmt == "iq4_nl":
        fields = [_half_bytes(shp, scale / 64, gen, device), _rand_bytes((*shp, 16), gen, device)]
    elif fmt == "iq4_xs":
        fields = [_half_bytes(shp, scale / 1024, gen, device), _rand_bytes((*shp, 134), gen, device)]
    elif fmt == "q3_k":
        fields = [_rand_bytes((*shp, 108), gen, device), _half_bytes(shp, scale / 64, gen, device)]
    elif fmt == "q2_k":
        fields = [_rand_bytes((*shp, 80), gen, device), _half_bytes(shp, scale / 8, gen, device),
                  _half_bytes(shp, scale / 8, gen, device)]
    elif fmt == "mxfp4":  # exponents around the scale: 2^(e-128) near scale / 4
        fields = [_rand_bytes((*shp, 1), gen, device, 4) + 118, _rand_bytes((*shp, 16), gen, device)]
    else:  # block_geometry already rejected unknown names
        raise AssertionError(fmt)
    data = torch.cat(fields, dim=-1)
    assert data.shape[-1] == nbytes, (fmt, data.shape)
    return data.reshape(N, nb * nbytes).contiguous()


def _f16(b: torch.Tensor, off: int) -> torch.Tensor:
    """fp16 field at byte ``off`` of every block, as float64 [N, nb]."""
    return b[..., off:off + 2].contiguous().view(torch.float16)[..., 0].double()


def _bits(stream: torch.Tensor, bit_off: torch.Tensor, width: torch.Tensor | int) -> torch.Tensor:
    """LSB-first ``width``-bit values at ``bit_off`` of a per-block byte stream [N, nb, L] (int64)."""
    nbytes = stream.shape[-1]
    bits = ((stream.long().unsqueeze(-1) >> torch.arange(8, device=stream.device)) & 1).reshape(*stream.shape[:-1], nbytes * 8)
    width = torch.as_tensor(width, device=stream.device).expand_as(bit_off)
    val = torch.zeros_like(bit_off)
    for t in range(int(width.max())):
        pos = (bit_off + t).clamp(max=nbytes * 8 - 1)
        val += torch.where(t < width, torch.gather(bits, -1, pos) << t, torch.zeros_like(val))
    return val


def reference_dequantize(data: torch.Tensor, fmt: str, N: int, K: int, group_size: int = 0) -> torch.Tensor:
    """Decode packed weights to float64 [N, K] straight from docs/formats.md's formulas."""
    elems, nbytes = block_geometry(fmt, group_size)
    b = data.reshape(N, K // elems, nbytes)
    i = torch.arange(elems, device=data.device)
    if fmt in ("q4_0", "q4_1"):
        off = 2 if fmt == "q4_0" else 4
        q = ((b[..., off + (i % 16)].long() >> (4 * (i // 16))) & 15).double()
        y = (q - 8) * _f16(b, 0)[..., None] if fmt == "q4_0" else q * _f16(b, 0)[..., None] + _f16(b, 2)[..., None]
    elif fmt == "q8_0":
        y = b[..., 2:34].contiguous().view(torch.int8).double() * _f16(b, 0)[..., None]
    elif fmt in ("q4_k", "q5_k"):
        s = b[..., 4:16].long()
        j = torch.arange(8, device=data.device)
        lo = j < 4
        jm4 = torch.where(lo, j, j - 4)
        sc = torch.where(lo, s[..., j] & 63, (s[..., (j + 4) % 12] & 15) | ((s[..., jm4] >> 6) << 4))
        mn = torch.where(lo, s[..., (j + 4) % 12] & 63, (s[..., (j + 4) % 12] >> 4) | ((s[..., j] >> 6) << 4))
        sub = i // 32
        qs = 16 if fmt == "q4_k" else 48
        q = ((b[..., qs + 32 * (sub // 2) + i % 32].long() >> (4 * (sub % 2))) & 15).double()
        if fmt == "q5_k":  # bit 4 of sub-block j's element t: bit j of qh[t]
            q = q + 16 * ((b[..., 16 + i % 32].long() >> sub) & 1).double()
        y = _f16(b, 0)[..., None] * sc[..., sub].double() * q - _f16(b, 2)[..., None] * mn[..., sub].double()
    elif fmt in ("q5_0", "q5_1"):
        qh = 2 if fmt == "q5_0" else 4
        low = (b[..., qh + 4 + i % 16].long() >> (4 * (i // 16))) & 15
        q = (low + 16 * ((b[..., qh + i // 8].long() >> (i % 8)) & 1)).double()
        y = (q - 16) * _f16(b, 0)[..., None] if fmt == "q5_0" else q * _f16(b, 0)[..., None] + _f16(b, 2)[..., None]
    elif fmt == "q6_k":
        half, e = i // 128, i % 128
        low = (b[..., 64 * half + e % 64].long() >> (4 * (e // 64))) & 15
        high = (b[..., 128 + 32 * half + e % 32].long() >> (2 * (e // 32))) & 3
        sc = b[..., 192:208].contiguous().view(torch.int8).double()[..., i // 16]
        y = _f16(b, 208)[..., None] * sc * (low + 16 * high - 32).double()
    elif spec(fmt).family == "mlx":  # element i: bits [B i, B i + B) of the codes after the two halves
        width = spec(fmt).code_bits
        q = _bits(b[..., 4:], (i * width).expand(*b.shape[:-1], elems).contiguous(), width).double()
        y = _f16(b, 0)[..., None] * q + _f16(b, 2)[..., None]
    elif fmt == "var_affine":
        depth = b[..., 20:28].long() & 7
        start = 32 * (torch.cumsum(depth, -1) - depth)
        sub = i // 32
        d_i = depth[..., sub]
        q = _bits(b[..., 32:160], start[..., sub] + (i % 32) * d_i, d_i).double()
        y = (_f16(b, 0)[..., None] * b[..., 4 + sub].double() * q
             + _f16(b, 2)[..., None] * b[..., 12 + sub].double())
    elif fmt == "exl3":
        k = _bits(b[..., 48:144], (3 * i).expand(N, K // elems, elems).contiguous(), 3)
        cb = b[..., 20:36].contiguous().view(torch.int8).double()
        sub = i // 32
        y = (_f16(b, 0)[..., None] * (b[..., 4 + sub].double() * torch.gather(cb, -1, k)
                                      + b[..., 12 + sub].double() * torch.gather(cb, -1, k + 8))
             + _f16(b, 2)[..., None])
    elif fmt == "ternary":
        code = (b[..., 4 + i // 4].long() >> (2 * (i % 4))) & 3
        y = (code - 1).double() * _f16(b, 0)[..., None]
    elif fmt in ("iq4_nl", "mxfp4"):
        table = _IQ4 if fmt == "iq4_nl" else _MXFP4
        q = (b[..., (2 if fmt == "iq4_nl" else 1) + i % 16].long() >> (4 * (i // 16))) & 15
        d = _f16(b, 0) if fmt == "iq4_nl" else torch.exp2(b[..., 0].double() - 128)
        y = d[..., None] * table.to(data.device)[q]
    elif fmt == "iq4_xs":
        sub = i // 32
        lo = (b[..., 4 + sub // 2].long() >> (4 * (sub % 2))) & 15
        hi = ((b[..., 2].long() | (b[..., 3].long() << 8))[..., None] >> (2 * sub)) & 3
        q = (b[..., 8 + 16 * sub + i % 16].long() >> (4 * ((i % 32) // 16))) & 15
        y = _f16(b, 0)[..., None] * ((lo | (hi << 4)) - 32).double() * _IQ4.to(data.device)[q]
    elif fmt in ("q3_k", "q2_k"):
        sub = i // 16  # element i = 128h + 32s + l: 2 low bits at bits 2s of qs[32h + l]
        qs = 32 if fmt == "q3_k" else 16
        q = (b[..., qs + 32 * (i // 128) + i % 32].long() >> (2 * ((i // 32) % 4))) & 3
        if fmt == "q3_k":
            q = q | (((b[..., i % 32].long() >> (i // 32)) & 1) << 2)
            sc = ((b[..., 96 + sub % 8].long() >> (4 * (sub // 8))) & 15) | \
                 (((b[..., 104 + sub % 4].long() >> (2 * (sub // 4))) & 3) << 4)
            y = _f16(b, 108)[..., None] * (sc - 32).double() * (q - 4).double()
        else:
            sc = b[..., sub].long()
            y = _f16(b, 80)[..., None] * (sc & 15).double() * q.double() - _f16(b, 82)[..., None] * (sc >> 4).double()
    else:
        raise AssertionError(fmt)
    return y.reshape(N, K)


# The GGUF level tables (docs/formats.md): iq4_nl's non-linear levels, mxfp4's doubled E2M1 values.
_IQ4 = torch.tensor([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=torch.float64)
_MXFP4 = torch.tensor([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=torch.float64)
