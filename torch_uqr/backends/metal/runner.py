"""Calls the emulated Metal kernels on CPU tensors: the ``metal-emu`` backend of ``uqr.gemm``.

Arguments are those of ``torch.ops.uqr.gemm``. The argument checks and strides come from the C++
planner (``torch_uqr.backends.strides.plan``, the one the CPU and MPS operators use), the kernel
choice and grid from csrc/mps/launch.h compiled into the emulator, so this module only marshals
tensors. The output is filled with NaN before the kernels run: any element they fail to write stays
NaN, which is how the tests prove outputs are fully written.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from .. import strides
from .build import build

__all__ = ["DTYPES", "PATHS", "Request", "prepare", "gemm", "kernel_name"]

DTYPES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}  # enum uqr_dtype
PATHS = {"auto": 0, "mma": 1, "vec": 2}  # enum uqr_path


@dataclass
class Request:
    """One checked gemm call: x as the kernels read it, w, a NaN-filled y, params and enums."""

    x: torch.Tensor
    w: torch.Tensor
    y: torch.Tensor
    params: list[int]  # uqr_gemm_params as uqr::_plan lists it
    dtype: int
    path: int

    def params_array(self) -> ctypes.Array:
        return (ctypes.c_longlong * len(self.params))(*self.params)


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build("lib")))
    params = ctypes.POINTER(ctypes.c_longlong)
    lib.uqr_emu_gemm.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, params, ctypes.c_int,
                                 ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.uqr_emu_gemm.restype = ctypes.c_int
    lib.uqr_emu_kernel_name.argtypes = [params, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.uqr_emu_kernel_name.restype = ctypes.c_char_p
    return lib


def prepare(x: torch.Tensor, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int,
            out_heads: int, in_heads: bool, path: str) -> Request:
    """Validate the op's arguments and build the kernel parameters (no kernel runs)."""
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise TypeError("x and w: expected tensors")
    if x.device.type != "cpu" or w.device.type != "cpu":
        raise ValueError(f"metal-emu runs on CPU tensors; x is on {x.device}, w on {w.device}")
    lay = strides.plan(x, w, fmt, N, K, group_size, int(out_heads), bool(in_heads), path, "metal",
                       allocate=False)
    y = torch.full(lay.out_shape, float("nan"), dtype=lay.x.dtype)
    return Request(lay.x, w, y, list(lay.params.values()), DTYPES[lay.x.dtype], PATHS[path])


def kernel_name(req: Request) -> str:
    """Host name of the kernel launch.h picks for ``req`` (e.g. ``uqr_gemm_mv_q4_0_f16``)."""
    return _library().uqr_emu_kernel_name(req.params_array(), len(req.params), req.dtype, req.path).decode()


def gemm(x: torch.Tensor, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int = 0,
         out_heads: int = 0, in_heads: bool = False, path: str = "auto") -> torch.Tensor:
    """``torch.ops.uqr.gemm`` computed by the Metal kernels on emulated GPU threads (CPU tensors)."""
    req = prepare(x, w, fmt, N, K, group_size, out_heads, in_heads, path)
    err = ctypes.create_string_buffer(256)
    rc = _library().uqr_emu_gemm(req.x.data_ptr(), req.w.data_ptr(), req.y.data_ptr(), req.params_array(),
                                 len(req.params), req.dtype, req.path, err, len(err))
    if rc:
        raise ValueError(err.value.decode())
    return req.y
