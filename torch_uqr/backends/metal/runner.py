"""Calls the emulated Metal kernels on CPU tensors: the ``metal-emu`` backend of ``uqr.gemm``.

Arguments are those of ``torch.ops.uqr.gemm``. Strides come from ``torch_uqr.backends.strides`` (the Python
mirror of params.h), the kernel choice and grid from csrc/mps/launch.h compiled into the emulator,
so this module only marshals tensors. The output is filled with NaN before the kernels run: any
element they fail to write stays NaN, which is how the tests prove outputs are fully written.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from .. import strides as layout
from ...formats import layout as format_layout
from ...formats import table as format_table
from .build import build

__all__ = ["DTYPES", "FORMAT_IDS", "PATHS", "Params", "Request", "prepare", "gemm", "kernel_name"]

FORMAT_IDS = {f.name: f.id for f in format_table.TABLE}  # enum uqr_format
DTYPES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}  # enum uqr_dtype
PATHS = {"auto": 0, "mma": 1, "vec": 2}  # enum uqr_path


class Params(ctypes.Structure):
    """Byte-for-byte ``struct uqr_gemm_params`` (csrc/include/uqr/params.h)."""

    _fields_ = [(n, ctypes.c_int32) for n in
                ("fmt", "batch", "M", "N", "K", "group_size", "block_bytes", "row_bytes")] + [
        ("x_batch_stride", ctypes.c_int64), ("x_row_stride", ctypes.c_int64),
        ("x_head_stride", ctypes.c_int64), ("x_head_dim", ctypes.c_int32),
        ("y_batch_stride", ctypes.c_int64), ("y_row_stride", ctypes.c_int64),
        ("y_head_stride", ctypes.c_int64), ("y_head_dim", ctypes.c_int32)]


@dataclass
class Request:
    """One checked gemm call: x as the kernels read it, w, a NaN-filled y, params and enums."""

    x: torch.Tensor
    w: torch.Tensor
    y: torch.Tensor
    params: Params
    dtype: int
    path: int


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build("lib")))
    lib.uqr_emu_gemm.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(Params),
                                 ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.uqr_emu_gemm.restype = ctypes.c_int
    lib.uqr_emu_kernel_name.argtypes = [ctypes.POINTER(Params), ctypes.c_int, ctypes.c_int]
    lib.uqr_emu_kernel_name.restype = ctypes.c_char_p
    return lib


def prepare(x: torch.Tensor, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int,
            out_heads: int, in_heads: bool, path: str) -> Request:
    """Validate the op's arguments and build the kernel parameters (no kernel runs)."""
    if not isinstance(x, torch.Tensor) or x.dtype not in DTYPES:
        raise TypeError(f"x: expected a float16, bfloat16 or float32 tensor, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if x.device.type != "cpu" or w.device.type != "cpu":
        raise ValueError(f"metal-emu runs on CPU tensors; x is on {x.device}, w on {w.device}")
    if fmt not in FORMAT_IDS:
        raise ValueError(f"fmt: expected one of {list(FORMAT_IDS)}, got {fmt!r}")
    if path == "int8":
        raise ValueError("path='int8' (int8 activations) is a CPU-kernel path; the Metal shaders do not have it")
    if path not in PATHS:
        raise ValueError(f"path: expected one of {list(PATHS)}, got {path!r}")
    block, block_bytes = format_layout(fmt, group_size if fmt == "mlx4" else None)
    if K % block:
        raise ValueError(f"K: {K} is not a multiple of the {fmt} block size {block}")
    row_bytes = K // block * block_bytes
    if w.dtype != torch.uint8 or tuple(w.shape) != (N, row_bytes):
        raise ValueError(f"w: expected uint8 [{N}, {row_bytes}] ({fmt} rows), got {w.dtype} {list(w.shape)}")
    w = w.contiguous()
    x, lay = layout.plan(x, N, K, int(out_heads), bool(in_heads))
    y = torch.full(lay.out_shape, float("nan"), dtype=x.dtype)
    params = Params(FORMAT_IDS[fmt], lay.batch, lay.M, N, K, block, block_bytes, row_bytes,
                    lay.x_batch_stride, lay.x_row_stride, lay.x_head_stride, lay.x_head_dim,
                    lay.y_batch_stride, lay.y_row_stride, lay.y_head_stride, lay.y_head_dim)
    return Request(x, w, y, params, DTYPES[x.dtype], PATHS[path])


def kernel_name(req: Request) -> str:
    """Host name of the kernel launch.h picks for ``req`` (e.g. ``uqr_gemm_mv_q4_0_f16``)."""
    return _library().uqr_emu_kernel_name(ctypes.byref(req.params), req.dtype, req.path).decode()


def gemm(x: torch.Tensor, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int = 0,
         out_heads: int = 0, in_heads: bool = False, path: str = "auto") -> torch.Tensor:
    """``torch.ops.uqr.gemm`` computed by the Metal kernels on emulated GPU threads (CPU tensors)."""
    req = prepare(x, w, fmt, N, K, group_size, out_heads, in_heads, path)
    err = ctypes.create_string_buffer(256)
    rc = _library().uqr_emu_gemm(req.x.data_ptr(), req.w.data_ptr(), req.y.data_ptr(),
                                 ctypes.byref(req.params), req.dtype, req.path, err, len(err))
    if rc:
        raise ValueError(err.value.decode())
    return req.y
