"""Byte-level building blocks shared by the format modules: fp16 fields and LSB-first bitstreams.

Every format stores its blocks as rows of uint8; these helpers read and write fields of a
``[n_blocks, block_bytes]`` view without Python loops over blocks, on any device.
"""
from __future__ import annotations

import torch

__all__ = [
    "as_blocks", "read_f16", "f16_field", "read_u8", "read_bits", "write_bits",
    "read_codes", "write_codes", "round_half_away", "random_f16",
]


def as_blocks(data: torch.Tensor, block_bytes: int) -> torch.Tensor:
    """View ``data`` (uint8 rows of whole blocks) as ``[n_blocks, block_bytes]``."""
    return data.reshape(-1, block_bytes)


def read_f16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The little-endian fp16 field at byte ``offset`` of every block, as float32 ``[n_blocks]``."""
    return blocks[:, offset:offset + 2].contiguous().view(torch.float16).reshape(-1).float()


def f16_field(values: torch.Tensor) -> torch.Tensor:
    """fp16 values ``[n]`` (already rounded to fp16) as their two little-endian bytes ``[n, 2]``."""
    return values.to(torch.float16).reshape(-1, 1).view(torch.uint8)


def read_u8(blocks: torch.Tensor, offset: int, count: int) -> torch.Tensor:
    """``count`` unsigned bytes from ``offset`` as int32 ``[n_blocks, count]``."""
    return blocks[:, offset:offset + count].to(torch.int32)


def read_bits(qs: torch.Tensor, offsets: torch.Tensor, widths: torch.Tensor | int) -> torch.Tensor:
    """Values of ``widths`` bits at bit ``offsets`` of each block's LSB-first bitstream ``qs``.

    qs: uint8 ``[n_blocks, n_bytes]``; offsets: int64 ``[n]`` (same for every block) or
    ``[n_blocks, n]``; widths up to 9 bits. Returns int32 ``[n_blocks, n]``. Two bytes are read per
    value because a value of up to 9 bits starting at any bit of a byte spans at most two bytes.
    """
    n_blocks, n_bytes = qs.shape
    offsets = offsets.expand(n_blocks, offsets.shape[-1])
    first = offsets >> 3
    # A value that ends inside the last byte needs no second byte; clamping keeps the gather in range
    # and the extra bits it reads are masked off.
    second = (first + 1).clamp(max=n_bytes - 1)
    q32 = qs.to(torch.int32)
    window = torch.gather(q32, 1, first) | (torch.gather(q32, 1, second) << 8)
    mask = (1 << torch.as_tensor(widths, dtype=torch.int32, device=qs.device)) - 1
    return (window >> (offsets & 7).to(torch.int32)) & mask


def write_bits(codes: torch.Tensor, offsets: torch.Tensor, widths: torch.Tensor | int,
               n_bytes: int) -> torch.Tensor:
    """Inverse of :func:`read_bits`: pack ``codes`` (int ``[n_blocks, n]``) into uint8 ``[n_blocks, n_bytes]``.

    Bits not covered by any value are 0; values must not overlap. A value of up to 9 bits shifted by
    at most 7 touches two bytes, and values never share a bit, so adding each value's two byte
    contributions is the same as OR-ing them in.
    """
    n_blocks, n = codes.shape
    offsets = offsets.expand(n_blocks, n)
    mask = (1 << torch.as_tensor(widths, dtype=torch.int32, device=codes.device)) - 1
    shifted = (codes.to(torch.int32) & mask) << (offsets & 7).to(torch.int32)
    first = offsets >> 3
    out = torch.zeros(n_blocks, n_bytes + 1, dtype=torch.int32, device=codes.device)
    out.scatter_add_(1, first, shifted & 255)
    out.scatter_add_(1, first + 1, shifted >> 8)
    return out[:, :n_bytes].to(torch.uint8)


def read_codes(qs: torch.Tensor, count: int, width: int) -> torch.Tensor:
    """``count`` fixed-width codes packed back to back from bit 0, as int32 ``[n_blocks, count]``."""
    offsets = torch.arange(count, device=qs.device, dtype=torch.int64) * width
    return read_bits(qs, offsets, width)


def write_codes(codes: torch.Tensor, width: int) -> torch.Tensor:
    """Pack fixed-width codes ``[n_blocks, count]`` back to back from bit 0 (LSB-first)."""
    count = codes.shape[1]
    offsets = torch.arange(count, device=codes.device, dtype=torch.int64) * width
    return write_bits(codes, offsets, width, (count * width + 7) // 8)


def round_half_away(x: torch.Tensor) -> torch.Tensor:
    """C's ``roundf``: halves go away from zero (torch.round goes to even, which ggml does not)."""
    a = x.abs()
    floored = torch.floor(a)
    return torch.sign(x) * (floored + torch.floor(2 * (a - floored)))


def random_f16(n: int, generator: torch.Generator, scale: float = 0.05,
               device: torch.device | str = "cpu") -> torch.Tensor:
    """Finite random fp16 values (as float32) of both signs, for random valid blocks in tests."""
    v = torch.randn(n, generator=generator) * scale
    return v.to(torch.float16).float().to(device)
