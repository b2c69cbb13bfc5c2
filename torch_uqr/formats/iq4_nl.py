"""GGUF ``iq4_nl``: 32 weights in 18 bytes, ``half d; u8 qs[16]``, ``y = d·V[q]``.

``V`` is ggml's fixed non-linear table of 16 int8 levels (denser near zero). Byte j of qs holds
element j (low nibble) and element j + 16 (high nibble), as in q4_0.
"""
from __future__ import annotations

import torch

from ._bytes import as_blocks, f16_field, random_f16, read_f16
from ._checks import f16_or_raise, require_finite_f16
from ._ggml import GROUP_MAX_EPS, IQ4_VALUES, best_index, first_absmax, lut_decode, nearest_level, rdiv, seq_sum_tensor
from .q4_0 import join_nibbles, split_nibbles

NAME = "iq4_nl"
BLOCK = 32
BLOCK_BYTES = 18
_NTRY = 7  # ggml's quantize_iq4_nl: 2·7 + 1 trial scales


def search_scales(xt: torch.Tensor, ntry: int) -> torch.Tensor:
    """ggml's per-32 scale search of iq4_nl / iq4_xs without an importance matrix, for groups laid
    out element-major (``xt`` ``[32, n]``) and weights x²: codes for the scale ``-max/V[0]``, a least
    squares refit, then trials ``(t + V[0])/max`` for t = -ntry..ntry, each refit, the best kept
    by ``sumqx²/sumq2`` (first wins ties). Returns the float32 scales ``[n]`` (0: an all-zero group)."""
    weight = xt * xt
    amax, mx = first_absmax(xt)

    def fit(inv_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = nearest_level(IQ4_VALUES, inv_scale * xt)
        wq = weight * q
        return seq_sum_tensor(wq * xt), seq_sum_tensor(wq * q)

    sumqx, sumq2 = fit(rdiv(1.0, (-mx) / float(IQ4_VALUES[0])))
    d = torch.where(sumq2 > 0, sumqx / sumq2, torch.zeros_like(sumq2))
    best = d * sumqx
    for t in range(-ntry, ntry + 1):
        sumqx, sumq2 = fit(rdiv(float(t + IQ4_VALUES[0]), mx))
        better = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
        d = torch.where(better, sumqx / sumq2, d)
        best = torch.where(better, d * sumqx, best)
    return torch.where(amax < GROUP_MAX_EPS, torch.zeros_like(d), d)


def codes_for(xt: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    """Nearest-level codes of element-major groups ``xt`` ``[32, n]`` for inverse scales ``[n]``,
    returned block-major (int64 ``[n, 32]``)."""
    return best_index(IQ4_VALUES, inv_scale * xt).t()


def quantize(w: torch.Tensor, group_size: int = 0) -> torch.Tensor:
    """ggml's quantizer (``quantize_iq4_nl`` without importance matrix, 15 trial scales), bit for
    bit; the codes are chosen against the unrounded scale, as ggml does."""
    xt = w.reshape(-1, BLOCK).t().contiguous()
    d = search_scales(xt, _NTRY)
    q = codes_for(xt, torch.where(d != 0, rdiv(1.0, d), torch.zeros_like(d)))
    d16 = f16_or_raise(d, NAME, "scale d")
    return torch.cat([f16_field(d16), join_nibbles(q)], 1).reshape(w.shape[0], -1)


def decode(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> torch.Tensor:
    """Exact float32 ``[N, K]``: ``d·V[q]`` (an 11-bit by 8-bit product, exact)."""
    b = as_blocks(data, BLOCK_BYTES)
    v = lut_decode(split_nibbles(b[:, 2:18]), IQ4_VALUES)
    return (read_f16(b, 0).unsqueeze(1) * v).reshape(N, K)


def validate(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> None:
    """Every code is a valid level; only a non-finite scale is refused."""
    require_finite_f16(read_f16(as_blocks(data, BLOCK_BYTES), 0), NAME, "scale d")


def random_blocks(N: int, K: int, generator: torch.Generator, group_size: int = 0) -> torch.Tensor:
    """Random valid rows: random nibbles, random finite scales."""
    n = N * K // BLOCK
    qs = torch.randint(0, 256, (n, 16), generator=generator, dtype=torch.uint8)
    return torch.cat([f16_field(random_f16(n, generator, 0.002)), qs], 1).reshape(N, -1)
