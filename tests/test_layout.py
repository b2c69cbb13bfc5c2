"""torch_uqr.backends.strides (the Python mirror of params.h): offsets address exactly the right elements."""
from __future__ import annotations

import pytest
import torch

from torch_uqr.backends import strides as layout


def storage_view(t: torch.Tensor) -> torch.Tensor:
    """All of t's storage as a flat tensor (t's own elements sit at t.storage_offset() + offset)."""
    return t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)


def logical_x(x: torch.Tensor, in_heads: bool) -> torch.Tensor:
    """x as the [batch, M, K] matrix the operator reads."""
    if in_heads:
        x = x.transpose(-3, -2)
        x = x.reshape(*x.shape[:-2], -1)
    if x.dim() == 1:
        x = x[None]
    return x.reshape(-1, x.shape[-2], x.shape[-1])


def numbered(shape, strides=None):
    if strides is None:
        return torch.arange(torch.Size(shape).numel(), dtype=torch.float64).reshape(shape)
    size = 1 + sum((s - 1) * st for s, st in zip(shape, strides))
    return torch.arange(size, dtype=torch.float64).as_strided(shape, strides)


def grid(*sizes):
    """Index tensors (b, m, k) broadcast over a [batch, M, K] grid (the offsets are affine + // %)."""
    return torch.meshgrid(*(torch.arange(s) for s in sizes), indexing="ij")


CASES = [
    # (x factory, N, K, out_heads, in_heads)
    (lambda: numbered((5, 64)), 12, 64, 0, False),
    (lambda: numbered((64,)), 12, 64, 0, False),
    (lambda: numbered((2, 3, 5, 64)), 12, 64, 3, False),
    (lambda: numbered((2, 3, 5, 64)).transpose(0, 1), 12, 64, 0, False),       # needs a copy
    (lambda: numbered((4, 64), (0, 1)), 12, 64, 4, False),                       # broadcast rows
    (lambda: numbered((2, 4, 5, 16)), 12, 64, 0, True),
    (lambda: numbered((2, 5, 4, 16)).transpose(1, 2), 12, 64, 6, True),         # permuted heads
    (lambda: numbered((3, 2, 70))[:, :, 3:67], 12, 64, 0, False),                 # row stride 70
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_offsets_address_the_right_elements(case):
    make, N, K, out_heads, in_heads = CASES[case]
    x = make()
    x_used, lay = layout.plan(x, N, K, out_heads, in_heads)
    want = logical_x(x, in_heads).reshape(lay.batch, lay.M, K)
    b, m, k = grid(lay.batch, lay.M, K)
    got = storage_view(x_used)[x_used.storage_offset() + lay.x_offset(b, m, k)]
    assert torch.equal(got, want)
    # y: number the output's logical [batch, M, N] elements and find each at its offset.
    y = numbered(lay.out_shape)
    y_logical = y
    if out_heads:
        y_logical = y.transpose(-3, -2).reshape(*y.shape[:-3], y.shape[-2], N)
    y_logical = y_logical.reshape(lay.batch, lay.M, N)
    b, m, n = grid(lay.batch, lay.M, N)
    assert torch.equal(y.reshape(-1)[lay.y_offset(b, m, n)], y_logical)


def test_no_copy_when_strides_suffice():
    x = numbered((2, 5, 4, 16)).transpose(1, 2)
    x_used, _ = layout.plan(x, 12, 64, 0, True)
    assert x_used.data_ptr() == x.data_ptr()


def test_shape_errors_name_the_argument():
    with pytest.raises(ValueError, match="out_heads=5 does not divide N=12"):
        layout.output_shape((3, 64), 12, 64, 5, False)
    with pytest.raises(ValueError, match="x: in_heads=True expects"):
        layout.output_shape((3, 64), 12, 64, 0, True)
    with pytest.raises(ValueError, match="x: last dim is 63"):
        layout.output_shape((3, 63), 12, 64, 0, False)
