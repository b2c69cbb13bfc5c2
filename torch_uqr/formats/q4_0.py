"""GGUF ``q4_0``: 32 weights in 18 bytes, ``half d; u8 qs[16]``, ``y = (q - 8)·d``.

Byte j of qs holds element j (low nibble) and element j + 16 (high nibble).
"""
from __future__ import annotations

import torch

from ._bytes import as_blocks, f16_field, random_f16, read_f16
from ._checks import f16_or_raise, require_finite_f16

NAME = "q4_0"
BLOCK = 32
BLOCK_BYTES = 18


def split_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """GGUF's 16-byte nibble order -> 32 codes (low nibbles are elements 0-15, high ones 16-31)."""
    q = qs.to(torch.int32)
    return torch.cat([q & 15, q >> 4], dim=-1)


def join_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`split_nibbles` for codes ``[..., 32]`` in [0, 15]."""
    codes = codes.to(torch.int32)
    return (codes[..., :16] | (codes[..., 16:] << 4)).to(torch.uint8)


def symmetric_codes(x: torch.Tensor, zero: int, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml's q4_0 / q5_0 rounding of blocks ``x`` ``[n, 32]`` with codes 0..2·zero-1 around
    ``zero``: ``d = v/-zero`` for the element v of largest magnitude (the first on ties), codes
    ``trunc(x/d + zero + 0.5)``. Returns (fp16-rounded d ``[n]``, codes ``[n, 32]``)."""
    imax = x.abs().argmax(-1, keepdim=True)
    d = torch.gather(x, 1, imax).squeeze(1) / -zero
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.trunc(x * inv.unsqueeze(1) + (zero + 0.5)).clamp(0, 2 * zero - 1)
    return f16_or_raise(d, name, "scale d"), q


def quantize(w: torch.Tensor, group_size: int = 0) -> torch.Tensor:
    """ggml's reference quantizer, bit for bit: ``d = v/-8`` for the element v of largest magnitude."""
    d, q = symmetric_codes(w.reshape(-1, BLOCK), 8, NAME)
    return torch.cat([f16_field(d), join_nibbles(q)], 1).reshape(w.shape[0], -1)


def decode(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> torch.Tensor:
    """Exact float32 ``[N, K]`` values of q4_0 rows."""
    b = as_blocks(data, BLOCK_BYTES)
    d = read_f16(b, 0)
    q = split_nibbles(b[:, 2:18]) - 8
    return (q.float() * d.unsqueeze(1)).reshape(N, K)


def validate(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> None:
    """Every field is meaningful except a non-finite scale."""
    require_finite_f16(read_f16(as_blocks(data, BLOCK_BYTES), 0), NAME, "scale d")


def random_blocks(N: int, K: int, generator: torch.Generator, group_size: int = 0) -> torch.Tensor:
    """Random valid rows: random nibbles, random finite scales."""
    n = N * K // BLOCK
    qs = torch.randint(0, 256, (n, 16), generator=generator, dtype=torch.uint8)
    return torch.cat([f16_field(random_f16(n, generator)), qs], 1).reshape(N, -1)
