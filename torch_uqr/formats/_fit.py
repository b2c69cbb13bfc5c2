"""Least-squares fit of ``x ≈ scale·q + offset`` (q integer in [0, qmax]) for many small groups at once.

Min/max rounding wastes levels when a group has one outlier; instead we try a ladder of candidate
scales around ``range/qmax``, round with each, refit scale and offset by least squares for the codes
it produced, and keep the pair with the smallest squared error. All groups are searched in parallel
(in cache-sized slices); only the short ladder is a Python loop.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["AffineFit", "fit_affine", "affine_codes"]

_SLICE_GROUPS = 8192  # groups per slice: keeps every temporary of the ladder within the CPU caches


class AffineFit(NamedTuple):
    scale: torch.Tensor   # [G], >= 0
    offset: torch.Tensor  # [G]
    error: torch.Tensor   # [G], sum of squared errors of (scale, offset) with nearest codes


def affine_codes(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, qmax) -> torch.Tensor:
    """Nearest codes in [0, qmax] for ``x`` ``[G, n]`` under per-group ``scale``/``offset`` ``[G]``."""
    inv = torch.where(scale != 0, 1.0 / scale, torch.zeros_like(scale))
    q = torch.round((x - offset.unsqueeze(-1)) * inv.unsqueeze(-1))
    return torch.minimum(q.clamp(min=0), torch.as_tensor(qmax, dtype=q.dtype, device=q.device))


def fit_affine(x: torch.Tensor, qmax: int, *, offset_le_zero: bool = False, steps: int = 16,
               spread: float = 1.0) -> AffineFit:
    """Best ``(scale, offset)`` per row of ``x`` ``[G, n]`` (float32) for codes in [0, qmax].

    offset_le_zero: formats whose offset is ``-dmin·m`` with ``m >= 0`` (q4_k, var_affine) cannot
    represent a positive offset, so the search keeps it at or below zero.
    The ladder spans ``(qmax - spread .. qmax + spread) / range`` in ``steps`` steps.
    """
    parts = [_fit_slice(x[i:i + _SLICE_GROUPS], qmax, offset_le_zero, steps, spread)
             for i in range(0, x.shape[0], _SLICE_GROUPS)]
    return AffineFit(*(torch.cat(p) for p in zip(*parts)))


def _fit_slice(x, qmax, offset_le_zero, steps, spread):
    n = x.shape[-1]
    lo = x.min(-1).values
    hi = x.max(-1).values
    if offset_le_zero:
        lo = lo.clamp(max=0)
    rng = hi - lo
    safe_rng = torch.where(rng > 0, rng, torch.ones_like(rng))
    rel = x - lo.unsqueeze(-1)
    xs = x.sum(-1)
    xx = (x * x).sum(-1)
    # Start from plain min/max rounding, so the search can only improve on it.
    best_scale = rng / qmax
    best_offset = lo
    best_err = torch.full_like(lo, float("inf"))
    for i in range(-1, steps + 1):
        if i < 0:
            q = affine_codes(x, best_scale, best_offset, qmax)
        else:
            iscale = (qmax - spread + 2 * spread * i / steps) / safe_rng
            q = torch.round(rel * iscale.unsqueeze(-1)).clamp_(0, qmax)
        sq = q.sum(-1)
        sq2 = (q * q).sum(-1)
        sxq = (x * q).sum(-1)
        if i < 0:
            scale, offset = best_scale, best_offset
        else:
            det = n * sq2 - sq * sq
            det = torch.where(det > 0, det, torch.ones_like(det))
            scale = (n * sxq - sq * xs) / det
            offset = (sq2 * xs - sq * sxq) / det
            if offset_le_zero:
                # With the offset pinned at 0 the best scale is the one-parameter least-squares fit.
                pinned = offset > 0
                scale = torch.where(pinned, sxq / torch.where(sq2 > 0, sq2, torch.ones_like(sq2)), scale)
                offset = torch.where(pinned, torch.zeros_like(offset), offset)
        # Squared error expanded into the sums above, so it costs no pass over x.
        err = (scale * scale * sq2 + 2 * scale * offset * sq + n * offset * offset
               - 2 * scale * sxq - 2 * offset * xs + xx)
        better = (scale >= 0) & (err < best_err)
        best_scale = torch.where(better, scale, best_scale)
        best_offset = torch.where(better, offset, best_offset)
        best_err = torch.where(better, err, best_err)
    # Re-rounding against the winning pair can only lower the error; score that final state.
    q = affine_codes(x, best_scale, best_offset, qmax)
    final = ((best_scale.unsqueeze(-1) * q + best_offset.unsqueeze(-1) - x) ** 2).sum(-1)
    return best_scale, best_offset, final
