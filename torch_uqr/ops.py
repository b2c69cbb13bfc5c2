"""Python entry point of the operator ``torch.ops.uqr.gemm`` (schema in docs/operator.md).

``gemm(x, qt)`` checks its arguments with errors that name the offending argument, then calls the
registered operator: C++ kernels on CPU (``torch_uqr._C``), on CUDA the CUDA C++ and Triton kernels
(router and Python half in ``torch_uqr.backends.cuda``, imported only when CUDA is present), Metal on MPS, or the
Metal shaders in the CPU emulator with ``backend="metal-emu"``. A fake (meta) kernel makes the op
traceable by ``torch.compile(fullgraph=True)``.
"""
from __future__ import annotations

import functools
from typing import Any, Optional

import torch

from .backends import strides
from .formats import table

__all__ = ["gemm", "FORMATS", "PATHS", "op_available"]

SCHEMA = ("uqr::gemm(Tensor x, Tensor w, str fmt, int N, int K, int group_size, int out_heads, "
          "bool in_heads, str path) -> Tensor")
FORMATS = table.NAMES
PATHS = table.PATHS
# The backend whose kernels serve a device type ("mps" and backend="metal-emu" run the Metal shaders).
_BACKEND_OF_DEVICE = {"cpu": "cpu", "cuda": "cuda", "mps": "metal"}
ACTIVATION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BACKENDS = (None, "metal-emu")
_ALWAYS_PATHS = ("auto", "mma")
_PATH_WORDS = {"vec": "add/subtract", "int8": "int8 activations"}

_load_error: Optional[BaseException] = None
_cuda_error: Optional[BaseException] = None

try:
    from . import _C  # noqa: F401  (registers the uqr library and its CPU kernel)
except ImportError as exc:  # the package is importable before the extension is built
    _load_error = exc

if _load_error is None:
    @torch.library.register_fake("uqr::gemm")
    def _gemm_fake(x: torch.Tensor, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int,
                   out_heads: int, in_heads: bool, path: str) -> torch.Tensor:
        # Dispatch picks this kernel whenever either tensor is on the meta device, so a CPU x with
        # a meta w lands here, not in the device kernel's argument check: refuse it the same way.
        if x.device != w.device:
            raise ValueError(f"uqr::gemm: w: expected a tensor on x's device; x is on {x.device} "
                             f"but the weights w are on {w.device}")
        return x.new_empty(strides.output_shape(x.shape, N, K, out_heads, in_heads))

    if torch.cuda.is_available():
        try:
            from .backends.cuda import register as _cuda_register  # noqa: F401
        except ImportError as exc:  # triton or the CUDA module missing: CPU keeps working
            _cuda_error = exc


# Every decode step checks its path: computed once per (path) and (format, backend), not per call.
@functools.lru_cache(maxsize=None)
def _formats_with_path(path: str) -> tuple[str, ...]:
    return tuple(f for f in table.NAMES if any(path in table.spec(f).paths(b) for b in table.BACKENDS))


@functools.lru_cache(maxsize=None)
def _paths(fmt: str, backend: str) -> tuple[str, ...]:
    return table.spec(fmt).paths(backend)


def backend_of_device(device: torch.device) -> Optional[str]:
    """The backend whose kernels serve tensors on ``device`` ("cpu", "cuda", "metal"), or None."""
    return _BACKEND_OF_DEVICE.get(torch.device(device).type)


def op_available() -> bool:
    """True when the compiled operator library (``torch_uqr._C``) is loaded."""
    return _load_error is None


def _require_op() -> None:
    if _load_error is not None:
        raise RuntimeError(
            "torch_uqr._C (the compiled operator) is not available; build it with "
            f"`pip install --no-build-isolation -e .` (import failed: {_load_error})")


def _check_qtensor(qt: Any) -> None:
    for attr in ("data", "fmt", "shape", "group_size"):
        if not hasattr(qt, attr):
            raise TypeError(f"qt: expected a torch_uqr.QTensor, got {type(qt).__name__} (no .{attr})")
    if qt.fmt not in FORMATS:
        raise ValueError(f"qt: unknown format {qt.fmt!r}; expected one of {table.quoted_names(FORMATS)}")


def gemm(x: torch.Tensor, qt: Any, out_heads: Optional[int] = None, in_heads: bool = False,
         path: Optional[str] = None, backend: Optional[str] = None) -> torch.Tensor:
    """``y = x @ W.T`` with W held packed in ``qt`` (a QTensor), accumulated in fp32.

    Args:
        x: fp16 / bf16 / fp32 activations, ``[..., M, K]`` (or ``[K]``); with ``in_heads=True``
            ``[..., H, M, D]`` with ``H*D == K``, read as ``[..., M, K]`` without a copy.
        qt: the packed weight, logical shape ``(N, K)``, on the same device as x.
        out_heads: None/0 for ``y: [..., M, N]``; H to get ``y: [..., H, M, N/H]`` written directly.
        in_heads: read x as head-strided (see above).
        path: "auto" (default), "mma" (decode then matrix multiply), "vec" (ternary only:
            add/subtract, no multiply per weight) or "int8" (the formats whose table row has it
            on x's backend, ``formats.table.names_with_path("int8", backend)``; the README lists
            them. Opt-in: x rounded to int8 with one fp32 scale per weight block
            (32 elements, or 256 for the 256-element formats) or per group for mlx4, then integer
            dot products - as llama.cpp's and BitNet's kernels do; a few 1e-3 relative error from
            the activation rounding). On CPU int8 serves any M. On
            CUDA it runs the int8 tensor-core kernel for bf16 / fp16 x of up to 16 activation rows
            (batch * M; mlx4 with g = 32 or 64, ternary, var_affine and exl3: one row); every other CUDA call (more
            rows, fp32 x, a shape or alignment that kernel does not take, an extension built
            without it) silently runs the exact path "auto".
            Not on MPS or the Metal emulator.
        backend: None (x's device) or "metal-emu" (the Metal shaders run by the CPU emulator).

    Returns:
        y in x's dtype on x's device.
    """
    args = gemm_args(x, qt, out_heads, in_heads, path, backend)
    if backend == "metal-emu":
        from .backends import metal as metal_emu
        return metal_emu.gemm(*args)
    _require_op()
    if x.device.type == "cuda" and _cuda_error is not None:
        raise RuntimeError(f"the CUDA kernels could not be loaded: {_cuda_error}")
    return torch.ops.uqr.gemm(*args)


def gemm_args(x: torch.Tensor, qt: Any, out_heads: Optional[int] = None, in_heads: bool = False,
              path: Optional[str] = None, backend: Optional[str] = None) -> tuple:
    """The checks of :func:`gemm`, without the call: its arguments as ``torch.ops.uqr.gemm`` takes
    them, ``(x, w, fmt, N, K, group_size, out_heads, in_heads, path)``."""
    _check_qtensor(qt)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in ACTIVATION_DTYPES:
        raise TypeError(f"x: expected dtype float16, bfloat16 or float32, got {x.dtype}")
    w = qt.data
    if x.device != w.device:
        raise ValueError(f"x is on {x.device} but the weights (qt.data) are on {w.device}; "
                         "move one of them (qt.to(device) or x.to(device))")
    N, K = (int(s) for s in qt.shape)
    heads = 0 if out_heads is None else int(out_heads)
    if isinstance(out_heads, bool) or heads < 0:
        raise ValueError(f"out_heads: expected None or a positive int, got {out_heads!r}")
    if not isinstance(in_heads, bool):
        raise TypeError(f"in_heads: expected a bool, got {type(in_heads).__name__}")
    strides.output_shape(x.shape, N, K, heads, in_heads)  # raises ValueError naming the argument
    path = "auto" if path is None else path
    if path not in PATHS:
        raise ValueError(f"path: expected one of {PATHS}, got {path!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected None or 'metal-emu', got {backend!r}")
    row = table.spec(qt.fmt)
    where = backend if backend is not None else x.device.type
    kernels = "metal" if backend == "metal-emu" else _BACKEND_OF_DEVICE.get(x.device.type)
    if path not in _ALWAYS_PATHS:
        # Which formats have the path anywhere, then whether this backend has it for this format.
        have = _formats_with_path(path)
        if qt.fmt not in have:
            raise ValueError(f"path={path!r} ({_PATH_WORDS[path]}) supports fmt {table.quoted_names(have)}, "
                             f"not {qt.fmt!r}")
        if kernels is None or path not in _paths(qt.fmt, kernels):
            on = [b for b in table.BACKENDS if path in row.paths(b)]
            raise ValueError(f"path={path!r} for fmt {qt.fmt!r} exists only on the {' and '.join(on)} "
                             f"backend{'s' if len(on) > 1 else ''} with backend=None, not on {where!r}")
    group_size = int(qt.group_size) if row.grouped else 0
    return (x, w, qt.fmt, N, K, group_size, heads, in_heads, path)


def poison_outputs(enabled: bool = True) -> None:
    """Test aid: make every backend fill its fresh output with NaN before the kernel writes it, so a
    kernel that skips an element leaves a NaN that the comparison catches.

    Process-wide, until called again with ``enabled=False``. Sets the flag the C++ ops read
    (``uqr::_set_poison``: CPU, MPS and the CUDA C++ kernels) and its Python side, which the outputs
    of the kernels launched from Python (Triton, the Metal emulator) read
    (``torch_uqr.backends.strides.set_poison``).
    """
    if _load_error is None:
        torch.ops.uqr._set_poison(bool(enabled))
    strides.set_poison(enabled)
