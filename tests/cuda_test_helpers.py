"""Helpers shared by the tests of the CUDA C++ kernels (run only where a GPU is present)."""
from __future__ import annotations

import os

import torch


def fresh_seed() -> int:
    """A new seed every run (fresh random data); the failing assert's message carries the shape."""
    return int.from_bytes(os.urandom(3), "little")


def check_close(y: torch.Tensor, ref: torch.Tensor, tol: float, what: str, worst_factor: float | None = None) -> None:
    """y finite (so NaN-poisoned, unwritten outputs fail), shaped like ref, within tol of it.

    The norm-wise relative error is bounded by ``tol``; with ``worst_factor`` every element must also
    be within ``worst_factor * tol`` of max |ref|, so one wrong row cannot hide in the norm.
    """
    assert y.shape == ref.shape, (what, y.shape, ref.shape)
    assert torch.isfinite(y).all(), f"{what}: unwritten (NaN) outputs"
    err = float((y.double() - ref).norm() / ref.norm())
    assert err < tol, f"{what}: rel err {err:.2e}"
    if worst_factor is not None:
        worst = float(((y.double() - ref).abs() / ref.abs().max()).max())
        assert worst < worst_factor * tol, f"{what}: worst element err {worst:.2e}"
