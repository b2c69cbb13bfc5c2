"""GGUF ``q6_K``: 256 weights in 210 bytes, ``u8 ql[128]; u8 qh[64]; i8 scales[16]; half d``.

Sixteen sub-blocks of 16 with a signed 8-bit scale each; ``y = (d·scales[e/16])·(q - 32)`` with
6-bit codes q. Each half h (elements 128h..128h+127) has ql bytes 64h..64h+63 and qh bytes
32h..32h+31: element 128h + e takes its low 4 bits from ql[64h + e mod 64] (low nibble for
e < 64, high nibble above) and its top 2 bits from bits 2(e/32), 2(e/32)+1 of qh[32h + e mod 32].
"""
from __future__ import annotations

import torch

from ._bytes import as_blocks, f16_field, random_f16, read_f16
from ._checks import f16_or_raise, require_finite_f16
from ._ggml import GROUP_MAX_EPS, make_qx_quants, rdiv, sliced

NAME = "q6_k"
BLOCK = 256
BLOCK_BYTES = 210
QL, QH, SCALES, D = 0, 128, 192, 208  # byte offsets of the fields

_PAIRS = torch.arange(4, dtype=torch.int32).reshape(1, 1, 4, 1) * 2


def split_codes(ql: torch.Tensor, qh: torch.Tensor) -> torch.Tensor:
    """ql ``[n, 128]``, qh ``[n, 64]`` -> codes int32 ``[n, 256]`` in [0, 63], element order."""
    lo = ql.to(torch.int32).reshape(-1, 2, 1, 64)
    lo = torch.cat([lo & 15, lo >> 4], 2).reshape(-1, 2, 4, 32)       # [n, half, e / 32, e % 32]
    hi = (qh.to(torch.int32).reshape(-1, 2, 1, 32) >> _PAIRS.to(ql.device)) & 3
    return (lo | (hi << 4)).reshape(-1, 256)


def join_codes(codes: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`split_codes`: codes ``[n, 256]`` -> ql + qh bytes ``[n, 192]``."""
    q = codes.to(torch.int32).reshape(-1, 2, 4, 32)
    lo = q & 15
    ql = torch.cat([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], 2).reshape(-1, 128)
    qh = ((q >> 4) << _PAIRS.to(codes.device)).sum(2).reshape(-1, 64)
    return torch.cat([ql, qh], 1).to(torch.uint8)


def quantize(w: torch.Tensor, group_size: int = 0) -> torch.Tensor:
    """ggml's reference quantizer (``quantize_row_q6_K_ref``), byte for byte.

    Each sub-block's scale by ggml's ``make_qx_quants`` search (weights x²); the 16 scales coded
    as int8 multiples of fp16 ``d = max scale / -128`` (the scale of largest magnitude), the codes
    chosen again against the stored scales. A block whose scales are all ~0 is all zero bytes.
    """
    scale, searched = sliced(w.reshape(-1, 16), lambda x: make_qx_quants(x, 32))
    x = w.detach().to("cpu", torch.float32).reshape(-1, 16, 16)
    n = x.shape[0]
    scale = scale.reshape(n, 16)
    imax = scale.abs().argmax(1, keepdim=True)  # the first of largest magnitude, as ggml's scan
    max_scale = torch.gather(scale, 1, imax).squeeze(1)
    zero = max_scale.abs() < float(GROUP_MAX_EPS)
    max_scale = torch.where(zero, torch.ones_like(max_scale), max_scale)
    iscale = rdiv(-128, max_scale)
    d = f16_or_raise(torch.where(zero, torch.zeros_like(iscale), rdiv(1, iscale)), NAME, "scale d")
    sc = torch.round(iscale.unsqueeze(1) * scale).clamp(max=127).to(torch.int32)
    sc = torch.where(zero.unsqueeze(1), torch.zeros_like(sc), sc)
    step = (d.unsqueeze(1) * sc.float()).unsqueeze(2)
    fresh = torch.round(x / step).clamp(-32, 31).to(torch.int32) + 32
    # A sub-block whose stored scale is 0 keeps the codes of its search (ggml skips it).
    codes = torch.where(step != 0, fresh, searched.t().reshape(n, 16, 16))
    codes = torch.where(zero.reshape(n, 1, 1), torch.zeros_like(codes), codes)
    fields = [join_codes(codes.reshape(n, 256)), sc.to(torch.int8).view(torch.uint8), f16_field(d)]
    return torch.cat(fields, 1).reshape(w.shape[0], -1).to(w.device)


def decode(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> torch.Tensor:
    """Exact float32 ``[N, K]``: ``(d·scale)·(q - 32)`` (exact: 11 + 8 + 6 significant bits)."""
    b = as_blocks(data, BLOCK_BYTES)
    q = (split_codes(b[:, QL:QH], b[:, QH:SCALES]) - 32).reshape(-1, 16, 16).float()
    sc = b[:, SCALES:D].contiguous().view(torch.int8).float()
    step = (read_f16(b, D).unsqueeze(1) * sc).unsqueeze(2)
    return (step * q).reshape(N, K)


def validate(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> None:
    """Reject a non-finite ``d`` (every code and int8 scale, -128 included, is valid)."""
    require_finite_f16(read_f16(as_blocks(data, BLOCK_BYTES), D), NAME, "scale d")


def random_blocks(N: int, K: int, generator: torch.Generator, group_size: int = 0) -> torch.Tensor:
    """Random valid rows (random codes and scales, finite super-scale)."""
    n = N * K // BLOCK
    rest = torch.randint(0, 256, (n, 208), generator=generator, dtype=torch.uint8)
    return torch.cat([rest, f16_field(random_f16(n, generator, 0.002))], 1).reshape(N, -1)
