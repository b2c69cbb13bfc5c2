"""The format registry: one module per weight format, all with the same interface.

Each module defines ``NAME``, ``BLOCK`` (elements per block), ``BLOCK_BYTES`` and
``quantize(w, group_size)``, ``decode(data, N, K, group_size)``, ``validate(data, N, K, group_size)``
and ``random_blocks(N, K, generator, group_size)``. ``group_size`` only means something for ``mlx4``
(whose block is one group); the other formats take 0.
"""
from __future__ import annotations

from types import ModuleType

from . import exl3, mlx4, q4_0, q4_1, q4_k, q8_0, ternary, var_affine

__all__ = ["REGISTRY", "NAMES", "get", "layout", "resolve_group_size"]

REGISTRY: dict[str, ModuleType] = {
    m.NAME: m for m in (q4_0, q4_1, q8_0, q4_k, mlx4, var_affine, exl3, ternary)
}
NAMES: tuple[str, ...] = tuple(REGISTRY)


def get(fmt: str) -> ModuleType:
    """The module of format ``fmt``; a ``ValueError`` lists the known names otherwise."""
    try:
        return REGISTRY[fmt]
    except (KeyError, TypeError):
        raise ValueError(f"unknown format {fmt!r}; expected one of {list(NAMES)}") from None


def resolve_group_size(fmt: str, group_size: int | None) -> int:
    """The group size a format uses: mlx4's g (default 64), 0 for every other format."""
    module = get(fmt)
    if hasattr(module, "GROUP_SIZES"):
        g = module.DEFAULT_GROUP_SIZE if group_size is None else group_size
        module.layout(g)  # raises on an unsupported size
        return int(g)
    if group_size not in (None, 0):
        raise ValueError(f"{fmt}: group_size applies only to mlx4; got group_size={group_size!r} "
                         f"(the {fmt} block is fixed at {module.BLOCK} weights)")
    return 0


def layout(fmt: str, group_size: int | None = None) -> tuple[int, int]:
    """(elements per block, bytes per block) of ``fmt`` (for mlx4, at ``group_size``)."""
    module = get(fmt)
    g = resolve_group_size(fmt, group_size)
    return module.layout(g) if g else (module.BLOCK, module.BLOCK_BYTES)
