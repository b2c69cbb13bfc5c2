"""The format registry: one module per weight format, all with the same interface, listed by the
format table (``table.py``).

Each module defines ``NAME``, ``BLOCK`` (elements per block), ``BLOCK_BYTES`` and
``quantize(w, group_size)``, ``decode(data, N, K, group_size)``, ``validate(data, N, K, group_size)``
and ``random_blocks(N, K, generator, group_size)``. ``group_size`` only means something for a
grouped format (the MLX family ``mlx2`` ... ``mlx8``, whose block is one group); the other formats take 0.
"""
from __future__ import annotations

import importlib
from types import ModuleType

from .table import BY_NAME, NAMES, TABLE

__all__ = ["REGISTRY", "NAMES", "get", "block_geometry", "resolve_group_size"]

REGISTRY: dict[str, ModuleType] = {f.name: importlib.import_module(f"{__name__}.{f.name}") for f in TABLE}


def _check_modules() -> None:
    """A module and its table row must agree: the row is what C and the kernels see."""
    for f in TABLE:
        m = REGISTRY[f.name]
        if (m.NAME, m.BLOCK, m.BLOCK_BYTES) != (f.name, f.block, f.block_bytes):
            raise ImportError(f"torch_uqr.formats.{f.name}: NAME/BLOCK/BLOCK_BYTES "
                              f"{(m.NAME, m.BLOCK, m.BLOCK_BYTES)} differ from its table row "
                              f"{(f.name, f.block, f.block_bytes)}")


_check_modules()


def get(fmt: str) -> ModuleType:
    """The module of format ``fmt``; a ``ValueError`` lists the known names otherwise."""
    try:
        return REGISTRY[fmt]
    except (KeyError, TypeError):
        raise ValueError(f"unknown format {fmt!r}; expected one of {list(NAMES)}") from None


def resolve_group_size(fmt: str, group_size: int | None) -> int:
    """The group size a format uses: a grouped format's g (its default when None), 0 otherwise."""
    get(fmt)
    row = BY_NAME[fmt]
    if row.grouped:
        g = row.default_group_size if group_size is None else group_size
        row.block_geometry(g)  # raises on an unsupported size
        return int(g)
    if group_size not in (None, 0):
        grouped = [f.name for f in TABLE if f.grouped]
        raise ValueError(f"{fmt}: group_size applies only to {', '.join(grouped)}; got group_size={group_size!r} "
                         f"(the {fmt} block is fixed at {row.block} weights)")
    return 0


def block_geometry(fmt: str, group_size: int | None = None) -> tuple[int, int]:
    """(elements per block, bytes per block) of ``fmt`` (for a grouped format, at ``group_size``)."""
    return BY_NAME[fmt].block_geometry(resolve_group_size(fmt, group_size))
