"""``QTensor``: a weight matrix in one of the packed formats, plus ``quantize``/``dequantize``.

The bytes in ``data`` are exactly the rows of blocks of ``docs/formats.md`` (uint8 ``[N, row_bytes]``);
everything else (block size, bits per weight) follows from ``fmt`` and ``group_size``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from . import formats as _formats

__all__ = ["QTensor", "formats", "quantize", "dequantize"]

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
        # Read-only arrays (e.g. a memory-mapped GGUF file) are copied: a tensor may be written to.
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
        """Wrap raw block bytes (``bytes``, uint8 numpy array or uint8 tensor) after validating them.

        ``data`` may be flat or ``[N, row_bytes]``; it is not copied when it already is a uint8
        tensor. Raises ``ValueError`` for a wrong dtype or length, K not a multiple of the block,
        non-finite fp16 scales and any field the format forbids (see ``docs/formats.md``).
        """
        module = _formats.get(fmt)
        g = _formats.resolve_group_size(fmt, group_size)
        block, block_bytes = _formats.block_geometry(fmt, g)
        N, K = _check_shape(fmt, shape, block)
        t = as_uint8_tensor(data)
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
        """Weights per block: 32, 256, or mlx4's group size."""
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


def quantize(w: torch.Tensor, fmt: str, group_size: int | None = None) -> QTensor:
    """Quantize a float weight matrix ``w`` ``[N, K]`` into ``fmt``; the data stays on ``w``'s device.

    ``group_size`` is for mlx4 only (32, 64 or 128; default 64). Raises ``ValueError`` for an
    unknown format, a non-2-D or non-float ``w``, K not a multiple of the block size, NaN/Inf
    weights, or weights too large for the format's fp16 scales.
    """
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
    data = torch.cat([module.quantize(w[rows].contiguous(), g) for rows in _row_slices(N, K)], 0)
    return QTensor(data, fmt, (N, K), g)


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
