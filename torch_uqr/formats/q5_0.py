"""GGUF ``q5_0``: 32 weights in 22 bytes, ``half d; u8 qh[4]; u8 qs[16]``, ``y = (q - 16)·d``.

q is 5 bits: its low 4 in qs as in q4_0 (byte j: element j low nibble, element j + 16 high
nibble), its top bit in bit i of the little-endian 32-bit word qh for element i.
"""
from __future__ import annotations

import torch

from ._bytes import as_blocks, f16_field, random_f16, read_f16
from ._checks import require_finite_f16
from .q4_0 import join_nibbles, split_nibbles, symmetric_codes

NAME = "q5_0"
BLOCK = 32
BLOCK_BYTES = 22

_BITS = torch.arange(32, dtype=torch.int32)


def split_codes(qh: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    """qh ``[n, 4]`` and qs ``[n, 16]`` -> the 32 five-bit codes int32 ``[n, 32]`` in element order."""
    h = qh.to(torch.int32)
    word = h[:, 0] | (h[:, 1] << 8) | (h[:, 2] << 16) | (h[:, 3] << 24)
    high = (word.unsqueeze(1) >> _BITS.to(qh.device)) & 1
    return split_nibbles(qs) | (high << 4)


def join_codes(codes: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`split_codes`: codes ``[n, 32]`` in [0, 31] -> qh ``[n, 4]`` + qs ``[n, 16]``."""
    codes = codes.to(torch.int32)
    high = (codes >> 4).reshape(-1, 4, 8) << torch.arange(8, dtype=torch.int32, device=codes.device)
    qh = high.sum(2).to(torch.uint8)
    return torch.cat([qh, join_nibbles(codes & 15)], 1)


def quantize(w: torch.Tensor, group_size: int = 0) -> torch.Tensor:
    """ggml's reference quantizer, bit for bit: ``d = v/-16`` for the element v of largest magnitude."""
    d, q = symmetric_codes(w.reshape(-1, BLOCK), 16, NAME)
    return torch.cat([f16_field(d), join_codes(q)], 1).reshape(w.shape[0], -1)


def decode(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> torch.Tensor:
    """Exact float32 ``[N, K]`` values of q5_0 rows."""
    b = as_blocks(data, BLOCK_BYTES)
    q = split_codes(b[:, 2:6], b[:, 6:22]) - 16
    return (q.float() * read_f16(b, 0).unsqueeze(1)).reshape(N, K)


def validate(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> None:
    """Every field is meaningful except a non-finite scale."""
    require_finite_f16(read_f16(as_blocks(data, BLOCK_BYTES), 0), NAME, "scale d")


def random_blocks(N: int, K: int, generator: torch.Generator, group_size: int = 0) -> torch.Tensor:
    """Random valid rows: random codes, random finite scales."""
    n = N * K // BLOCK
    rest = torch.randint(0, 256, (n, 20), generator=generator, dtype=torch.uint8)
    return torch.cat([f16_field(random_f16(n, generator)), rest], 1).reshape(N, -1)
