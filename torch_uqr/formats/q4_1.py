"""GGUF ``q4_1``: 32 weights in 20 bytes, ``half d; half m; u8 qs[16]``, ``y = q·d + m``.

Nibble order as in q4_0 (byte j: element j low, element j + 16 high).
"""
from __future__ import annotations

import torch

from ._bytes import as_blocks, f16_field, random_f16, read_f16
from ._checks import require_finite_f16
from ._ggml import min_max_codes
from .q4_0 import join_nibbles, split_nibbles

NAME = "q4_1"
BLOCK = 32
BLOCK_BYTES = 20


def quantize(w: torch.Tensor, group_size: int = 0) -> torch.Tensor:
    """ggml's reference quantizer, bit for bit: ``d = (max - min)/15``, ``m = min``."""
    d, m, q = min_max_codes(w.reshape(-1, BLOCK), 15, NAME)
    return torch.cat([f16_field(d), f16_field(m), join_nibbles(q)], 1).reshape(w.shape[0], -1)


def decode(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> torch.Tensor:
    """Exact float32 ``[N, K]`` values of q4_1 rows."""
    b = as_blocks(data, BLOCK_BYTES)
    d = read_f16(b, 0).unsqueeze(1)
    m = read_f16(b, 2).unsqueeze(1)
    return (split_nibbles(b[:, 4:20]).float() * d + m).reshape(N, K)


def validate(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> None:
    """Reject non-finite scales or mins."""
    b = as_blocks(data, BLOCK_BYTES)
    require_finite_f16(read_f16(b, 0), NAME, "scale d")
    require_finite_f16(read_f16(b, 2), NAME, "min m")


def random_blocks(N: int, K: int, generator: torch.Generator, group_size: int = 0) -> torch.Tensor:
    """Random valid rows."""
    n = N * K // BLOCK
    qs = torch.randint(0, 256, (n, 16), generator=generator, dtype=torch.uint8)
    fields = [f16_field(random_f16(n, generator)), f16_field(random_f16(n, generator)), qs]
    return torch.cat(fields, 1).reshape(N, -1)
