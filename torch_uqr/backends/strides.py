"""How one gemm call addresses x and y, for the kernels launched from Python (Triton on CUDA, the
Metal emulator on CPU).

Every backend reads x and writes y through the stride description of ``uqr_gemm_params``
(csrc/include/uqr/params.h), which is what makes the direct-head layouts free::

    x(b, m, k) = x[b*x_batch_stride + m*x_row_stride + (k // x_head_dim)*x_head_stride + k % x_head_dim]
    y(b, m, n) = y[b*y_batch_stride + m*y_row_stride + (n // y_head_dim)*y_head_stride + n % y_head_dim]

Strides are in elements. The argument checks and the stride rules have one implementation,
``uqr::plan_gemm`` in C++ (csrc/cpu/gemm_args.cpp; docs/operator.md states them); ``plan`` calls it
through the ``uqr::_plan`` op, and the field names come from ``uqr::_param_fields``, so this module
holds no copy of either. ``output_shape`` is the shape rule alone, for the fake kernel (it must stay
symbolic under ``torch.compile(dynamic=True)``); the tests check it against the C++ plan.

Rules in short:

* ``in_heads=False``: x is ``[..., M, K]`` (a 1-D x is ``[K]``, i.e. M = 1 with no M dim in y).
* ``in_heads=True``: x is ``[..., H_in, M, D_in]`` with ``H_in * D_in == K``, read as ``[..., M, K]``.
* ``out_heads=0``: y is ``[..., M, N]``; ``out_heads=H``: y is ``[..., H, M, N // H]``. y is always
  freshly allocated and contiguous in its own shape.
* The leading dims ``...`` are flattened into one batch index. When they cannot be described by one
  stride, or x's innermost dim is not unit-stride, x is copied (``x.contiguous()``) - the only copy
  the operator ever makes of x, and only for such layouts.
* When both x and y allow it (plain output, rows of consecutive batches evenly spaced), the batch is
  folded into M so kernels see one tall matrix; kernels must not assume batch > 1 means anything.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

__all__ = ["GemmPlan", "output_shape", "plan", "param_fields", "set_poison", "poison_enabled"]


@functools.lru_cache(maxsize=1)
def param_fields() -> tuple[str, ...]:
    """Names of ``uqr_gemm_params``' fields in their declaration order (UQR_PARAM_FIELDS)."""
    return tuple(torch.ops.uqr._param_fields())


@dataclass
class GemmPlan:
    """One checked gemm call: x as the kernels read it, the fresh y, and ``uqr_gemm_params``."""

    x: torch.Tensor
    y: Optional[torch.Tensor]
    params: dict[str, int]
    out_shape: tuple[int, ...]

    def __getattr__(self, name: str) -> int:
        # The params fields read as attributes (plan.M, plan.x_row_stride, ...).
        params = self.__dict__.get("params")
        if params is not None and name in params:
            return params[name]
        raise AttributeError(name)

    def allocate(self) -> torch.Tensor:
        """Allocate y (NaN-filled while poisoned outputs are on) unless done; return it."""
        if self.y is None:
            if _poison:
                self.y = torch.full(self.out_shape, float("nan"), dtype=self.x.dtype, device=self.x.device)
            else:
                self.y = torch.empty(self.out_shape, dtype=self.x.dtype, device=self.x.device)
        return self.y

    def kernel_strides(self) -> tuple[int, ...]:
        """The eight stride arguments of the Triton kernels, in their order."""
        p = self.params
        return (p["x_batch_stride"], p["x_row_stride"], p["x_head_dim"], p["x_head_stride"],
                p["y_batch_stride"], p["y_row_stride"], p["y_head_dim"], p["y_head_stride"])

    def x_offset(self, b, m, k):
        """Element offset of x(b, m, k) (ints or index tensors; for tests and pure-Python backends)."""
        p = self.params
        return (b * p["x_batch_stride"] + m * p["x_row_stride"]
                + (k // p["x_head_dim"]) * p["x_head_stride"] + k % p["x_head_dim"])

    def y_offset(self, b, m, n):
        """Element offset of y(b, m, n)."""
        p = self.params
        return (b * p["y_batch_stride"] + m * p["y_row_stride"]
                + (n // p["y_head_dim"]) * p["y_head_stride"] + n % p["y_head_dim"])


# Poisoned outputs (a test aid): y NaN-filled so an element a kernel skips shows. The Python side of
# the switch the C++ ops read (uqr::_set_poison); torch_uqr.ops.poison_outputs sets both.
_poison = False


def set_poison(enabled: bool) -> None:
    """Make ``plan`` NaN-fill every y it allocates (use torch_uqr.ops.poison_outputs)."""
    global _poison
    _poison = bool(enabled)


def poison_enabled() -> bool:
    return _poison


def _check_shape(x_shape: Sequence[int], N: int, K: int, out_heads: int, in_heads: bool) -> None:
    if K <= 0 or N <= 0:
        raise ValueError(f"N and K must be positive, got N={N}, K={K}")
    if out_heads < 0:
        raise ValueError(f"out_heads must be >= 0, got {out_heads}")
    if out_heads > 0 and N % out_heads != 0:
        raise ValueError(f"out_heads={out_heads} does not divide N={N}")
    if in_heads:
        if len(x_shape) < 3:
            raise ValueError(
                f"x: in_heads=True expects x of shape [..., H, M, D] (at least 3 dims), got {tuple(x_shape)}")
        h, d = x_shape[-3], x_shape[-1]
        if h * d != K:
            raise ValueError(f"x: in_heads=True needs H*D == K, got H={h}, D={d} (H*D={h * d}) but K={K}")
    else:
        if len(x_shape) < 1:
            raise ValueError("x: expected at least 1 dim [..., K], got a 0-dim tensor")
        if x_shape[-1] != K:
            raise ValueError(f"x: last dim is {x_shape[-1]} but the weights have K={K}")
        if out_heads > 0 and len(x_shape) < 2:
            raise ValueError(f"x: out_heads={out_heads} needs x with an M dim ([..., M, K]), got {tuple(x_shape)}")


def output_shape(x_shape: Sequence[int], N: int, K: int, out_heads: int = 0,
                 in_heads: bool = False) -> tuple[int, ...]:
    """Shape of y for an x of shape ``x_shape`` (validates the shape arguments, raising ValueError).

    Sizes are kept as given (no ``int()``), so the fake kernel stays symbolic under
    ``torch.compile(dynamic=True)``.
    """
    x_shape = tuple(x_shape)
    _check_shape(x_shape, N, K, out_heads, in_heads)
    if in_heads:
        lead, M = x_shape[:-3], x_shape[-2]
    elif len(x_shape) == 1:
        return (N,)
    else:
        lead, M = x_shape[:-2], x_shape[-2]
    if out_heads > 0:
        return lead + (out_heads, M, N // out_heads)
    return lead + (M, N)


def plan(x: torch.Tensor, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int = 0,
         out_heads: int = 0, in_heads: bool = False, path: str = "auto",
         backend: str = "cuda", allocate: bool = True) -> GemmPlan:
    """Check a gemm call's arguments (``uqr::plan_gemm``: errors name the argument and raise
    ValueError) and return the plan the kernels launch with, with y allocated unless ``allocate``
    is False (then ``GemmPlan.allocate`` does it once a Python-launched kernel is chosen).

    ``backend`` ("cpu", "cuda" or "metal") selects whose optional paths ("vec", "int8") are allowed.
    x is x itself, or ``x.contiguous()`` when its layout has no stride form.
    """
    x_used, values, out_shape = torch.ops.uqr._plan(x, w, fmt, N, K, group_size, out_heads, in_heads,
                                                    path, backend)
    lay = GemmPlan(x_used, None, dict(zip(param_fields(), values)), tuple(out_shape))
    if allocate:
        lay.allocate()
    return lay
