"""Block geometry of every format, as the Triton kernels need it (mirrors csrc/include/uqr/formats.h).

Kept here rather than imported from ``torch_uqr.formats`` so the kernels and their tests have no
import-order dependency on the quantizers; ``tests/test_triton_*`` check the two agree when both exist.
"""
from __future__ import annotations

# Integer codes match enum uqr_format in formats.h; the kernels branch on them as constexprs.
FORMAT_CODES: dict[str, int] = {
    "q4_0": 0, "q4_1": 1, "q8_0": 2, "q4_k": 3,
    "mlx4": 4, "var_affine": 5, "exl3": 6, "ternary": 7,
}

# (elements per block, bytes per block); mlx4's block is its group, filled in by block_geometry.
_FIXED_BLOCKS: dict[str, tuple[int, int]] = {
    "q4_0": (32, 18), "q4_1": (32, 20), "q8_0": (32, 34), "q4_k": (256, 144),
    "var_affine": (256, 160), "exl3": (256, 144), "ternary": (32, 12),
}
MLX4_GROUPS = (32, 64, 128)


def block_geometry(fmt: str, group_size: int = 0) -> tuple[int, int]:
    """Return (elements, bytes) of one block of ``fmt``; ``group_size`` is mlx4's g (0 otherwise)."""
    if fmt not in FORMAT_CODES:
        raise ValueError(f"fmt: expected one of {sorted(FORMAT_CODES)}, got {fmt!r}")
    if fmt == "mlx4":
        if group_size not in MLX4_GROUPS:
            raise ValueError(f"group_size: mlx4 needs one of {MLX4_GROUPS}, got {group_size}")
        return group_size, 4 + group_size // 2
    return _FIXED_BLOCKS[fmt]


def bits_per_weight(fmt: str, group_size: int = 0) -> float:
    """Stored bits per weight, scales included."""
    elems, nbytes = block_geometry(fmt, group_size)
    return 8.0 * nbytes / elems
