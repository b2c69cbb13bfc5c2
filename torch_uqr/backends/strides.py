"""Python mirror of ``csrc/include/uqr/params.h``: how one gemm call addresses x and y.

Every backend (the C++ CPU kernels, the Triton kernels, the Metal shaders) reads x and writes y
through the same stride description, which is what makes the direct-head layouts free::

    x(b, m, k) = x[b*x_batch_stride + m*x_row_stride + (k // x_head_dim)*x_head_stride + k % x_head_dim]
    y(b, m, n) = y[b*y_batch_stride + m*y_row_stride + (n // y_head_dim)*y_head_stride + n % y_head_dim]

Strides are in elements. ``plan`` computes them from x and the operator's arguments; the C++
operator (``csrc/cpu/gemm_args.cpp``) applies the same rules, so a kernel written against this
module and one written against params.h see identical numbers.

Rules (also documented in docs/operator.md):

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

from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = ["GemmLayout", "output_shape", "plan", "leading_dims_stride"]


@dataclass(frozen=True)
class GemmLayout:
    """Shapes and element strides of one gemm call (field names as in ``uqr_gemm_params``)."""

    batch: int
    M: int
    N: int
    K: int
    x_batch_stride: int
    x_row_stride: int
    x_head_stride: int
    x_head_dim: int
    y_batch_stride: int
    y_row_stride: int
    y_head_stride: int
    y_head_dim: int
    out_shape: tuple[int, ...]

    def x_offset(self, b: int, m: int, k: int) -> int:
        """Element offset of x(b, m, k) (for tests and pure-Python backends)."""
        return (b * self.x_batch_stride + m * self.x_row_stride
                + (k // self.x_head_dim) * self.x_head_stride + k % self.x_head_dim)

    def y_offset(self, b: int, m: int, n: int) -> int:
        """Element offset of y(b, m, n)."""
        return (b * self.y_batch_stride + m * self.y_row_stride
                + (n // self.y_head_dim) * self.y_head_stride + n % self.y_head_dim)


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


def leading_dims_stride(shape: Sequence[int], strides: Sequence[int]) -> int | None:
    """The one stride that walks the flattened leading dims, or None if they do not collapse.

    Size-1 dims carry no information and are skipped; an empty (or all size-1) prefix has stride 0.
    """
    dims = [(s, st) for s, st in zip(shape, strides) if s != 1]
    if not dims:
        return 0
    for (s_outer, st_outer), (s_inner, st_inner) in zip(dims, dims[1:]):
        if st_outer != st_inner * s_inner:
            return None
    return dims[-1][1]


def plan(x: torch.Tensor, N: int, K: int, out_heads: int = 0,
         in_heads: bool = False) -> tuple[torch.Tensor, GemmLayout]:
    """Strides for reading ``x`` and writing a fresh contiguous y of ``out_shape``.

    Returns ``(x_used, layout)``: ``x_used`` is ``x`` itself, or ``x.contiguous()`` when x's layout
    cannot be described by the stride set (see the module docstring).
    """
    out_shape = output_shape(x.shape, N, K, out_heads, in_heads)
    n_lead = x.dim() - (3 if in_heads else 2)
    if x.dim() == 1:
        n_lead = 0
    batch_stride = leading_dims_stride(x.shape[:max(n_lead, 0)], x.stride()[:max(n_lead, 0)])
    if x.stride(-1) != 1 or batch_stride is None:
        x = x.contiguous()
        batch_stride = leading_dims_stride(x.shape[:max(n_lead, 0)], x.stride()[:max(n_lead, 0)])
    batch = 1
    for s in x.shape[:max(n_lead, 0)]:
        batch *= int(s)

    if in_heads:
        M, d_in = x.shape[-2], x.shape[-1]
        x_row, x_head, x_hd = x.stride(-2), x.stride(-3), d_in
    elif x.dim() == 1:
        M, x_row, x_head, x_hd = 1, K, 0, K
    else:
        M, x_row, x_head, x_hd = x.shape[-2], x.stride(-2), 0, K

    if out_heads > 0:
        D = N // out_heads
        y_row, y_head, y_hd, y_batch = D, M * D, D, N * M
    else:
        y_row, y_head, y_hd, y_batch = N, 0, N, M * N

    # Fold the batch into M when consecutive batches continue each other's rows in x and in y.
    if batch > 1 and M * y_row == y_batch and batch_stride == M * x_row:
        M, batch = M * batch, 1
    if batch == 1 or M == 0:
        batch_stride = 0 if batch_stride is None else batch_stride
    return x, GemmLayout(
        batch=int(batch), M=int(M), N=int(N), K=int(K),
        x_batch_stride=int(batch_stride), x_row_stride=int(x_row), x_head_stride=int(x_head),
        x_head_dim=int(x_hd),
        y_batch_stride=int(y_batch), y_row_stride=int(y_row), y_head_stride=int(y_head),
        y_head_dim=int(y_hd), out_shape=tuple(int(s) for s in out_shape))
