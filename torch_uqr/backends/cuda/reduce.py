"""Split-K epilogue: sum the fp32 partial products and store y through the stride description."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..strides import GemmPlan

REDUCE_BLOCK = 1024


@triton.jit
def _splitk_reduce_kernel(ws_ptr, y_ptr, M, N, y_bs, y_rs, y_hd, y_hs,
                          SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(1)
    nb = tl.num_programs(1)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < M * N
    plane = (b * M * N).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for p in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + (p * nb * M * N).to(tl.int64) + plane + i, mask=mask, other=0.0)
    m = i // N
    n = i % N
    y = y_ptr + b.to(tl.int64) * y_bs + m.to(tl.int64) * y_rs + (n // y_hd) * y_hs + n % y_hd
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def store_row_results(y_ptr, ws_ptr, out, n, N, b, m, M, y_bs, y_rs, y_hd, y_hs, SPLIT_K: tl.constexpr):
    """Epilogue of the one-activation-row kernels (gemv, ternary vec): ``out`` [BN] holds
    y(b, m, n) (or this split's part of it, stored to the workspace plane of split program_id(1))."""
    if SPLIT_K == 1:
        y = y_ptr + b.to(tl.int64) * y_bs + m.to(tl.int64) * y_rs + (n // y_hd) * y_hs + n % y_hd
        tl.store(y, out.to(y_ptr.dtype.element_ty), mask=n < N)
    else:
        plane = (tl.program_id(1) * (tl.num_programs(2) // M) + b).to(tl.int64) * M * N
        tl.store(ws_ptr + plane + m.to(tl.int64) * N + n, out, mask=n < N)


def new_workspace(split_k: int, lay: GemmPlan, N: int) -> torch.Tensor:
    """fp32 [split_k, batch, M, N] partial sums; every element is written by exactly one program."""
    return torch.empty((split_k, lay.batch, lay.M, N), dtype=torch.float32, device=lay.x.device)


def splitk_reduce(ws: torch.Tensor, lay: GemmPlan, N: int) -> None:
    """y = sum over the split axis of ``ws``, cast to y's dtype and scattered into its layout."""
    split_k = ws.shape[0]
    grid = (triton.cdiv(lay.M * N, REDUCE_BLOCK), lay.batch)
    _splitk_reduce_kernel[grid](ws, lay.y, lay.M, N, lay.y_batch_stride, lay.y_row_stride, lay.y_head_dim, lay.y_head_stride,
                                split_k, REDUCE_BLOCK)
