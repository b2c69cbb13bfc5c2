"""MLX affine 8-bit, ``mlx8``: see ``_mlx.py`` (the family) and docs/formats.md, "MLX affine family"."""
from ._mlx import bind

_f = bind("mlx8")
NAME, BITS, BLOCK, BLOCK_BYTES = _f.NAME, _f.BITS, _f.BLOCK, _f.BLOCK_BYTES
GROUP_SIZES, DEFAULT_GROUP_SIZE = _f.GROUP_SIZES, _f.DEFAULT_GROUP_SIZE
block_geometry, quantize, decode, validate, random_blocks = (
    _f.block_geometry, _f.quantize, _f.decode, _f.validate, _f.random_blocks)
