"""``QTensor``: a weight matrix in one of the packed formats, plus ``quantize``/``dequantize``.

The bytes in ``data`` are exactly the rows of blocks of ``docs/formats.md`` (uint8 ``[N, row_bytes]``);
everything else (block size, bits per weight) follows from ``fmt`` and ``group_size``.
"""
from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np
import torch

from . import formats as _formats

__all__ = ["QTensor", "QuantizationWarning", "formats", "quantize", "dequantize"]

# Rows are decoded/validated in slices of about this many weights, so that the int32/int64
# temporaries of a decoder stay bounded on ~100M-weight models.
_SLICE_WEIGHTS = 1 << 22


def formats() -> list[str]:
    """Names of every supported weight format."""
    return list(_formats.NAMES)


def _row_slices(N: int, K: int):
    rows = max(1, _SLICE_WEIGHTS // max(K, 1))
    return [slice(i, min(N, i + rows)) for i in range(0, N, rows)] or [slice(0, 0)]


def _check_shape(fmt: str, shape: Sequence[int], block: int) -> tuple[int, int]:
    try:
        N, K = (int(v) for v in shape)
    except (TypeError, ValueError):
        raise ValueError(f"{fmt}: shape must be (N, K), got {shape!r}") from None
    if N < 1 or K < 1:
        raise ValueError(f"{fmt}: shape must be positive, got (N={N}, K={K})")
    if K % block:
        raise ValueError(f"{fmt}: K={K} is not a multiple of the block size {block}")
    return N, K


def as_uint8_tensor(data, name: str = "data") -> torch.Tensor:
    """``bytes``, a uint8 numpy array or a uint8 tensor as a uint8 tensor (no copy where possible)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8:
            raise ValueError(f"{name} must hold uint8 bytes, got a numpy array of dtype {data.dtype}")
        data = np.ascontiguousarray(data)
        # Read-only arrays (e.g. a read-only memory map) are copied: a tensor may be written to.
        return torch.from_numpy(data if data.flags.writeable else data.copy())
    if isinstance(data, torch.Tensor):
        if data.dtype != torch.uint8:
            raise ValueError(f"{name} must be a uint8 tensor, got dtype {data.dtype}")
        return data
    raise ValueError(f"{name} must be bytes, a uint8 numpy array or a uint8 tensor, got {type(data).__name__}")


class QTensor:
    """A quantized ``[N, K]`` weight matrix: ``data`` (uint8 ``[N, row_bytes]``) in format ``fmt``.

    Build one with :func:`quantize`, :meth:`from_bytes` or the importers in :mod:`torch_uqr.interop`.
    The constructor trusts its arguments; :meth:`from_bytes` checks them.
    """

    __slots__ = ("data", "fmt", "shape", "group_size")

    def __init__(self, data: torch.Tensor, fmt: str, shape: Sequence[int], group_size: int = 0):
        self.data = data
        self.fmt = fmt
        self.shape = torch.Size((int(shape[0]), int(shape[1])))
        self.group_size = int(group_size)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_bytes(cls, data, fmt: str, shape: Sequence[int], group_size: int | None = None) -> "QTensor":
        """Copy raw block bytes (``bytes``, uint8 numpy array or uint8 tensor) and validate the copy.

        ``data`` may be flat or ``[N, row_bytes]`` and stays on its device. The QTensor owns its
        bytes: they are copied before they are checked, so changing ``data`` afterwards cannot
        slip unchecked blocks into the kernels. Raises ``ValueError`` for a wrong dtype or
        length, K not a multiple of the block, non-finite fp16 scales and any field the format
        forbids (see ``docs/formats.md``).
        """
        t = as_uint8_tensor(data)
        if not isinstance(data, (bytes, bytearray, memoryview)):  # those were copied into a bytearray
            t = t.clone(memory_format=torch.contiguous_format)
        return cls._validated(t, fmt, shape, group_size)

    @classmethod
    def _validated(cls, t: torch.Tensor, fmt: str, shape: Sequence[int], group_size: int | None = None) -> "QTensor":
        """``from_bytes`` without the copy, for a uint8 tensor whose memory the caller owns alone
        (a loader's private file map, a QuantLinear's buffer that it tracks for changes)."""
        module = _formats.get(fmt)
        g = _formats.resolve_group_size(fmt, group_size)
        block, block_bytes = _formats.block_geometry(fmt, g)
        N, K = _check_shape(fmt, shape, block)
        if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8:
            raise ValueError(f"{fmt}: data must be a uint8 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        row_bytes = K // block * block_bytes
        if t.numel() != N * row_bytes:
            raise ValueError(f"{fmt}: data has {t.numel()} bytes, expected N*row_bytes = {N}*{row_bytes} = "
                             f"{N * row_bytes} for shape ({N}, {K})")
        if t.dim() != 1 and tuple(t.shape) != (N, row_bytes):
            raise ValueError(f"{fmt}: data has shape {tuple(t.shape)}, expected ({N}, {row_bytes}) or flat")
        t = t.reshape(N, row_bytes)
        slices = _row_slices(N, K)
        for rows in slices:
            try:
                module.validate(t[rows], rows.stop - rows.start, K, g)
            except ValueError as err:
                if len(slices) == 1:
                    raise
                # Validators count blocks from the start of what they were given.
                raise ValueError(f"{err} (block counted from row {rows.start}; "
                                 f"{K // block} blocks per row)") from None
        return cls(t, fmt, (N, K), g)

    # -- block geometry -----------------------------------------------------------------------
    @property
    def N(self) -> int:
        """Rows (output features)."""
        return self.shape[0]

    @property
    def K(self) -> int:
        """Columns (input features); always a multiple of :attr:`block_size`."""
        return self.shape[1]

    @property
    def block_size(self) -> int:
        """Weights per block: 32, 256, or an MLX-family format's group size."""
        return _formats.block_geometry(self.fmt, self.group_size or None)[0]

    @property
    def block_bytes(self) -> int:
        """Bytes per block."""
        return _formats.block_geometry(self.fmt, self.group_size or None)[1]

    @property
    def bits_per_weight(self) -> float:
        """Stored bits per weight, metadata included (e.g. 4.5 for q4_0)."""
        return 8.0 * self.block_bytes / self.block_size

    @property
    def nbytes(self) -> int:
        """Bytes of packed data."""
        return self.data.numel()

    @property
    def device(self) -> torch.device:
        return self.data.device

    def to(self, device) -> "QTensor":
        """The same blocks on ``device`` (a new QTensor; ``self`` is unchanged)."""
        return QTensor(self.data.to(device), self.fmt, self.shape, self.group_size)

    def dequantize(self) -> torch.Tensor:
        """Exact float32 ``[N, K]`` decode on ``data``'s device."""
        return dequantize(self)

    def __repr__(self) -> str:
        g = f", group_size={self.group_size}" if self.group_size else ""
        return (f"QTensor(fmt={self.fmt!r}, shape=({self.N}, {self.K}){g}, "
                f"bits_per_weight={self.bits_per_weight:g}, device={self.device})")


class QuantizationWarning(UserWarning):
    """Quantization lost more than the format normally loses, because of fp16's range.

    Raised as a warning (never an error, and the bytes are still the format's usual encoding) by
    :func:`quantize` when some rows are so small that their fp16 block scales fall below fp16's
    normal range (|scale| < 2**-14) and the rows come out clearly worse than the same rows would
    at a normal magnitude, down to all-zero rows; and by :func:`torch_uqr.from_bitnet` when a
    BitNet scale lies outside fp16's normal range. ``rows`` lists the affected row indices.
    """

    def __init__(self, message: str, rows: Sequence[int] = ()):
        super().__init__(message)
        self.rows = list(rows)


# A row is reported when its relative error exceeds the error of the same row scaled into fp16's
# normal range by more than this factor and margin: far above what a subnormal-but-precise scale
# costs, far below what a flushed one does (an all-zero row has relative error 1).
_UNDERFLOW_RATIO, _UNDERFLOW_MARGIN = 1.25, 0.01


def _row_rel_err(approx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    w = w.double()
    return (approx.double() - w).norm(dim=1) / w.norm(dim=1)


def _rows_with_lost_scales(masks: list, rows: int, n_blocks: int) -> torch.Tensor:
    """Rows touched by any mask of ``track_f16_underflow`` (masks cover n_blocks, whole or in chunks)."""
    out = torch.zeros(rows, dtype=torch.bool)
    pending: list = []
    count = 0
    for m in masks:
        pending.append(m.reshape(-1).cpu())
        count += m.numel()
        if count == n_blocks:
            out |= torch.cat(pending).reshape(rows, -1).any(1)
            pending, count = [], 0
        elif count > n_blocks:
            break
    if count:  # a mask that does not cover whole rows: be conservative
        return torch.ones(rows, dtype=torch.bool) if any(bool(m.any()) for m in pending) else out
    return out


def _underflow_report(module, w: torch.Tensor, data: torch.Tensor, g: int, candidates: torch.Tensor):
    """(rows, their relative error, the error of the same rows at a normal magnitude) for the
    candidate rows whose error is explained by fp16's range: every quantizer is invariant to a
    power-of-two scaling of its input except through the range of its fp16 scales, so the same
    rows scaled to max |w| in [0.5, 1) show what the format achieves on them."""
    idx = torch.nonzero(candidates).reshape(-1).to(w.device)
    x = w[idx]
    K = x.shape[1]
    err = _row_rel_err(module.decode(data[idx], len(idx), K, g), x)
    exp = torch.frexp(x.abs().amax(1)).exponent.to(torch.float32)
    # Two steps, so that a factor beyond float32's range (a subnormal row) never overflows.
    half = torch.exp2(-torch.floor(exp / 2)).unsqueeze(1)
    rest = torch.exp2(-exp + torch.floor(exp / 2)).unsqueeze(1)
    scaled = x * half * rest
    normal = _row_rel_err(module.decode(module.quantize(scaled, g), len(idx), K, g), scaled)
    bad = err > _UNDERFLOW_RATIO * normal + _UNDERFLOW_MARGIN
    return idx[bad].tolist(), err[bad], normal[bad]


def quantize(w: torch.Tensor, fmt: str, group_size: int | None = None) -> QTensor:
    """Quantize a float weight matrix ``w`` ``[N, K]`` into ``fmt``; the data stays on ``w``'s device.

    ``group_size`` is for the MLX family (mlx2 ... mlx8) only (32, 64 or 128; default 64). Raises ``ValueError`` for an
    unknown format, a non-2-D or non-float ``w``, K not a multiple of the block size, NaN/Inf
    weights, or weights too large for the format's fp16 scales. Weights too *small* for them
    (rows whose scales underflow fp16's normal range and whose error is clearly worse for it)
    are quantized as usual and reported with a :class:`QuantizationWarning` naming the rows.
    """
    from .formats._checks import track_f16_underflow

    module = _formats.get(fmt)
    g = _formats.resolve_group_size(fmt, group_size)
    if not isinstance(w, torch.Tensor) or not w.is_floating_point():
        raise ValueError(f"{fmt}: w must be a floating-point torch tensor, got "
                         f"{getattr(w, 'dtype', type(w).__name__)}")
    if w.dim() != 2:
        raise ValueError(f"{fmt}: w must be 2-D [N, K], got shape {tuple(w.shape)}")
    block, _ = _formats.block_geometry(fmt, g)
    N, K = _check_shape(fmt, w.shape, block)
    w = w.detach().to(torch.float32)
    if not bool(torch.isfinite(w).all()):
        raise ValueError(f"{fmt}: w contains NaN or Inf; only finite weights can be quantized")
    parts, bad_rows, errs, normals = [], [], [], []
    for rows in _row_slices(N, K):
        ws = w[rows].contiguous()
        with track_f16_underflow() as masks:
            part = module.quantize(ws, g)
        parts.append(part)
        n_rows = rows.stop - rows.start
        candidates = _rows_with_lost_scales(masks, n_rows, n_rows * K // block)
        if bool(candidates.any()):
            bad, err, normal = _underflow_report(module, ws, part, g, candidates)
            bad_rows += [rows.start + r for r in bad]
            errs.append(err)
            normals.append(normal)
    if bad_rows:
        err, normal = torch.cat(errs), torch.cat(normals)
        shown = ", ".join(map(str, bad_rows[:10])) + (", ..." if len(bad_rows) > 10 else "")
        warnings.warn(QuantizationWarning(
            f"{fmt}: {len(bad_rows)} of {N} rows are too small for the format's fp16 scales (rows {shown}): "
            f"relative error up to {err.max().item():.3g} where the same rows at a normal magnitude get "
            f"{normal.max().item():.3g}; scale the weights up (and the output down) or use a float layer",
            bad_rows), stacklevel=2)
    return QTensor(torch.cat(parts, 0), fmt, (N, K), g)


def dequantize(qt: QTensor) -> torch.Tensor:
    """Exact float32 ``[N, K]`` values of ``qt`` on ``qt.data``'s device (the reference decode)."""
    if not isinstance(qt, QTensor):
        raise ValueError(f"dequantize expects a QTensor, got {type(qt).__name__}")
    module = _formats.get(qt.fmt)
    N, K = qt.shape
    # NaN-filled, so a slice a decoder failed to write cannot pass for data.
    out = torch.full((N, K), float("nan"), dtype=torch.float32, device=qt.data.device)
    for rows in _row_slices(N, K):
        out[rows] = module.decode(qt.data[rows], rows.stop - rows.start, K, qt.group_size)
    return out
