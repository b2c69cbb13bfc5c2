"""Validation helpers: every problem becomes a ``ValueError`` that names the format and the field."""
from __future__ import annotations

import torch

__all__ = ["require_finite_f16", "require_zero", "f16_or_raise", "first_bad"]


def first_bad(mask: torch.Tensor) -> int:
    """Index of the first block where ``mask`` (``[n_blocks, ...]``) is true, or -1."""
    flat = mask.reshape(mask.shape[0], -1).any(1)
    hits = torch.nonzero(flat)
    return int(hits[0, 0]) if hits.numel() else -1


def require_finite_f16(values: torch.Tensor, fmt: str, field: str) -> None:
    """Reject NaN/Inf fp16 scales: a kernel would silently spread them over a whole block."""
    bad = first_bad(~torch.isfinite(values))
    if bad >= 0:
        raise ValueError(f"{fmt}: block {bad} has a non-finite fp16 {field} ({values.reshape(-1)[bad].item()}); "
                         f"only finite scales are accepted")


def require_zero(values: torch.Tensor, fmt: str, field: str) -> None:
    """Reject non-zero padding or reserved bits, so that they stay free for future use."""
    bad = first_bad(values != 0)
    if bad >= 0:
        raise ValueError(f"{fmt}: block {bad} has non-zero {field}; it must be 0")


def f16_or_raise(values: torch.Tensor, fmt: str, field: str) -> torch.Tensor:
    """Round float32 scales to fp16 (returned as float32); raise when they overflow fp16."""
    rounded = values.to(torch.float16).float()
    if not bool(torch.isfinite(rounded).all()):
        raise ValueError(f"{fmt}: the weights are too large for the format's fp16 {field} "
                         f"(max |{field}| {values.abs().max().item():.4g} > 65504)")
    return rounded
