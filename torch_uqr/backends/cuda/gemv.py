"""Small-M kernel: one activation row per program, decode + FMA on the CUDA cores, no tensor core.

At M = 1 the product is a stream over the packed weights; padding a single row to a 16-wide dot
costs a shared-memory round trip per tile for nothing. Here each program owns BN weight rows, one
x row and one slice of K, accumulates w * x elementwise in fp32 ([BN, BK] registers, x read in the
weights' storage order) and reduces once at the end. Split-K partials go through reduce.py.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .configs import VecConfig
from .decode import decode_tile
from .formats_meta import FORMAT_CODES
from ..strides import GemmPlan
from .reduce import new_workspace, splitk_reduce, store_row_results


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, M, N, K, w_row_stride,
                 x_bs, x_rs, x_hd, x_hs, y_bs, y_rs, y_hd, y_hs,
                 FMT: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, NS: tl.constexpr,
                 TILES: tl.constexpr, SPLIT_K: tl.constexpr, REDUCE_EACH: tl.constexpr):
    b = tl.program_id(2) // M
    m = tl.program_id(2) % M
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    row_off = n[:, None, None].to(tl.int64) * w_row_stride
    n_ok = (n < N)[:, None, None]
    x_row = x_ptr + b.to(tl.int64) * x_bs + m.to(tl.int64) * x_rs
    n_sub = K // 32
    kt_begin = tl.program_id(1) * TILES
    # Either a [BN, BK] accumulator reduced once at the end (no shuffles in the loop) or a [BN] one
    # reduced every step (a quarter of the registers: more programs resident; ncu showed
    # the [BN, BK] form register-limited at 31 % occupancy).
    if REDUCE_EACH:
        acc = tl.zeros([BN], dtype=tl.float32)
    else:
        acc = tl.zeros([BN, NS * 32], dtype=tl.float32)
    for i in range(TILES):  # constexpr trip count: see gemm.py
        s0 = (kt_begin + i) * NS
        w, kl = decode_tile(w_ptr, row_off, n_ok, s0, n_sub, FMT, GROUP, BN, NS, False)
        k = s0 * 32 + kl
        xv = tl.load(x_row + (k // x_hd) * x_hs + k % x_hd, mask=k < K, other=0.0).to(tl.float32)
        if REDUCE_EACH:
            acc += tl.sum(w * xv[None, :], axis=1)
        else:
            acc += w * xv[None, :]
    if not REDUCE_EACH:
        acc = tl.sum(acc, axis=1)
    store_row_results(y_ptr, ws_ptr, acc, n, N, b, m, M, y_bs, y_rs, y_hd, y_hs, SPLIT_K)


def gemm_gemv(lay: GemmPlan, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int,
              cfg: VecConfig) -> None:
    """Run the row kernel, writing ``lay.y``."""
    n_tiles = triton.cdiv(K // 32, cfg.NS)
    tiles_per_split = triton.cdiv(n_tiles, max(1, min(cfg.SPLIT_K, n_tiles)))
    split_k = triton.cdiv(n_tiles, tiles_per_split)
    ws = new_workspace(split_k, lay, N) if split_k > 1 else lay.y
    grid = (triton.cdiv(N, cfg.BN), split_k, lay.batch * lay.M)
    _gemv_kernel[grid](lay.x, w, lay.y, ws, lay.M, N, K, w.stride(0), *lay.kernel_strides(),
                       FORMAT_CODES[fmt], group_size, cfg.BN, cfg.NS, tiles_per_split, split_k,
                       cfg.reduce_each, num_warps=cfg.num_warps)
    if split_k > 1:
        splitk_reduce(ws, lay, N)
