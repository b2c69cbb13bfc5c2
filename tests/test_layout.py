"""The stride plan (uqr::plan_gemm through torch_uqr.backends.strides.plan): offsets address exactly
the right elements, and the fake kernel's shape rule (strides.output_shape) agrees with it."""
from __future__ import annotations

import pytest
import torch

from torch_uqr.backends import strides


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


def numbered(shape, stride=None):
    """Distinct float32 values (exact up to 2**24) so each element is identified by its value."""
    if stride is None:
        return torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
    size = 1 + sum((s - 1) * st for s, st in zip(shape, stride))
    return torch.arange(size, dtype=torch.float32).as_strided(shape, stride)


def plan(x, N, K, out_heads, in_heads):
    """The plan of a q8_0 call (any format gives the same strides): 34-byte blocks of 32."""
    w = torch.zeros(N, K // 32 * 34, dtype=torch.uint8)
    return strides.plan(x, w, "q8_0", N, K, 0, out_heads, in_heads, "auto", "cpu")


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
    lay = plan(x, N, K, out_heads, in_heads)
    x_used = lay.x
    assert lay.out_shape == strides.output_shape(x.shape, N, K, out_heads, in_heads)
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
    assert plan(x, 12, 64, 0, True).x.data_ptr() == x.data_ptr()


def test_shape_errors_name_the_argument():
    with pytest.raises(ValueError, match="out_heads=5 does not divide N=12"):
        strides.output_shape((3, 64), 12, 64, 5, False)
    with pytest.raises(ValueError, match="x: in_heads=True expects"):
        strides.output_shape((3, 64), 12, 64, 0, True)
    with pytest.raises(ValueError, match="x: last dim is 63"):
        strides.output_shape((3, 63), 12, 64, 0, False)


def test_plan_fields_come_from_the_struct() -> None:
    names = strides.param_fields()
    assert names[:5] == ("fmt", "batch", "M", "N", "K") and len(set(names)) == len(names) == 16
    lay = plan(numbered((5, 64)), 12, 64, 0, False)
    assert list(lay.params) == list(names) and lay.M == 5 and lay.N == 12


def test_plan_errors_are_value_errors_naming_the_argument() -> None:
    w = torch.zeros(12, 68, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"w: expected uint8 \[12, 68\]"):
        strides.plan(numbered((5, 64)), w[:, :60], "q8_0", 12, 64, backend="cpu")
    with pytest.raises(ValueError, match="path='vec' .* on the cuda backend supports fmt 'ternary'"):
        strides.plan(numbered((5, 64)), w, "q8_0", 12, 64, path="vec", backend="cuda")
    with pytest.raises(ValueError, match="backend: expected 'cpu', 'cuda' or 'metal'"):
        strides.plan(numbered((5, 64)), w, "q8_0", 12, 64, backend="tpu")
