"""Lossless import/export between other libraries' tensors and our blocks.

* MLX affine, every bit width (``wq`` uint32, ``scales``, ``biases``) <-> ``mlx2`` ... ``mlx8``;
* Hugging Face BitNet packed ternary weights (+ ``weight_scale``) -> ``ternary``;
* GGUF ``TQ1_0`` / ``TQ2_0`` tensors -> ``ternary``.
"""
from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np
import torch

from .formats import table, ternary
from .formats._bytes import read_f16
from .formats._checks import require_finite_f16
from .qtensor import QTensor, QuantizationWarning, as_uint8_tensor

__all__ = ["from_mlx", "to_mlx", "from_bitnet", "from_gguf_ternary"]


def _to_numpy(a, name: str) -> np.ndarray:
    """numpy view/copy of a numpy, torch or mlx array (bfloat16 widened to float32, exactly)."""
    if isinstance(a, np.ndarray):
        return a
    if isinstance(a, torch.Tensor):
        t = a.detach().cpu()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    if type(a).__module__.startswith("mlx"):
        import mlx.core as mx
        if a.dtype == mx.bfloat16:
            a = a.astype(mx.float32)
        return np.array(a)
    if np.isscalar(a) or isinstance(a, (list, tuple)):
        return np.asarray(a)
    raise ValueError(f"{name} must be a numpy, torch or mlx array, got {type(a).__name__}")


def _exact_f16(values: np.ndarray, name: str, fmt: str) -> np.ndarray:
    """``values`` as fp16, or a ValueError if any of them is not exactly representable."""
    v = values.astype(np.float32)
    with np.errstate(over="ignore"):
        h = v.astype(np.float16)
    lossy = ~(h.astype(np.float32) == v)
    if lossy.any():
        i = np.unravel_index(int(np.argmax(lossy)), v.shape)
        raise ValueError(f"{name}[{', '.join(map(str, i))}] = {v[i]!r} cannot be stored exactly as fp16 "
                         f"({fmt} keeps fp16 scales and biases; converting would change the weights)")
    return h


def _mlx_geometry(words: int, groups: int, group_size: int | None, bits: int | None) -> tuple[int, int]:
    """(group size, bits) of an MLX weight with ``words`` uint32 words and ``groups`` groups per row.

    A row holds ``groups * group_size * bits / 32`` words, so one of the two follows from the other;
    with neither, the group size is MLX's default (64), as in ``mx.quantize``.
    """
    if group_size is None and bits is None:
        group_size = 64
    if bits is None:
        if (32 * words) % (groups * group_size):
            raise ValueError(f"wq has {words} words per row, not a whole number of bits per weight for "
                             f"{groups} groups of {group_size}; pass bits=")
        bits = 32 * words // (groups * group_size)
    row = table.mlx_format(bits)  # raises for a width MLX has but torch-uqr lacks, or a wrong shape
    if group_size is None:
        if (32 * words) % (groups * bits):
            raise ValueError(f"wq has {words} words per row, not whole groups of {bits}-bit codes for {groups} groups")
        group_size = 32 * words // (groups * bits)
    row.block_geometry(group_size)  # raises on a group size the format lacks
    if words * 32 != groups * group_size * bits:
        raise ValueError(f"wq has {words} words per row but {groups} groups of {group_size} {bits}-bit codes "
                         f"need {groups * group_size * bits // 32}: the shape does not match bits/group_size")
    return group_size, bits


def from_mlx(wq, scales, biases, group_size: int | None = None, bits: int | None = None) -> QTensor:
    """MLX affine arrays (``mx.quantize(w, group_size, bits)``) -> ``QTensor("mlx<bits>")``, a pure
    repack (no value changes).

    wq: uint32 ``[N, K * bits / 32]``; scales, biases: ``[N, K/g]`` (fp16, or any dtype whose values
    fp16 holds exactly; anything else raises ``ValueError``). Negative scales are fine. ``bits`` and
    ``group_size`` are MLX's arguments of the same names; either one follows from the shapes and the
    other (neither: group size 64, MLX's default), so the weight's bit width need not be known.
    """
    wq = _to_numpy(wq, "wq")
    sc = _to_numpy(scales, "scales")
    bi = _to_numpy(biases, "biases")
    if wq.dtype != np.uint32 or wq.ndim != 2:
        raise ValueError(f"wq must be a 2-D uint32 array [N, K * bits / 32], got {wq.dtype} with shape {wq.shape}")
    N, words = wq.shape
    if N < 1 or words < 1:
        raise ValueError(f"wq must have at least one row and one word, got shape {wq.shape} (an empty tensor)")
    if sc.ndim != 2 or sc.shape[0] != N or sc.shape[1] < 1:
        raise ValueError(f"scales must have shape (N, K/group_size) with N = {N}, got {sc.shape}")
    if bi.shape != sc.shape:
        raise ValueError(f"biases must have the shape of scales {sc.shape}, got {bi.shape}")
    g, bits = _mlx_geometry(words, sc.shape[1], group_size, bits)
    fmt = f"mlx{bits}"
    K = sc.shape[1] * g
    sc16 = _exact_f16(sc, "scales", fmt)
    bi16 = _exact_f16(bi, "biases", fmt)
    for name, a in (("scales", sc16), ("biases", bi16)):
        if not np.isfinite(a).all():
            raise ValueError(f"{fmt}: {name} contain NaN or Inf")
    # uint32 words are little-endian, so their bytes are already MLX's LSB-first code stream; a
    # group's g * bits / 8 bytes are whole words (g is a multiple of 32).
    code_bytes = g * bits // 8
    qs = np.ascontiguousarray(wq.astype("<u4")).view(np.uint8).reshape(N, K // g, code_bytes)
    blocks = np.concatenate([sc16.reshape(N, -1, 1).view(np.uint8).reshape(N, -1, 2),
                             bi16.reshape(N, -1, 1).view(np.uint8).reshape(N, -1, 2), qs], axis=2)
    return QTensor(torch.from_numpy(blocks.reshape(N, -1)), fmt, (N, K), g)


def to_mlx(qt: QTensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``QTensor("mlx<bits>")`` -> MLX's ``(wq uint32 [N, K * bits / 32], scales fp16 [N, K/g],
    biases fp16 [N, K/g])``, for ``mx.dequantize`` / ``mx.quantized_matmul`` with
    ``group_size=qt.group_size, bits=<bits>``."""
    if not isinstance(qt, QTensor) or table.spec(qt.fmt).family != "mlx":
        names = ", ".join(f.name for f in table.family("mlx"))
        raise ValueError(f"to_mlx needs a QTensor of an MLX format ({names}), got {qt!r}")
    N, K, g = qt.N, qt.K, qt.group_size
    bits = table.spec(qt.fmt).code_bits
    blocks = qt.data.detach().cpu().numpy().reshape(N, K // g, 4 + g * bits // 8)
    scales = np.ascontiguousarray(blocks[:, :, 0:2]).view(np.float16).reshape(N, K // g)
    biases = np.ascontiguousarray(blocks[:, :, 2:4]).view(np.float16).reshape(N, K // g)
    wq = np.ascontiguousarray(blocks[:, :, 4:]).reshape(N, K * bits // 8).view("<u4").astype(np.uint32)
    return wq, scales, biases


_F16_MIN_NORMAL = 2.0 ** -14


def _scale_to_f16(d: torch.Tensor, what: str) -> torch.Tensor:
    """Per-row factors ``d`` ``[N]`` as fp16 values; too large raises, too small warns (the rows)."""
    h = d.to(torch.float16).float()
    if not bool(torch.isfinite(h).all()):
        raise ValueError(f"ternary: {what} does not fit fp16 (got max |d| = {d.abs().max().item():.4g})")
    small = (d != 0) & (d.abs() < _F16_MIN_NORMAL)
    if bool(small.any()):
        rows = torch.nonzero(small).reshape(-1).tolist()
        shown = ", ".join(map(str, rows[:10])) + (", ..." if len(rows) > 10 else "")
        worst = d[small].abs().min().item()
        warnings.warn(QuantizationWarning(
            f"ternary: {what} of {len(rows)} rows is below fp16's normal range (rows {shown}; smallest "
            f"|d| = {worst:.4g} < 2**-14): it keeps fewer than 11 significant bits"
            + (", and rounds to 0 for some rows" if bool((h[small] == 0).any()) else ""), rows), stacklevel=3)
    return h


def from_bitnet(packed, weight_scale, out_features: int, convention: str = "divide") -> QTensor:
    """Hugging Face BitNet weights -> ``QTensor("ternary")``.

    packed: uint8 ``[ceil(N/4), K]``; bits ``2i..2i+1`` of packed row r hold row ``i·ceil(N/4) + r``
    as value + 1. weight_scale: a scalar (or ``[1]``) or one value per output row ``[N]``.
    convention: ``"divide"`` (``BitLinear``: W = t / weight_scale) or ``"multiply"``
    (``AutoBitLinear``: W = t · weight_scale). The trits are kept exactly; the per-block scale is
    the fp16 nearest to the resulting factor (exact for the multiply convention with bf16/fp16 scales).
    """
    if convention not in ("divide", "multiply"):
        raise ValueError(f"convention must be 'divide' or 'multiply', got {convention!r}")
    p = packed if isinstance(packed, torch.Tensor) else _to_numpy(packed, "packed")
    if p.dtype not in (torch.uint8, np.uint8) or p.ndim != 2:
        raise ValueError(f"packed must be a 2-D uint8 array [ceil(N/4), K], got {p.dtype} {tuple(p.shape)}")
    p = as_uint8_tensor(p, "packed")
    N = int(out_features)
    rows = (N + 3) // 4
    if N < 1 or p.shape[0] != rows:
        raise ValueError(f"packed has {p.shape[0]} rows; out_features={N} needs ceil(N/4) = {rows}")
    K = p.shape[1]
    if K < 1 or K % ternary.BLOCK:
        raise ValueError(f"ternary: K={K} (packed's columns) must be a positive multiple of the block size "
                         f"{ternary.BLOCK}")
    shifts = torch.arange(0, 8, 2, device=p.device, dtype=torch.int32).view(4, 1, 1)
    codes = ((p.to(torch.int32).unsqueeze(0) >> shifts) & 3).reshape(4 * rows, K)[:N]
    bad = torch.nonzero(codes == 3)
    if bad.numel():
        r, k = bad[0].tolist()
        raise ValueError(f"packed: row {r}, column {k} holds code 3; BitNet codes are value + 1 in {{0, 1, 2}}")
    ws = torch.as_tensor(_to_numpy(weight_scale, "weight_scale"), dtype=torch.float32).reshape(-1).to(p.device)
    if ws.numel() not in (1, N):
        raise ValueError(f"weight_scale must have 1 or out_features={N} values, got {ws.numel()}")
    if not bool(torch.isfinite(ws).all()) or (convention == "divide" and bool((ws == 0).any())):
        raise ValueError("weight_scale must be finite (and non-zero for the divide convention)")
    d = (1.0 / ws) if convention == "divide" else ws
    d = _scale_to_f16(d.expand(N).contiguous(), "the weight scale").repeat_interleave(K // ternary.BLOCK)
    blocks = ternary.pack(d, codes.reshape(-1, ternary.BLOCK) - 1)
    return QTensor(blocks.reshape(N, -1), "ternary", (N, K))


_TQ = {"TQ1_0": 54, "TQ2_0": 66}  # bytes per 256-weight block
_TQ_BLOCK = 256


def _tq2_codes(b: torch.Tensor) -> torch.Tensor:
    """TQ2_0 ``u8 qs[64]`` -> codes ``[n, 256]``: byte 32c + l, bits 2s.. hold element 128c + 32s + l."""
    q = b[:, :64].to(torch.int32).reshape(-1, 2, 1, 32)
    shifts = torch.arange(0, 8, 2, device=b.device, dtype=torch.int32).view(1, 1, 4, 1)
    return ((q >> shifts) & 3).reshape(-1, 256)


def _trits(q: torch.Tensor, count: int) -> torch.Tensor:
    """Base-3 digits stored as fixed-point fractions: digit s of byte q is ``((q·3^s mod 256)·3) >> 8``."""
    pows = torch.tensor([1, 3, 9, 27, 81][:count], device=q.device, dtype=torch.int32)
    return (((q.unsqueeze(-2) * pows.view(-1, 1)) & 255) * 3) >> 8


def _tq1_codes(b: torch.Tensor) -> torch.Tensor:
    """TQ1_0 ``u8 qs[48]; u8 qh[4]`` -> codes ``[n, 256]`` (5 trits per qs byte, 4 per qh byte)."""
    q = b.to(torch.int32)
    n = q.shape[0]
    head = _trits(q[:, 0:32], 5).reshape(n, 160)     # digit s of byte l: element 32s + l
    mid = _trits(q[:, 32:48], 5).reshape(n, 80)      # element 160 + 16s + l
    tail = _trits(q[:, 48:52], 4).reshape(n, 16)     # element 240 + 4s + l
    return torch.cat([head, mid, tail], 1)


def from_gguf_ternary(raw, kind: str, shape: Sequence[int]) -> QTensor:
    """A GGUF ``TQ1_0`` or ``TQ2_0`` tensor's bytes (rows of 256-weight blocks) -> ``QTensor("ternary")``.

    Lossless: each 256-weight block's fp16 scale is copied to its eight 32-weight blocks. Raises
    ``ValueError`` on a wrong length, K not a multiple of 256, a non-finite scale, or a TQ2_0 code 3
    (which ggml would decode as +2, not a ternary value).
    """
    if kind not in _TQ:
        raise ValueError(f"kind must be 'TQ1_0' or 'TQ2_0', got {kind!r}")
    N, K = (int(v) for v in shape)
    if N < 1 or K < 1 or K % _TQ_BLOCK:
        raise ValueError(f"{kind}: K={K} must be a positive multiple of {_TQ_BLOCK} (and N={N} positive)")
    t = as_uint8_tensor(raw, f"{kind} raw")
    size = _TQ[kind]
    expected = N * K // _TQ_BLOCK * size
    if t.numel() != expected:
        raise ValueError(f"{kind}: got {t.numel()} bytes, expected {expected} for shape ({N}, {K})")
    b = t.reshape(-1, size)
    d = read_f16(b, size - 2)
    require_finite_f16(d, kind, "scale d")
    codes = _tq1_codes(b) if kind == "TQ1_0" else _tq2_codes(b)
    if kind == "TQ2_0" and bool((codes == 3).any()):
        blk = int(torch.nonzero((codes == 3).any(1))[0, 0])
        raise ValueError(f"TQ2_0: block {blk} contains code 3, which is not a ternary value")
    blocks = ternary.pack(d.repeat_interleave(_TQ_BLOCK // ternary.BLOCK), codes.reshape(-1, ternary.BLOCK) - 1)
    return QTensor(blocks.reshape(N, -1), "ternary", (N, K))
