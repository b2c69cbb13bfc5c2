"""Decode a whole packed weight into a dense [N, K] matrix (fp32 / fp16 / bf16).

Two users: the tests, which hold every Triton decoder bit-exact against the float64 reference
through it, and the large-M path that decodes once into a scratch buffer and hands the product to
cuBLAS (torch.matmul), which wins when M is large enough that the decode pass is amortised. That
path prefers ``dequantize_cuda`` (the CUDA C++ kernel csrc/cuda/dequant.cu, built with the
extension) when it exists; ``dispatch.scratch_decoder`` makes the choice.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .decode import decode_tile
from .formats_meta import FORMAT_CODES, block_geometry

DEQUANT_BN = 8    # weight rows per program (swept: 8 x 512 columns beat 16 x 256 by 7-17%)
DEQUANT_NS = 16   # 32-element sub-blocks per program
DEQUANT_WARPS = 4


@triton.jit
def _dequant_kernel(w_ptr, out_ptr, N, K, row_bytes,
                    FMT: tl.constexpr, GROUP: tl.constexpr, BN: tl.constexpr, NS: tl.constexpr):
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    s0 = tl.program_id(1) * NS
    w, kl = decode_tile(w_ptr, n[:, None, None].to(tl.int64) * row_bytes, (n < N)[:, None, None],
                        s0, K // 32, FMT, GROUP, BN, NS, True)
    k = s0 * 32 + kl
    out = out_ptr + n[:, None].to(tl.int64) * K + k[None, :]
    tl.store(out, w.to(out_ptr.dtype.element_ty), mask=(n < N)[:, None] & (k < K)[None, :])

def dequantize_triton(w: torch.Tensor, fmt: str, N: int, K: int, group_size: int = 0,
                      dtype: torch.dtype = torch.float32, out: torch.Tensor | None = None,
                      tile: tuple[int, int, int] | None = None) -> torch.Tensor:
    """Decode packed ``w`` (uint8 [N, row_bytes]) to ``dtype`` [N, K] with the Triton decoders;
    ``tile`` = (rows, sub-blocks, warps) overrides the launch shape (benchmark sweeps)."""
    elems, nbytes = block_geometry(fmt, group_size)
    if w.dtype != torch.uint8 or w.dim() != 2 or w.shape[0] != N or w.shape[1] != K // elems * nbytes:
        raise ValueError(f"w: expected uint8 [{N}, {K // elems * nbytes}] for {fmt} with K={K}, "
                         f"got {w.dtype} {list(w.shape)}")
    if out is None:
        out = torch.empty((N, K), dtype=dtype, device=w.device)
    bn, ns, warps = tile or (DEQUANT_BN, DEQUANT_NS, DEQUANT_WARPS)
    grid = (triton.cdiv(N, bn), triton.cdiv(K // 32, ns))
    _dequant_kernel[grid](w, out, N, K, w.stride(0), FORMAT_CODES[fmt], group_size, bn, ns, num_warps=warps)
    return out


def dequantize_cuda(w: torch.Tensor, fmt: str, N: int, K: int, group_size: int = 0,
                    dtype: torch.dtype = torch.float32, out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode packed ``w`` (uint8 [N, row_bytes], any row stride) to ``dtype`` [N, K] with the CUDA
    C++ kernel (op ``uqr::_dequant_cuda``, which checks every argument); writes into ``out`` when
    given (a contiguous [N, K] CUDA tensor, whose dtype then wins)."""
    if out is None:
        out = torch.empty((N, K), dtype=dtype, device=w.device)
    torch.ops.uqr._dequant_cuda(w, fmt, N, K, group_size, out)
    return out
