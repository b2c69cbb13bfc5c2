"""GGUF ``q5_1``: 32 weights in 24 bytes, ``half d; half m; u8 qh[4]; u8 qs[16]``, ``y = q·d + m``.

Code bits as in q5_0: low 4 in qs (byte j: element j low, element j + 16 high), bit 4 of
element i in bit i of the little-endian word qh.
"""
from __future__ import annotations

import torch

from ._bytes import as_blocks, f16_field, random_f16, read_f16
from ._checks import require_finite_f16
from ._ggml import min_max_codes
from .q5_0 import join_codes, split_codes

NAME = "q5_1"
BLOCK = 32
BLOCK_BYTES = 24


def quantize(w: torch.Tensor, group_size: int = 0) -> torch.Tensor:
    """ggml's reference quantizer, bit for bit: ``d = (max - min)/31``, ``m = min``."""
    d, m, q = min_max_codes(w.reshape(-1, BLOCK), 31, NAME)
    return torch.cat([f16_field(d), f16_field(m), join_codes(q)], 1).reshape(w.shape[0], -1)


def decode(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> torch.Tensor:
    """Exact float32 ``[N, K]`` values of q5_1 rows (``q·d`` is exact, one rounding in ``+ m``)."""
    b = as_blocks(data, BLOCK_BYTES)
    d = read_f16(b, 0).unsqueeze(1)
    m = read_f16(b, 2).unsqueeze(1)
    return (split_codes(b[:, 4:8], b[:, 8:24]).float() * d + m).reshape(N, K)


def validate(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> None:
    """Reject non-finite scales or mins."""
    b = as_blocks(data, BLOCK_BYTES)
    require_finite_f16(read_f16(b, 0), NAME, "scale d")
    require_finite_f16(read_f16(b, 2), NAME, "min m")


def random_blocks(N: int, K: int, generator: torch.Generator, group_size: int = 0) -> torch.Tensor:
    """Random valid rows."""
    n = N * K // BLOCK
    rest = torch.randint(0, 256, (n, 20), generator=generator, dtype=torch.uint8)
    fields = [f16_field(random_f16(n, generator)), f16_field(random_f16(n, generator)), rest]
    return torch.cat(fields, 1).reshape(N, -1)
