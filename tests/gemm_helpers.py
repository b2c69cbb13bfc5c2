"""Shared helpers of the operator tests: fresh random weights, the float64 reference, the error."""
from __future__ import annotations

import functools
import importlib
import os

import torch

import torch_uqr as uqr
from torch_uqr.formats import table as format_table

# The format registry (torch_uqr.formats the attribute is the formats() function).
uqr_formats = importlib.import_module("torch_uqr.formats")

# (fmt, group_size): every format of the format table, a grouped one at each group size, except the
# MLX family's other widths (mlx2 ... mlx8) at their default group size only: they share mlx4's
# group handling and one bitstream decoder, and test_formats_mlx_family.py runs every width at
# every group size through uqr.gemm on the CPU and the Metal emulator against float64.
FORMAT_CASES = [(f, g) for f, g in format_table.format_cases()
                if g is None or f == "mlx4" or g == format_table.spec(f).default_group_size]
FORMAT_IDS = [f if g is None else f"{f}-g{g}" for f, g in FORMAT_CASES]

# Max-abs error relative to max |reference|: fp32 is accumulation error only; fp16/bf16 add the
# rounding of y to the output dtype (bf16: 2^-9 relative).
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}

# Fresh data every run; the seed is printed by failing asserts so a failure can be replayed.
SEED = int(os.environ.get("UQR_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
_gen = torch.Generator().manual_seed(SEED)


def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen).to(dtype)


@functools.lru_cache(maxsize=None)
def weights(fmt: str, group_size: int | None, N: int, K: int) -> tuple[uqr.QTensor, torch.Tensor]:
    """Random valid packed blocks (every field drawn over its range, so negative mlx4 scales,
    q8_0's -128, all q4_k scale bits, every var_affine depth mix occur) and their float64
    reference decode; cached for the session."""
    g = group_size or 0
    data = uqr_formats.get(fmt).random_blocks(N, K, _gen, g)
    qt = uqr.QTensor.from_bytes(data, fmt, (N, K), group_size)
    return qt, uqr.dequantize(qt).double()


def quantized(fmt: str, group_size: int | None, N: int, K: int) -> tuple[uqr.QTensor, torch.Tensor]:
    """A weight produced by the format's quantizer (real-model-like blocks) and its reference."""
    qt = uqr.quantize(randn(N, K) * 0.05, fmt, group_size=group_size)
    return qt, uqr.dequantize(qt).double()


def reference(x: torch.Tensor, W: torch.Tensor, out_heads: int = 0, in_heads: bool = False) -> torch.Tensor:
    """x @ W.T in float64 with the operator's layout rules applied by plain torch indexing."""
    xd = x.double()
    if in_heads:  # [..., H, M, D] -> [..., M, H*D]
        xd = xd.transpose(-3, -2)
        xd = xd.reshape(*xd.shape[:-2], -1)
    y = xd @ W.T
    if out_heads:  # [..., M, N] -> [..., H, M, D]
        y = y.reshape(*y.shape[:-1], out_heads, -1).transpose(-3, -2)
    return y


def assert_close(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str = "") -> None:
    assert y.shape == ref.shape, f"{what}: shape {tuple(y.shape)} != {tuple(ref.shape)}"
    assert y.dtype == dtype, f"{what}: dtype {y.dtype} != {dtype}"
    assert bool(torch.isfinite(y).all()), f"{what}: non-finite output (unwritten element?) seed={SEED}"
    scale = ref.abs().max().item()
    err = (y.double() - ref).abs().max().item() / max(scale, 1e-30)
    assert err < TOL[dtype], f"{what}: rel error {err:.3g} >= {TOL[dtype]:g} (seed={SEED})"


# Path "int8": elements per x scale, q4_0 one per 32-element block, q4_k, var_affine and exl3 one
# per 256-element block (its eight sub-block dots are scaled in integers, as llama.cpp's q8_K).
def int8_x_span(fmt: str, group_size: int | None = None) -> int:
    """Elements per x scale of path "int8": one weight block (32, or 256 for the super-block
    formats), or one group of a grouped (MLX) format."""
    spec = format_table.spec(fmt)
    return int(group_size or spec.default_group_size) if spec.grouped else spec.block


def rows_of(x: torch.Tensor, in_heads: bool) -> torch.Tensor:
    """x as [..., M, K] rows (the order in which the op reads K)."""
    if not in_heads:
        return x
    xt = x.transpose(-3, -2)
    return xt.reshape(*xt.shape[:-2], -1)


def int8_round(rows: torch.Tensor, span: int = 32) -> torch.Tensor:
    """Path "int8"'s activation rounding (docs/operator.md), in fp32 arithmetic as the kernels do
    it, returned as the float64 values the integer codes stand for (code * scale); one scale
    d = amax / 127 per ``span``, codes round-half-even(x * (1 / d)), an all-zero span gets d = 0."""
    xf = rows.float()
    blocks = xf.reshape(-1, span)
    d = blocks.abs().amax(dim=1, keepdim=True) / 127.0
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inv).clamp(-128, 127)  # torch.round is half-to-even, as the kernels
    return (q.double() * d.double()).reshape(xf.shape)


def int8_reference(x: torch.Tensor, W: torch.Tensor, fmt: str, out_heads: int = 0,
                   in_heads: bool = False, group_size: int | None = None) -> torch.Tensor:
    """The float64 y that path "int8" approximates to fp32 accumulation: x rounded to int8 as the
    kernels round it, times the float64 W, in the operator's layout."""
    return reference(int8_round(rows_of(x, in_heads), int8_x_span(fmt, group_size)), W, out_heads)
