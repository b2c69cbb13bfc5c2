"""GGUF ``q8_0``: 32 weights in 34 bytes, ``half d; i8 qs[32]``, ``y = q·d``."""
from __future__ import annotations

import torch

from ._bytes import as_blocks, f16_field, random_f16, read_f16, round_half_away
from ._checks import f16_or_raise, require_finite_f16

NAME = "q8_0"
BLOCK = 32
BLOCK_BYTES = 34


def quantize(w: torch.Tensor, group_size: int = 0) -> torch.Tensor:
    """ggml's reference quantizer, bit for bit: ``d = amax/127``, codes rounded half away from zero."""
    x = w.reshape(-1, BLOCK)
    d = x.abs().max(1).values / 127
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = round_half_away(x * inv.unsqueeze(1)).to(torch.int8).view(torch.uint8)
    d = f16_or_raise(d, NAME, "scale d")
    return torch.cat([f16_field(d), q], 1).reshape(w.shape[0], -1)


def decode(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> torch.Tensor:
    """Exact float32 ``[N, K]`` values of q8_0 rows."""
    b = as_blocks(data, BLOCK_BYTES)
    q = b[:, 2:34].contiguous().view(torch.int8).float()
    return (q * read_f16(b, 0).unsqueeze(1)).reshape(N, K)


def validate(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> None:
    """Reject non-finite scales (every int8 code, -128 included, is valid as in ggml)."""
    require_finite_f16(read_f16(as_blocks(data, BLOCK_BYTES), 0), NAME, "scale d")


def random_blocks(N: int, K: int, generator: torch.Generator, group_size: int = 0) -> torch.Tensor:
    """Random valid rows."""
    n = N * K // BLOCK
    qs = torch.randint(0, 256, (n, 32), generator=generator, dtype=torch.uint8)
    return torch.cat([f16_field(random_f16(n, generator)), qs], 1).reshape(N, -1)
