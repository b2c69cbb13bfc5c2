"""The MLX affine family, ``mlx2`` ... ``mlx8``: groups of g in {32, 64, 128}, ``half scale; half
bias; u8 codes[g * bits / 8]``.

``y = scale·q + bias`` with ``q`` in [0, 2^bits). Element i of a group is bits [bits·i, bits·i + bits)
of the LSB-first bitstream of its code bytes: MLX packs every width this way into little-endian
uint32 words (``mx.quantize``), so the bytes of those words are the codes as they are. Each format
module binds this family to its table row (``bind``); nothing here depends on the width otherwise.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from ._bytes import as_blocks, f16_field, random_f16, read_codes, read_f16, write_codes
from ._checks import f16_or_raise, require_finite_f16
from ._fit import affine_codes, fit_affine
from .table import BY_NAME


def bind(name: str) -> SimpleNamespace:
    """The module interface (docs: ``torch_uqr.formats``) of the MLX-family format ``name``."""
    row = BY_NAME[name]
    bits, header = row.code_bits, row.header_bytes
    qmax = (1 << bits) - 1
    block_geometry = row.block_geometry  # (elements, bytes) of one block for group size ``group_size``

    def quantize(w: torch.Tensor, group_size: int = row.default_group_size) -> torch.Tensor:
        """Least-squares search of each group's scale and bias, both rounded to fp16 before coding."""
        g, _ = block_geometry(group_size)
        x = w.reshape(-1, g)
        fit = fit_affine(x, qmax, steps=16)
        scale = f16_or_raise(fit.scale, name, "scale")
        bias = f16_or_raise(fit.offset, name, "bias", tolerance=None)
        q = affine_codes(x, scale, bias, qmax)
        return torch.cat([f16_field(scale), f16_field(bias), write_codes(q, bits)], 1).reshape(w.shape[0], -1)

    def decode(data: torch.Tensor, N: int, K: int, group_size: int = row.default_group_size) -> torch.Tensor:
        """Exact float32 ``[N, K]``: ``scale·q + bias`` (q has at most 8 bits, so the product is exact)."""
        g, nbytes = block_geometry(group_size)
        b = as_blocks(data, nbytes)
        q = read_codes(b[:, header:], g, bits).float()
        return (q * read_f16(b, 0).unsqueeze(1) + read_f16(b, 2).unsqueeze(1)).reshape(N, K)

    def validate(data: torch.Tensor, N: int, K: int, group_size: int = row.default_group_size) -> None:
        """Reject non-finite scales or biases (every code bit pattern is a valid code)."""
        _, nbytes = block_geometry(group_size)
        b = as_blocks(data, nbytes)
        require_finite_f16(read_f16(b, 0), name, "scale")
        require_finite_f16(read_f16(b, 2), name, "bias")

    def random_blocks(N: int, K: int, generator: torch.Generator,
                      group_size: int = row.default_group_size) -> torch.Tensor:
        """Random valid rows; scales of both signs, as MLX's own quantizer produces."""
        g, nbytes = block_geometry(group_size)
        n = N * K // g
        qs = torch.randint(0, 256, (n, nbytes - header), generator=generator, dtype=torch.uint8)
        fields = [f16_field(random_f16(n, generator, 0.01)), f16_field(random_f16(n, generator, 0.1)), qs]
        return torch.cat(fields, 1).reshape(N, -1)

    return SimpleNamespace(NAME=name, BITS=bits, GROUP_SIZES=row.group_sizes,
                           DEFAULT_GROUP_SIZE=row.default_group_size, BLOCK=row.block, BLOCK_BYTES=row.block_bytes,
                           block_geometry=block_geometry, quantize=quantize, decode=decode, validate=validate,
                           random_blocks=random_blocks)
