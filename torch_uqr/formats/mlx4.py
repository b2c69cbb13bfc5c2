"""MLX affine 4-bit, ``mlx4``: groups of g in {32, 64, 128}, ``half scale; half bias; u8 qs[g/2]``.

``y = scale·q + bias``. Element i of a group is bits [4i, 4i+4) of the LSB-first bitstream (byte i/2,
low nibble for even i), which is exactly the bit order of MLX's little-endian uint32 words.
"""
from __future__ import annotations

import torch

from ._bytes import as_blocks, f16_field, random_f16, read_codes, read_f16, write_codes
from ._checks import f16_or_raise, require_finite_f16
from ._fit import affine_codes, fit_affine
from .table import BY_NAME

NAME = "mlx4"
_ROW = BY_NAME[NAME]
GROUP_SIZES = _ROW.group_sizes
DEFAULT_GROUP_SIZE = _ROW.default_group_size
BLOCK = _ROW.block
BLOCK_BYTES = _ROW.block_bytes
block_geometry = _ROW.block_geometry  # (elements, bytes) of one block for group size ``group_size``


def quantize(w: torch.Tensor, group_size: int = DEFAULT_GROUP_SIZE) -> torch.Tensor:
    """Least-squares search of each group's scale and bias, both rounded to fp16 before coding."""
    g, _ = block_geometry(group_size)
    x = w.reshape(-1, g)
    fit = fit_affine(x, 15, steps=16)
    scale = f16_or_raise(fit.scale, NAME, "scale")
    bias = f16_or_raise(fit.offset, NAME, "bias", tolerance=None)
    q = affine_codes(x, scale, bias, 15)
    return torch.cat([f16_field(scale), f16_field(bias), write_codes(q, 4)], 1).reshape(w.shape[0], -1)


def decode(data: torch.Tensor, N: int, K: int, group_size: int = DEFAULT_GROUP_SIZE) -> torch.Tensor:
    """Exact float32 ``[N, K]``: ``scale·q + bias`` (the product is exact in float32)."""
    g, nbytes = block_geometry(group_size)
    b = as_blocks(data, nbytes)
    q = read_codes(b[:, 4:], g, 4).float()
    return (q * read_f16(b, 0).unsqueeze(1) + read_f16(b, 2).unsqueeze(1)).reshape(N, K)


def validate(data: torch.Tensor, N: int, K: int, group_size: int = DEFAULT_GROUP_SIZE) -> None:
    """Reject non-finite scales or biases."""
    _, nbytes = block_geometry(group_size)
    b = as_blocks(data, nbytes)
    require_finite_f16(read_f16(b, 0), NAME, "scale")
    require_finite_f16(read_f16(b, 2), NAME, "bias")


def random_blocks(N: int, K: int, generator: torch.Generator,
                  group_size: int = DEFAULT_GROUP_SIZE) -> torch.Tensor:
    """Random valid rows; scales of both signs, as MLX's own quantizer produces."""
    g, nbytes = block_geometry(group_size)
    n = N * K // g
    qs = torch.randint(0, 256, (n, g // 2), generator=generator, dtype=torch.uint8)
    fields = [f16_field(random_f16(n, generator, 0.01)), f16_field(random_f16(n, generator, 0.1)), qs]
    return torch.cat(fields, 1).reshape(N, -1)
