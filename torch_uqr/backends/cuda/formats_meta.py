"""Block geometry of every format as the Triton kernels need it, read from the format table
(``torch_uqr/formats/table.py``; the same ids as ``enum uqr_format`` in C)."""
from __future__ import annotations

from ...formats.table import BY_NAME, NAMES, TABLE, quoted_names

# Integer codes the kernels branch on as constexprs.
FORMAT_CODES: dict[str, int] = {f.name: f.id for f in TABLE}
# Indexed by format code: the MLX family's bits per code (0 for any other format) and header field
# bytes (2: fp16 / bf16, 4: fp32) and whether a field is bf16 (1) rather than fp16 / fp32 (0), so
# that one Triton branch decodes every row of the family from its code.
MLX_BITS: tuple[int, ...] = tuple(next((f.code_bits for f in TABLE if f.id == i and f.family == "mlx"), 0)
                                  for i in range(TABLE[-1].id + 1))
MLX_FIELD_BYTES: tuple[int, ...] = tuple(next((f.header_bytes // 2 for f in TABLE if f.id == i and f.family == "mlx"),
                                              0) for i in range(TABLE[-1].id + 1))
MLX_BF16: tuple[int, ...] = tuple(int(any(f.id == i and f.scale_dtype == "bf16" for f in TABLE))
                                  for i in range(TABLE[-1].id + 1))


def block_geometry(fmt: str, group_size: int = 0) -> tuple[int, int]:
    """Return (elements, bytes) of one block of ``fmt``; ``group_size`` is a grouped format's g
    (0 otherwise)."""
    if fmt not in BY_NAME:
        raise ValueError(f"fmt: expected one of {quoted_names(NAMES)}, got {fmt!r}")
    row = BY_NAME[fmt]
    if row.grouped and group_size not in row.group_sizes:
        raise ValueError(f"group_size: {fmt} needs one of {row.group_sizes}, got {group_size}")
    return row.block_geometry(group_size if row.grouped else 0)

