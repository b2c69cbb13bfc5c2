"""BitNet 1.58-bit ``ternary``: 32 weights in 12 bytes, ``half d; half _pad; u32 qs[2]``.

Element i has the 2-bit code at bit 2i of qs (LSB-first, the same as ``qs[i/16] >> 2(i%16)`` on a
little-endian machine); ``t = code - 1`` in {-1, 0, +1}; code 3 is invalid; ``y = d·t``.
"""
from __future__ import annotations

import torch

from ._bytes import as_blocks, f16_field, random_f16, read_codes, read_f16, write_codes
from ._checks import f16_or_raise, first_bad, require_finite_f16, require_zero

NAME = "ternary"
BLOCK = 32
BLOCK_BYTES = 12


def pack(d: torch.Tensor, trits: torch.Tensor) -> torch.Tensor:
    """Blocks ``[n, 12]`` from fp16-exact scales ``[n]`` and trits ``[n, 32]`` in {-1, 0, 1}."""
    pad = torch.zeros(d.shape[0], 2, dtype=torch.uint8, device=d.device)
    return torch.cat([f16_field(d), pad, write_codes(trits.to(torch.int64) + 1, 2)], 1)


def quantize(w: torch.Tensor, group_size: int = 0) -> torch.Tensor:
    """Per block, the exact least-squares ternary fit, then ``d`` rounded to fp16 and refit once.

    For a fixed set of n non-zero positions the best scale is the mean of their magnitudes and the
    error is ``sum(x²) - S_n²/n``; the best set is always the n largest magnitudes, so sorting and
    one cumulative sum give the optimum over every n at once.
    """
    x = w.reshape(-1, BLOCK)
    mags, _ = x.abs().sort(1, descending=True)
    counts = torch.arange(1, BLOCK + 1, device=x.device, dtype=x.dtype)
    sums = mags.cumsum(1)
    best = (sums * sums / counts).argmax(1, keepdim=True)
    d = torch.gather(sums, 1, best).squeeze(1) / (best.squeeze(1) + 1).to(x.dtype)
    d = f16_or_raise(d, NAME, "scale d")
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d)).unsqueeze(1)
    t = torch.round(x * inv).clamp(-1, 1)
    # With the trits fixed, the mean magnitude of the non-zero ones is the best scale.
    nz = t.abs().sum(1)
    refit = torch.where(nz > 0, (x * t).sum(1) / nz.clamp(min=1), d)
    d = f16_or_raise(refit, NAME, "scale d")
    return pack(d, t).reshape(w.shape[0], -1)


def decode(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> torch.Tensor:
    """Exact float32 ``[N, K]``."""
    b = as_blocks(data, BLOCK_BYTES)
    t = (read_codes(b[:, 4:12], BLOCK, 2) - 1).float()
    return (t * read_f16(b, 0).unsqueeze(1)).reshape(N, K)


def validate(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> None:
    """Reject non-finite ``d``, non-zero ``_pad`` and the invalid code 3."""
    b = as_blocks(data, BLOCK_BYTES)
    require_finite_f16(read_f16(b, 0), NAME, "scale d")
    require_zero(b[:, 2:4], NAME, "_pad")
    bad = first_bad(read_codes(b[:, 4:12], BLOCK, 2) == 3)
    if bad >= 0:
        raise ValueError(f"{NAME}: block {bad} contains code 3; codes are value + 1 in {{0, 1, 2}}")


def random_blocks(N: int, K: int, generator: torch.Generator, group_size: int = 0) -> torch.Tensor:
    """Random valid rows (uniform trits)."""
    n = N * K // BLOCK
    t = torch.randint(-1, 2, (n, BLOCK), generator=generator)
    return pack(random_f16(n, generator), t).reshape(N, -1)
