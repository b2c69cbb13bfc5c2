"""Ternary ``vec`` path: no multiplies per weight, only select-and-add on the CUDA cores.

Each weight is -1, 0 or +1, so x·w is a signed sum of activations; the block scale d multiplies
the 32-element partial sum once (the BitNet way), which is the only multiply left. One program owns
BN weight rows, one activation row and one slice of K, so the weights are re-read for every row of
x: this path exists for token generation (M = 1) and for the seed's section-3 comparison with mma.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .configs import VecConfig
from .decode import ternary_codes
from ..strides import GemmPlan
from .reduce import new_workspace, splitk_reduce, store_row_results


@triton.jit
def _ternary_vec_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, M, N, K, w_row_stride,
                        x_bs, x_rs, x_hd, x_hs, y_bs, y_rs, y_hd, y_hs,
                        BN: tl.constexpr, NS: tl.constexpr, TILES: tl.constexpr, SPLIT_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    b = tl.program_id(2) // M
    m = tl.program_id(2) % M
    n = pid_n * BN + tl.arange(0, BN)
    t = tl.arange(0, 32)[None, None, :]
    row_off = n[:, None, None].to(tl.int64) * w_row_stride
    n_ok = (n < N)[:, None, None]
    x_row = x_ptr + b.to(tl.int64) * x_bs + m.to(tl.int64) * x_rs
    n_sub = K // 32
    kt_begin = pid_k * TILES
    acc = tl.zeros([BN, NS], dtype=tl.float32)
    # TILES is a constexpr trip count (Triton's interpreter cannot loop to a runtime bound under
    # numpy >= 2.4). The last split may run past the end: those sub-blocks are masked, no loads.
    for i in range(TILES):
        s0 = (kt_begin + i) * NS
        code, d = ternary_codes(w_ptr, row_off, n_ok, s0, n_sub, BN, NS)
        s3 = s0 + tl.arange(0, NS)[None, :, None]
        k = s3 * 32 + t
        xv = tl.load(x_row + (k // x_hd) * x_hs + k % x_hd, mask=s3 < n_sub, other=0.0).to(tl.float32)
        # a zero trit adds x * 0, so NaN / Inf in x reach the output as in a float matmul
        signed = tl.where(code == 2, xv, tl.where(code == 0, -xv, xv * 0.0))
        acc += tl.sum(signed, axis=2) * tl.reshape(d, (BN, NS))
    store_row_results(y_ptr, ws_ptr, tl.sum(acc, axis=1), n, N, b, m, M, y_bs, y_rs, y_hd, y_hs, SPLIT_K)

def gemm_ternary_vec(lay: GemmPlan, w: torch.Tensor, N: int, K: int, cfg: VecConfig) -> None:
    """Run the add/subtract kernel, writing ``lay.y``."""
    n_tiles = triton.cdiv(K // 32, cfg.NS)
    tiles_per_split = triton.cdiv(n_tiles, max(1, min(cfg.SPLIT_K, n_tiles)))
    split_k = triton.cdiv(n_tiles, tiles_per_split)
    ws = new_workspace(split_k, lay, N) if split_k > 1 else lay.y
    grid = (triton.cdiv(N, cfg.BN), split_k, lay.batch * lay.M)
    _ternary_vec_kernel[grid](lay.x, w, lay.y, ws, lay.M, N, K, w.stride(0), *lay.kernel_strides(),
                              cfg.BN, cfg.NS, tiles_per_split, split_k, num_warps=cfg.num_warps)
    if split_k > 1:
        splitk_reduce(ws, lay, N)
