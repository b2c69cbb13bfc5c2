"""The tensor-core kernel: decode a packed weight tile on the fly and feed it to tl.dot.

Operands are swapped (acc = W_tile @ x_tile^T, shape [BN, BM]): the decoded weights are the dot's
first operand, which Triton can keep in registers for Hopper's wgmma, and the activations become
the second, so a single row of x (M = 1) only pads the dot's cheap N side to 16 instead of its
64-row M side. One kernel then serves every M; the configuration (configs.py) changes with M, and
for small M a split over K gives the chip enough programs (partials summed by reduce.py).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .configs import GemmConfig
from .decode import decode_tile
from .formats_meta import FORMAT_CODES
from ..strides import GemmPlan
from .reduce import new_workspace, splitk_reduce


@triton.jit
def _gemm_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, M, N, K, w_row_stride,
                 x_bs, x_rs, x_hd, x_hs, y_bs, y_rs, y_hd, y_hs,
                 FMT: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                 NS: tl.constexpr, TILES: tl.constexpr, SPLIT_K: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    b = tl.program_id(2)
    # m varies fastest so the programs sharing one weight tile run together and its bytes come
    # from HBM once, then L2.
    num_m = tl.cdiv(M, BM)
    pid_n = pid // num_m
    pid_m = pid % num_m
    n = pid_n * BN + tl.arange(0, BN)
    m = pid_m * BM + tl.arange(0, BM)
    row_off = n[:, None, None].to(tl.int64) * w_row_stride
    n_ok = (n < N)[:, None, None]
    m_ok = (m < M)[None, :]
    x_rows = x_ptr + b.to(tl.int64) * x_bs + m[None, :].to(tl.int64) * x_rs
    n_sub = K // 32
    kt_begin = pid_k * TILES
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    # TILES is a constexpr trip count (Triton's interpreter cannot loop to a runtime bound under
    # numpy >= 2.4). The last split may run past the end: those sub-blocks are masked, no loads.
    for i in range(TILES):
        s0 = (kt_begin + i) * NS
        w, kl = decode_tile(w_ptr, row_off, n_ok, s0, n_sub, FMT, GROUP, BN, NS, False)
        w = w.to(x_ptr.dtype.element_ty)
        k = s0 * 32 + kl  # x is read in the weights' storage order (decode.py)
        x_cols = ((k // x_hd) * x_hs + k % x_hd)[:, None]
        xt = tl.load(x_rows + x_cols, mask=(k < K)[:, None] & m_ok, other=0.0)
        if UPCAST_DOT:  # same operand rounding, fp32 dot (see interpreter_needs_upcast)
            acc = tl.dot(w.to(tl.float32), xt.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(w, xt, acc, input_precision=DOT_PRECISION)
    if SPLIT_K == 1:
        y_cols = ((n // y_hd) * y_hs + n % y_hd)[:, None]
        y = y_ptr + b.to(tl.int64) * y_bs + m[None, :].to(tl.int64) * y_rs + y_cols
        tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=(n < N)[:, None] & m_ok)
    else:
        plane = (pid_k * tl.num_programs(2) + b).to(tl.int64) * M * N
        ws = ws_ptr + plane + m[None, :].to(tl.int64) * N + n[:, None]
        tl.store(ws, acc, mask=(n < N)[:, None] & m_ok)


def dot_precision(dtype: torch.dtype) -> str:
    """The tensor-core precision of fp32 activations follows PyTorch's own fp32 matmul rule
    (``torch.get_float32_matmul_precision()``): "highest" (PyTorch's default) keeps fp32 accuracy
    with three tf32 products per multiply (error ~1e-6 relative), "high" / "medium" allow one tf32
    product (~3e-4). Half-precision operands are exact in any mode."""
    if dtype != torch.float32:
        return "ieee"
    return "tf32x3" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def interpreter_needs_upcast(dtype: torch.dtype) -> bool:
    """Triton 3.6's CPU interpreter computes bf16 tl.dot wrongly (numpy has no bf16): there the
    operands are still rounded to bf16 but multiplied in fp32, which is exact for bf16 products."""
    return dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"


def gemm_mma(lay: GemmPlan, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int,
             cfg: GemmConfig) -> None:
    """Run the tensor-core kernel, writing ``lay.y``."""
    n_tiles = triton.cdiv(K // 32, cfg.NS)
    split_k = max(1, min(cfg.SPLIT_K, n_tiles))
    tiles_per_split = triton.cdiv(n_tiles, split_k)
    split_k = triton.cdiv(n_tiles, tiles_per_split)  # no empty splits: every ws plane is written
    ws = new_workspace(split_k, lay, N) if split_k > 1 else lay.y
    grid = (triton.cdiv(N, cfg.BN) * triton.cdiv(lay.M, cfg.BM), split_k, lay.batch)
    _gemm_kernel[grid](lay.x, w, lay.y, ws, lay.M, N, K, w.stride(0), *lay.kernel_strides(),
                       FORMAT_CODES[fmt], group_size, cfg.BN, cfg.BM, cfg.NS, tiles_per_split, split_k,
                       dot_precision(lay.x.dtype),
                       interpreter_needs_upcast(lay.x.dtype), num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split_k > 1:
        splitk_reduce(ws, lay, N)
