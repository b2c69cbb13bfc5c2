"""Adapter from the shared stride description (``torch_uqr.backends.strides``) to the Triton launches.

``torch_uqr.backends.strides.plan`` decides the strides (params.h's rules, one copy of them for every
backend); this module only allocates y and hands the kernels their eight stride arguments.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import strides as shared_layout


@dataclass
class GemmLayout:
    """x, the freshly allocated y, and the stride description (elements) the kernels use."""
    x: torch.Tensor
    y: torch.Tensor
    batch: int
    M: int
    x_bs: int
    x_rs: int
    x_hd: int
    x_hs: int
    y_bs: int
    y_rs: int
    y_hd: int
    y_hs: int

    def strides(self) -> tuple[int, ...]:
        """The eight stride arguments in kernel order."""
        return (self.x_bs, self.x_rs, self.x_hd, self.x_hs, self.y_bs, self.y_rs, self.y_hd, self.y_hs)


# Poisoned outputs (a test aid): y NaN-filled so an element a kernel skips shows. The Python side of
# the switch the C++ ops read (uqr::_set_poison); both are set by torch_uqr.ops.poison_outputs.
_poison = False


def set_poison(enabled: bool) -> None:
    """Make plan_gemm NaN-fill every y it allocates (use torch_uqr.ops.poison_outputs)."""
    global _poison
    _poison = bool(enabled)


def poison_enabled() -> bool:
    return _poison


def plan_gemm(x: torch.Tensor, N: int, K: int, out_heads: int, in_heads: bool) -> GemmLayout:
    """Validate the shapes, allocate y (NaN-filled while poisoned outputs are on), return the launch layout."""
    x, p = shared_layout.plan(x, N, K, out_heads, in_heads)
    if _poison:
        y = torch.full(p.out_shape, float("nan"), dtype=x.dtype, device=x.device)
    else:
        y = torch.empty(p.out_shape, dtype=x.dtype, device=x.device)
    return GemmLayout(x, y, p.batch, p.M,
                      p.x_batch_stride, p.x_row_stride, p.x_head_dim, p.x_head_stride,
                      p.y_batch_stride, p.y_row_stride, p.y_head_dim, p.y_head_stride)
