"""The MLX affine family, ``mlx2`` ... ``mlx8``: groups of g in {32, 64, 128}, ``T scale; T bias;
u8 codes[g * bits / 8]`` with T the row's scale dtype: fp16 (``mlxB``), bf16 (``mlxB_bf16``) or
fp32 (``mlxB_f32``), the dtypes MLX keeps scales and biases in (the model's).

``y = scale·q + bias`` with ``q`` in [0, 2^bits). Element i of a group is bits [bits·i, bits·i + bits)
of the LSB-first bitstream of its code bytes: MLX packs every width this way into little-endian
uint32 words (``mx.quantize``), so the bytes of those words are the codes as they are. Each format
module binds this family to its table row (``bind``); nothing here depends on the width or the
header dtype otherwise.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from ._bytes import FIELD_DTYPES, as_blocks, random_f16, read_codes, read_field, write_codes, write_field
from ._checks import SCALE_TOLERANCE, f16_or_raise, first_bad, require_finite_f16
from ._fit import affine_codes, fit_affine
from .table import BY_NAME


def bind(name: str) -> SimpleNamespace:
    """The module interface (docs: ``torch_uqr.formats``) of the MLX-family format ``name``."""
    row = BY_NAME[name]
    bits, header, dtype = row.code_bits, row.header_bytes, row.scale_dtype
    field = header // 2  # bytes of the scale, then of the bias
    qmax = (1 << bits) - 1
    block_geometry = row.block_geometry  # (elements, bytes) of one block for group size ``group_size``

    def rounded(values: torch.Tensor, what: str, tolerance) -> torch.Tensor:
        """float32 values rounded to the header dtype (as float32); raise where they overflow it."""
        if dtype == "f16":
            return f16_or_raise(values, name, what, tolerance=tolerance)
        r = values.to(FIELD_DTYPES[dtype]).float()
        if not bool(torch.isfinite(r).all()):
            raise ValueError(f"{name}: the weights are too large for the format's {dtype} {what}")
        return r

    def quantize(w: torch.Tensor, group_size: int = row.default_group_size) -> torch.Tensor:
        """Least-squares search of each group's scale and bias, both rounded to the header dtype
        before coding."""
        g, _ = block_geometry(group_size)
        x = w.reshape(-1, g)
        fit = fit_affine(x, qmax, steps=16)
        scale = rounded(fit.scale, "scale", SCALE_TOLERANCE)
        bias = rounded(fit.offset, "bias", None)
        q = affine_codes(x, scale, bias, qmax)
        fields = [write_field(scale, dtype), write_field(bias, dtype), write_codes(q, bits)]
        return torch.cat(fields, 1).reshape(w.shape[0], -1)

    def decode(data: torch.Tensor, N: int, K: int, group_size: int = row.default_group_size) -> torch.Tensor:
        """float32 ``[N, K]``: ``scale·q + bias``, the product rounded to float32 before the sum (exact
        for fp16 / bf16 scales, whose products with an 8-bit code fit float32's 24 bits)."""
        g, nbytes = block_geometry(group_size)
        b = as_blocks(data, nbytes)
        q = read_codes(b[:, header:], g, bits).float()
        return (q * read_field(b, 0, dtype).unsqueeze(1) + read_field(b, field, dtype).unsqueeze(1)).reshape(N, K)

    def validate(data: torch.Tensor, N: int, K: int, group_size: int = row.default_group_size) -> None:
        """Reject non-finite scales or biases, and bf16 / fp32 ones whose weights overflow float32
        (every code bit pattern is a valid code)."""
        _, nbytes = block_geometry(group_size)
        b = as_blocks(data, nbytes)
        kind = {"f16": "fp16", "bf16": "bf16", "f32": "fp32"}[dtype]
        scale, bias = read_field(b, 0, dtype), read_field(b, field, dtype)
        require_finite_f16(scale, name, "scale", kind)
        require_finite_f16(bias, name, "bias", kind)
        if dtype != "f16":
            # bf16 / fp32 fields span float32's range, so scale·q + bias can overflow it (fp16's
            # cannot): such a block would decode to inf, and is refused like a non-finite field.
            bound = (scale.double().abs() * qmax + bias.double().abs()) * (1 + 2.0 ** -23)
            bad = first_bad(bound > torch.finfo(torch.float32).max)
            if bad >= 0:
                raise ValueError(f"{name}: block {bad} has scale {scale[bad].item():.4g} and bias "
                                 f"{bias[bad].item():.4g}, whose weights overflow float32")

    def random_blocks(N: int, K: int, generator: torch.Generator,
                      group_size: int = row.default_group_size) -> torch.Tensor:
        """Random valid rows; scales of both signs, as MLX's own quantizer produces."""
        g, nbytes = block_geometry(group_size)
        n = N * K // g
        qs = torch.randint(0, 256, (n, nbytes - header), generator=generator, dtype=torch.uint8)
        if dtype == "f32":  # full fp32 values, whose products with a code are not exact in float32
            scale, bias = torch.randn(n, generator=generator) * 0.01, torch.randn(n, generator=generator) * 0.1
        else:
            scale, bias = random_f16(n, generator, 0.01), random_f16(n, generator, 0.1)
        fields = [write_field(scale, dtype), write_field(bias, dtype), qs]
        return torch.cat(fields, 1).reshape(N, -1)

    return SimpleNamespace(NAME=name, BITS=bits, SCALE_DTYPE=dtype, GROUP_SIZES=row.group_sizes,
                           DEFAULT_GROUP_SIZE=row.default_group_size, BLOCK=row.block, BLOCK_BYTES=row.block_bytes,
                           block_geometry=block_geometry, quantize=quantize, decode=decode, validate=validate,
                           random_blocks=random_blocks)
