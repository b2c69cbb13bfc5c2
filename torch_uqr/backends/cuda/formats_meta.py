"""Block geometry of every format as the Triton kernels need it, read from the format table
(``torch_uqr/formats/table.py``; the same ids as ``enum uqr_format`` in C)."""
from __future__ import annotations

from ...formats.table import BY_NAME, NAMES, TABLE, quoted_names

# Integer codes the kernels branch on as constexprs.
FORMAT_CODES: dict[str, int] = {f.name: f.id for f in TABLE}


def block_geometry(fmt: str, group_size: int = 0) -> tuple[int, int]:
    """Return (elements, bytes) of one block of ``fmt``; ``group_size`` is a grouped format's g
    (0 otherwise)."""
    if fmt not in BY_NAME:
        raise ValueError(f"fmt: expected one of {quoted_names(NAMES)}, got {fmt!r}")
    row = BY_NAME[fmt]
    if row.grouped and group_size not in row.group_sizes:
        raise ValueError(f"group_size: {fmt} needs one of {row.group_sizes}, got {group_size}")
    return row.block_geometry(group_size if row.grouped else 0)

