"""Validation helpers: every problem becomes a ``ValueError`` that names the format and the field."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import torch

__all__ = ["require_finite_f16", "require_zero", "f16_or_raise", "first_bad", "track_f16_underflow",
           "SCALE_TOLERANCE"]

# fp16 keeps 11 significant bits for normal numbers; a scale left with fewer than 8 by the
# subnormal range (|v| < 2**-17) or flushed to zero has lost precision to the range, not the format.
SCALE_TOLERANCE = 2.0 ** -8
_tracking = threading.local()


def first_bad(mask: torch.Tensor) -> int:
    """Index of the first block where ``mask`` (``[n_blocks, ...]``) is true, or -1."""
    flat = mask.reshape(mask.shape[0], -1).any(1)
    hits = torch.nonzero(flat)
    return int(hits[0, 0]) if hits.numel() else -1


def require_finite_f16(values: torch.Tensor, fmt: str, field: str) -> None:
    """Reject NaN/Inf fp16 scales: a kernel would silently spread them over a whole block."""
    finite = torch.isfinite(values)
    if bool(finite.all()):  # the usual case, in two ops: loading a model runs this per tensor slice
        return
    bad = first_bad(~finite)
    if bad >= 0:
        raise ValueError(f"{fmt}: block {bad} has a non-finite fp16 {field} ({values.reshape(-1)[bad].item()}); "
                         f"only finite scales are accepted")


def require_zero(values: torch.Tensor, fmt: str, field: str) -> None:
    """Reject non-zero padding or reserved bits, so that they stay free for future use."""
    bad = first_bad(values != 0)
    if bad >= 0:
        raise ValueError(f"{fmt}: block {bad} has non-zero {field}; it must be 0")


def f16_or_raise(values: torch.Tensor, fmt: str, field: str, *,
                 tolerance: float | None = SCALE_TOLERANCE) -> torch.Tensor:
    """Round float32 scales to fp16 (returned as float32); raise when they overflow fp16.

    ``tolerance``: the relative rounding error beyond which a scale counts as lost to fp16's
    subnormal range for :func:`track_f16_underflow`; a format that refits integer multipliers
    against the stored scale tolerates more. ``None`` marks an offset (a bias or minimum), never
    reported: a near-zero offset is legitimate and only its absolute error matters, while a scale
    that underflows takes every weight of its block with it.
    """
    rounded = values.to(torch.float16).float()
    if not bool(torch.isfinite(rounded).all()):
        raise ValueError(f"{fmt}: the weights are too large for the format's fp16 {field} "
                         f"(max |{field}| {values.abs().max().item():.4g} > 65504)")
    masks = getattr(_tracking, "masks", None)
    if masks is not None and tolerance is not None:
        mag = values.abs()
        masks.append((mag > 0) & ((rounded - values).abs() > mag * tolerance))
    return rounded


@contextmanager
def track_f16_underflow() -> Iterator[list]:
    """Collect, for every scale that ``f16_or_raise`` rounds inside the block (this thread only), a
    bool mask of the values that fp16's subnormal range left with under 8 significant bits (or 0).

    Every quantizer rounds its per-block (or per-group) scales through ``f16_or_raise`` in row-major
    block order, whole or in consecutive chunks, so the masks map back onto rows.
    """
    previous = getattr(_tracking, "masks", None)
    _tracking.masks = []
    try:
        yield _tracking.masks
    finally:
        _tracking.masks = previous
