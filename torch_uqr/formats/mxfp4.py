"""GGUF ``mxfp4`` (OCP microscaling FP4): 32 weights in 17 bytes, ``u8 e; u8 qs[16]``.

``e`` is an E8M0 power-of-two scale and each 4-bit code an E2M1 float; ggml stores the E2M1
values doubled as integers ``F = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, ..., -12}`` and halves the scale:
``y = 2^(e - 128)·F[q]`` (``e < 2``: the same value, an fp32 subnormal). Byte j of qs holds element j
(low nibble) and element j + 16 (high nibble), as in q4_0. Exponents above 252 are invalid.
"""
from __future__ import annotations

import torch

from ._bytes import as_blocks
from ._checks import first_bad
from ._ggml import lut_decode
from .q4_0 import join_nibbles, split_nibbles

NAME = "mxfp4"
BLOCK = 32
BLOCK_BYTES = 17
#: E2M1 values times two, by code (bit 3 is the sign).
VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def e8m0_half(e: torch.Tensor) -> torch.Tensor:
    """``2^(e - 128)`` as float32 for bytes ``e`` (ggml's ``E8M0_TO_FP32_HALF``: exact, subnormal
    below e = 2)."""
    e = e.to(torch.int32)
    bits = torch.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    return bits.view(torch.float32)


def quantize(w: torch.Tensor, group_size: int = 0) -> torch.Tensor:
    """ggml's reference quantizer, bit for bit: ``e = floor(log2(amax)) - 2 + 127`` (0 for an
    all-zero block), then every weight to the nearest level ``F·2^(e-128)`` (first level on ties)."""
    x = w.reshape(-1, BLOCK)
    amax = x.abs().max(1).values
    # floorf(log2f(amax)): float64 log2 rounded to float32 is the correctly rounded log2f (which is
    # what glibc returns), so values just below a power of two round up to it as in ggml.
    lg = torch.floor(torch.log2(amax.double()).float())
    e = torch.where(amax > 0, lg - 2 + 127, torch.zeros_like(lg))
    e = (e.to(torch.int32) & 255)  # C's float -> uint8 conversion of an out-of-range value wraps
    d = e8m0_half(e)
    levels = torch.tensor(VALUES, dtype=torch.float32, device=w.device)
    err = (levels * d.unsqueeze(1)).unsqueeze(1) - x.unsqueeze(2)  # [n, 32, 16]
    q = err.abs().argmin(2)  # first minimum, as ggml's strict < scan
    return torch.cat([e.to(torch.uint8).unsqueeze(1), join_nibbles(q)], 1).reshape(w.shape[0], -1)


def decode(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> torch.Tensor:
    """Float32 ``[N, K]``: ``2^(e-128)·F[q]``, one product, exact except where it overflows float32
    (e >= 254 with |F| >= 8: ±inf, as in ggml)."""
    b = as_blocks(data, BLOCK_BYTES)
    v = lut_decode(split_nibbles(b[:, 1:17]), VALUES)
    return (e8m0_half(b[:, 0]).unsqueeze(1) * v).reshape(N, K)


#: The largest exponent whose block decodes to finite weights (2^(253-128)·8 = 2^128 overflows
#: float32); ggml's quantizer never writes more (floor(log2(FLT_MAX)) - 2 + 127 = 252).
MAX_EXPONENT = 252


def validate(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> None:
    """Reject exponents above 252, whose weights overflow float32 (e = 255 is NaN in the OCP spec;
    ggml would decode it as 2^127). Every code is valid."""
    e = as_blocks(data, BLOCK_BYTES)[:, 0]
    bad = first_bad((e > MAX_EXPONENT).unsqueeze(1))
    if bad >= 0:
        raise ValueError(f"{NAME}: block {bad} has exponent e = {int(e[bad])}; at most {MAX_EXPONENT} is accepted "
                         f"(larger ones decode to ±inf)")


def random_blocks(N: int, K: int, generator: torch.Generator, group_size: int = 0) -> torch.Tensor:
    """Random valid rows: random codes, exponents around 2^-8 (finite, normal weights)."""
    n = N * K // BLOCK
    e = torch.randint(112, 128, (n, 1), generator=generator, dtype=torch.uint8)
    qs = torch.randint(0, 256, (n, 16), generator=generator, dtype=torch.uint8)
    return torch.cat([e, qs], 1).reshape(N, -1)
