"""Lossless import/export between other libraries' tensors and our blocks.

* MLX affine, every bit width (``wq`` uint32, ``scales``, ``biases`` in fp16, bf16 or fp32) <->
  ``mlx2`` ... ``mlx8`` and their ``_bf16`` / ``_f32`` rows;
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


#: The MLX family's header dtypes, narrowest first: a value that the first holds exactly is held by
#: the wider ones only if they contain it (f16 and bf16 do not contain each other; f32 holds both).
_FIELD_ORDER = ("f16", "bf16", "f32")
_TORCH_TAGS = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}
_NUMPY_TAGS = {np.dtype(np.float16): "f16", np.dtype(np.float32): "f32"}
_FIELD_NAMES = {"f16": "fp16", "bf16": "bf16", "f32": "fp32"}


def _field_values(a, name: str) -> tuple[np.ndarray, str | None]:
    """(float64 values, header dtype tag or None) of a scales / biases array of numpy, torch or mlx.

    The tag is the array's own dtype where it is one of the family's header dtypes ("f16", "bf16",
    "f32"); float64 holds every value of the three exactly, so nothing is rounded here.
    """
    tag = None
    if isinstance(a, torch.Tensor):
        tag = _TORCH_TAGS.get(a.dtype)
    elif type(a).__module__.startswith("mlx"):
        import mlx.core as mx
        tag = {mx.float16: "f16", mx.bfloat16: "bf16", mx.float32: "f32"}.get(a.dtype)
    elif isinstance(a, np.ndarray):
        tag = _NUMPY_TAGS.get(a.dtype)
    values = _to_numpy(a, name)
    if not (np.issubdtype(values.dtype, np.floating) or np.issubdtype(values.dtype, np.integer)):
        raise ValueError(f"{name} must be a floating-point array, got {values.dtype}")
    return values.astype(np.float64), tag


def _rounded(values: np.ndarray, dtype: str) -> np.ndarray:
    """float64 ``values`` rounded to the header dtype (and back to float64)."""
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "f16":
            return values.astype(np.float16).astype(np.float64)
        if dtype == "f32":
            return values.astype(np.float32).astype(np.float64)
    return torch.from_numpy(values).to(torch.bfloat16).double().numpy()


def _exact_in(values: np.ndarray, dtype: str) -> bool:
    return bool((_rounded(values, dtype) == values).all())


def _require_exact(values: np.ndarray, dtype: str, name: str, fmt: str) -> None:
    """A ValueError naming the first value of ``values`` that ``dtype`` cannot hold exactly."""
    lossy = ~(_rounded(values, dtype) == values)
    if lossy.any():
        i = np.unravel_index(int(np.argmax(lossy)), values.shape)
        field = _FIELD_NAMES[dtype]
        raise ValueError(f"{name}[{', '.join(map(str, i))}] = {values[i]!r} cannot be stored exactly as {field} "
                         f"({fmt} keeps {field} scales and biases; converting would change the weights)")


def _field_bytes(values: np.ndarray, dtype: str) -> np.ndarray:
    """Exactly representable float64 values ``[N, G]`` as little-endian header fields ``[N, G, size]``."""
    N, G = values.shape
    if dtype == "f16":
        raw = values.astype("<f2").view(np.uint8)
    elif dtype == "f32":
        raw = values.astype("<f4").view(np.uint8)
    else:
        raw = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").view(np.uint8)
    return np.ascontiguousarray(raw).reshape(N, G, -1)


def _pick_field_dtype(sc: np.ndarray, bi: np.ndarray, tags: tuple, scale_dtype: str | None, compact: bool) -> str:
    """The header dtype of the row ``from_mlx`` makes (see there)."""
    if scale_dtype is not None:
        if scale_dtype not in _FIELD_ORDER:
            raise ValueError(f"scale_dtype: expected one of {_FIELD_ORDER} or None, got {scale_dtype!r}")
        dtype = scale_dtype
    elif tags[0] is not None and tags[0] == tags[1]:
        dtype = tags[0]
    elif tags[0] is not None and tags[1] is not None:
        dtype = "f32"  # fp16 and bf16 mixed: fp32 holds both
    else:  # another dtype (float64, integers, lists): the narrowest that holds every value
        dtype = next((d for d in _FIELD_ORDER if _exact_in(sc, d) and _exact_in(bi, d)), "f32")
    if compact and scale_dtype is None and dtype != "f16" and _exact_in(sc, "f16") and _exact_in(bi, "f16"):
        dtype = "f16"
    return dtype


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
    # (every header dtype has the same widths and group sizes, so the fp16 row answers for all)
    if group_size is None:
        if (32 * words) % (groups * bits):
            raise ValueError(f"wq has {words} words per row, not whole groups of {bits}-bit codes for {groups} groups")
        group_size = 32 * words // (groups * bits)
    row.block_geometry(group_size)  # raises on a group size the format lacks
    if words * 32 != groups * group_size * bits:
        raise ValueError(f"wq has {words} words per row but {groups} groups of {group_size} {bits}-bit codes "
                         f"need {groups * group_size * bits // 32}: the shape does not match bits/group_size")
    return group_size, bits


def from_mlx(wq, scales, biases, group_size: int | None = None, bits: int | None = None, *,
             scale_dtype: str | None = None, compact: bool = False) -> QTensor:
    """MLX affine arrays (``mx.quantize(w, group_size, bits)``) -> an MLX-family ``QTensor``, a pure
    repack (no value changes).

    wq: uint32 ``[N, K * bits / 32]``; scales, biases: ``[N, K/g]``, numpy, torch or mlx arrays.
    MLX keeps them in the model's dtype, and so does the result: fp16 gives ``mlx<bits>``, bf16
    ``mlx<bits>_bf16``, fp32 ``mlx<bits>_f32`` (mixed fp16 / bf16: fp32; any other dtype: the
    narrowest of the three that holds every value). ``scale_dtype`` ("f16", "bf16", "f32") asks for
    that row instead; without it, ``compact=True`` takes the fp16 row whenever every scale and bias
    is exactly an fp16 value (the fp16 rows have the most kernels: CUDA tensor cores and CPU int8 for mlx4;
    :func:`to_mlx` then gives fp16 back). A value the chosen dtype cannot hold raises ``ValueError``;
    nothing is ever rounded. Negative scales are fine. ``bits`` and ``group_size`` are MLX's
    arguments of the same names; either one follows from the shapes and the other (neither: group
    size 64, MLX's default), so the weight's bit width need not be known.
    """
    sc, sc_tag = _field_values(scales, "scales")
    bi, bi_tag = _field_values(biases, "biases")
    wq = _to_numpy(wq, "wq")
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
    for name, a in (("scales", sc), ("biases", bi)):
        if not np.isfinite(a).all():
            raise ValueError(f"mlx{bits}: {name} contain NaN or Inf")
    dtype = _pick_field_dtype(sc, bi, (sc_tag, bi_tag), scale_dtype, compact)
    row = table.mlx_format(bits, dtype)
    fmt = row.name
    K = sc.shape[1] * g
    _require_exact(sc, dtype, "scales", fmt)
    _require_exact(bi, dtype, "biases", fmt)
    # uint32 words are little-endian, so their bytes are already MLX's LSB-first code stream; a
    # group's g * bits / 8 bytes are whole words (g is a multiple of 32).
    code_bytes = g * bits // 8
    qs = np.ascontiguousarray(wq.astype("<u4")).view(np.uint8).reshape(N, K // g, code_bytes)
    blocks = np.concatenate([_field_bytes(sc, dtype), _field_bytes(bi, dtype), qs], axis=2)
    return QTensor(torch.from_numpy(blocks.reshape(N, -1)), fmt, (N, K), g)


_ARRAY_KINDS = ("auto", "numpy", "torch", "mlx")


def _field_array(raw: np.ndarray, dtype: str, array: str):
    """Header fields ``raw`` (uint8 ``[N, G, size]``) as an array of their dtype, of kind ``array``."""
    N, G, _ = raw.shape
    raw = np.ascontiguousarray(raw)
    if dtype == "bf16":
        t = torch.from_numpy(raw.view("<i2").reshape(N, G).astype(np.int16)).view(torch.bfloat16)
        if array == "mlx":
            import mlx.core as mx
            return mx.array(raw.view("<u2").reshape(N, G).astype(np.uint16)).view(mx.bfloat16)
        return t
    a = raw.view("<f2" if dtype == "f16" else "<f4").reshape(N, G).astype(np.float16 if dtype == "f16" else np.float32)
    if array == "torch":
        return torch.from_numpy(a)
    if array == "mlx":
        import mlx.core as mx
        return mx.array(a)
    return a


def to_mlx(qt: QTensor, array: str = "auto"):
    """An MLX-family ``QTensor`` -> MLX's ``(wq uint32 [N, K * bits / 32], scales [N, K/g],
    biases [N, K/g])``, for ``mx.dequantize`` / ``mx.quantized_matmul`` with
    ``group_size=qt.group_size, bits=<bits>``; scales and biases in the row's dtype (fp16 for
    ``mlx<bits>``, bf16 for ``mlx<bits>_bf16``, fp32 for ``mlx<bits>_f32``), the dtype
    :func:`from_mlx` was given.

    array: the kind of the three arrays: "numpy", "torch" (wq as ``torch.uint32``) or "mlx"; "auto"
    (the default) gives numpy arrays, except that numpy has no bfloat16, so a bf16 row's scales and
    biases come as ``torch.bfloat16`` tensors (``mx.array`` takes them as they are).
    """
    if not isinstance(qt, QTensor) or table.spec(qt.fmt).family != "mlx":
        names = ", ".join(f.name for f in table.family("mlx"))
        raise ValueError(f"to_mlx needs a QTensor of an MLX format ({names}), got {qt!r}")
    if array not in _ARRAY_KINDS:
        raise ValueError(f"array: expected one of {_ARRAY_KINDS}, got {array!r}")
    row = table.spec(qt.fmt)
    N, K, g = qt.N, qt.K, qt.group_size
    bits, header, dtype = row.code_bits, row.header_bytes, row.scale_dtype
    field = header // 2
    if array == "numpy" and dtype == "bf16":
        raise ValueError(f"to_mlx: numpy has no bfloat16 for {qt.fmt}'s scales and biases; "
                         f"pass array='auto', 'torch' or 'mlx'")
    blocks = qt.data.detach().cpu().numpy().reshape(N, K // g, header + g * bits // 8)
    scales = _field_array(blocks[:, :, :field], dtype, array)
    biases = _field_array(blocks[:, :, field:header], dtype, array)
    wq = np.ascontiguousarray(blocks[:, :, header:]).reshape(N, K * bits // 8).view("<u4").astype(np.uint32)
    if array == "torch":
        wq = torch.from_numpy(wq.view(np.int32)).view(torch.uint32)
    elif array == "mlx":
        import mlx.core as mx
        wq = mx.array(wq)
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
