"""GGUF ``q5_K``: 256 weights in 176 bytes, ``half d; half dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]``.

q4_k's super-block with 5-bit codes: eight sub-blocks of 32, 6-bit scales and mins packed as in
q4_k, ``y = d·sc_j·q - dmin·m_j``. The low 4 bits of the codes lie in qs as q4_k's codes (bytes
32c..32c+31: sub-block 2c low nibbles, 2c + 1 high nibbles); bit 4 of sub-block j's element i
is bit j of qh[i].
"""
from __future__ import annotations

import torch

from ._bytes import as_blocks, f16_field, random_f16
from .q4_k import join_qs, k_decode, k_quant, k_validate, pack_scales, split_qs

NAME = "q5_k"
BLOCK = 256
BLOCK_BYTES = 176
QH, QS = 16, 48  # byte offsets of the fields after d, dmin and the 12 scale bytes

_SUBS = torch.arange(8, dtype=torch.int32).reshape(1, 8, 1)


def split_codes(qh: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    """qh ``[n, 32]``, qs ``[n, 128]`` -> codes int32 ``[n, 256]`` in [0, 31], element order."""
    high = (qh.to(torch.int32).unsqueeze(1) >> _SUBS.to(qh.device)) & 1
    return split_qs(qs) | (high.reshape(-1, 256) << 4)


def join_codes(codes: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`split_codes`: codes ``[n, 256]`` -> qh + qs bytes ``[n, 160]``."""
    codes = codes.to(torch.int32)
    qh = ((codes.reshape(-1, 8, 32) >> 4) << _SUBS.to(codes.device)).sum(1).to(torch.uint8)
    return torch.cat([qh, join_qs(codes & 15)], 1)


def quantize(w: torch.Tensor, group_size: int = 0) -> torch.Tensor:
    """ggml's reference quantizer (``quantize_row_q5_K_ref``), byte for byte: q4_k's search with
    31 levels (:func:`torch_uqr.formats.q4_k.k_quant`)."""
    d, dmin, sc, m, codes = k_quant(w, 31, -0.5, 15, NAME)
    fields = [f16_field(d), f16_field(dmin), pack_scales(sc, m), join_codes(codes)]
    return torch.cat(fields, 1).reshape(w.shape[0], -1).to(w.device)


def decode(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> torch.Tensor:
    """Exact float32 ``[N, K]``: ``(d·sc)·q - dmin·m`` (both products exact in float32)."""
    b = as_blocks(data, BLOCK_BYTES)
    return k_decode(b, split_codes(b[:, QH:QS], b[:, QS:BLOCK_BYTES])).reshape(N, K)


def validate(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> None:
    """Reject non-finite ``d`` or ``dmin`` (all 6-bit scale/min patterns and codes are valid)."""
    k_validate(as_blocks(data, BLOCK_BYTES), NAME)


def random_blocks(N: int, K: int, generator: torch.Generator, group_size: int = 0) -> torch.Tensor:
    """Random valid rows (random scale bytes and codes, finite super-scales)."""
    n = N * K // BLOCK
    rest = torch.randint(0, 256, (n, 172), generator=generator, dtype=torch.uint8)
    d = f16_field(random_f16(n, generator, 0.002))
    dmin = f16_field(random_f16(n, generator, 0.002))
    return torch.cat([d, dmin, rest], 1).reshape(N, -1)
