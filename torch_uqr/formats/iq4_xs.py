"""GGUF ``iq4_xs``: 256 weights in 136 bytes, ``half d; u16 scales_h; u8 scales_l[4]; u8 qs[128]``.

Eight sub-blocks of 32 with a 6-bit scale ``ls_j`` (low 4 bits: nibble ``j % 2`` of
``scales_l[j / 2]``; high 2 bits: bits ``2j, 2j+1`` of ``scales_h``); ``y = d·(ls_j - 32)·V[q]`` with
iq4_nl's non-linear table ``V``. qs bytes 16j..16j+15 hold sub-block j: element i in the low nibble
of byte i, element i + 16 in the high nibble.
"""
from __future__ import annotations

import torch

from ._bytes import as_blocks, f16_field, random_f16, read_f16
from ._checks import f16_or_raise, require_finite_f16
from ._ggml import IQ4_VALUES, first_absmax, lut_decode, nearest_int, rdiv
from .iq4_nl import codes_for, search_scales
from .q4_0 import join_nibbles, split_nibbles

NAME = "iq4_xs"
BLOCK = 256
BLOCK_BYTES = 136
_NTRY = 7  # ggml's quantize_iq4_xs: 2·7 + 1 trial scales per sub-block


def unpack_scales(b: torch.Tensor) -> torch.Tensor:
    """The 6-bit sub-block scales ``ls`` (int32 ``[n, 8]``, 0..63) of blocks ``b`` ``[n, 136]``."""
    high = (b[:, 2].to(torch.int32) | (b[:, 3].to(torch.int32) << 8)).unsqueeze(1)
    j = torch.arange(8, device=b.device, dtype=torch.int32)
    low = (b[:, 4:8].to(torch.int32).repeat_interleave(2, 1) >> (4 * (j % 2))) & 15
    return low | (((high >> (2 * j)) & 3) << 4)


def pack_scales(ls: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`unpack_scales`: ``[n, 8]`` values 0..63 -> the 6 bytes ``scales_h, scales_l``."""
    ls = ls.to(torch.int32)
    j = torch.arange(8, device=ls.device, dtype=torch.int32)
    high = (((ls >> 4) & 3) << (2 * j)).sum(1, dtype=torch.int32)
    low = (ls[:, 0::2] & 15) | ((ls[:, 1::2] & 15) << 4)
    return torch.cat([(high & 255).unsqueeze(1), (high >> 8).unsqueeze(1), low], 1).to(torch.uint8)


def quantize(w: torch.Tensor, group_size: int = 0) -> torch.Tensor:
    """ggml's quantizer (``quantize_iq4_xs`` without importance matrix), bit for bit: iq4_nl's search
    per sub-block, ``d = -max_scale/32``, 6-bit multipliers, codes against ``d·l`` (unrounded ``d``)."""
    xt = w.reshape(-1, 32).t().contiguous()
    n = xt.shape[1] // 8
    scales = search_scales(xt, _NTRY).reshape(n, 8)
    _, max_scale = first_absmax(scales.t())
    d = (-max_scale) / 32.0
    inv_d = torch.where(d != 0, rdiv(1.0, d), torch.zeros_like(d))
    ls = nearest_int(inv_d.unsqueeze(1) * scales).clamp(-32, 31)
    dl = d.unsqueeze(1) * ls.float()
    inv_dl = torch.where(dl != 0, rdiv(1.0, dl), torch.zeros_like(dl))
    q = codes_for(xt, inv_dl.reshape(-1))  # [n*8, 32]
    d16 = f16_or_raise(d, NAME, "scale d")
    qs = join_nibbles(q).reshape(n, 128)
    return torch.cat([f16_field(d16), pack_scales(ls + 32), qs], 1).reshape(w.shape[0], -1)


def decode(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> torch.Tensor:
    """Exact float32 ``[N, K]``: ``(d·(ls - 32))·V[q]`` (11 + 6 + 8 significant bits: exact)."""
    b = as_blocks(data, BLOCK_BYTES)
    dl = read_f16(b, 0).unsqueeze(1) * (unpack_scales(b) - 32).float()
    v = lut_decode(split_nibbles(b[:, 8:136].reshape(-1, 8, 16)), IQ4_VALUES)
    return (dl.unsqueeze(2) * v).reshape(N, K)


def validate(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> None:
    """Every scale and code is valid; only a non-finite ``d`` is refused."""
    require_finite_f16(read_f16(as_blocks(data, BLOCK_BYTES), 0), NAME, "scale d")


def random_blocks(N: int, K: int, generator: torch.Generator, group_size: int = 0) -> torch.Tensor:
    """Random valid rows: random scale bytes and codes, finite ``d``."""
    n = N * K // BLOCK
    rest = torch.randint(0, 256, (n, 134), generator=generator, dtype=torch.uint8)
    return torch.cat([f16_field(random_f16(n, generator, 0.0002)), rest], 1).reshape(N, -1)
