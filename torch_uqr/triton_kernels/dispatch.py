"""``gemm_cuda``: the CUDA implementation of ``uqr::gemm``, choosing a Triton kernel by M and path.

    path "vec"  -> ternary_vec.py (ternary only)
    path "mma"  -> gemm.py, or for large M a decode into a scratch matrix + cuBLAS (the CUDA C++
                   decoder csrc/cuda/dequant.cu when built and configs.CUDA_DEQUANT_ENABLED,
                   else Triton's: scratch_decoder)
    path "auto" -> the CUDA C++ tensor-core kernels (op uqr::_qmma_cuda) for bf16/fp16 x, the
                   formats they handle and aligned shapes (qmma_fits): csrc/cuda/qmma_small_m.cu
                   up to configs.QMMA_MAX_ROWS rows, qmma_mid_m.cu for 17..QMMA_MID_MAX_ROWS
                   rows (..QMMA_MID_MAX_ROWS_WITH_WGMMA on an sm_90 GPU: none but q8_0's) when N >= QMMA_MID_MIN_N
                   (qmma_auto); then, on an sm_90 GPU, the Hopper wgmma kernel
                   csrc/cuda/qmma_wgmma.cu (op uqr::_wgmma_cuda) for the rows of
                   configs.WGMMA_ROWS (wgmma_auto); else vec for ternary at tiny M; gemv.py (CUDA
                   cores) at tiny M; else as mma
    path "int8" -> (q4_0 / q4_k, opt-in, not exact: x rounded to int8 per 32 / 256 elements as the
                   CPU int8 path does) the CUDA C++ int8 tensor-core kernel csrc/cuda/qmma_int8.cu
                   (op uqr::_int8_cuda) for bf16/fp16 x, up to configs.INT8_AUTO_MAX_ROWS rows
                   (where it measured faster) and the shapes the small-M kernel takes
                   (int8_fits); every other call runs as "auto"
The thresholds live in configs.py and come from the H200 benchmark. ``kernel`` forces one kernel
(tests, bench); a forced "qmma", "wgmma" or "int8" that does not take the call raises.
"""
from __future__ import annotations

import functools

import torch

from ..ops import INT8_FORMATS  # defined before ops imports register.py (and so this module)
from . import configs
from .configs import GemmConfig, VecConfig
from .dequant import dequantize_cuda, dequantize_triton
from .formats_meta import FORMAT_CODES, block_geometry
from .gemm import gemm_mma
from .gemv import gemm_gemv
from .layout import GemmLayout, plan_gemm
from .scratch_pipeline import scratch_pipelined
from .ternary_vec import gemm_ternary_vec

PATHS = ("auto", "mma", "vec", "int8")
KERNELS = ("auto", "fused", "gemv", "scratch", "qmma", "wgmma", "int8")


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device`` (cached: the property query costs microseconds per call)."""
    if device.type != "cuda":
        return configs.DEFAULT_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def _has_op(name: str) -> bool:
    """Whether torch_uqr._C registered the private operator ``uqr::<name>`` (CUDA builds only)."""
    try:
        getattr(torch.ops.uqr, name)
    except (AttributeError, RuntimeError):
        return False
    return True


@functools.lru_cache(maxsize=None)
def qmma_available() -> bool:
    """True when torch_uqr._C was compiled with the CUDA C++ tensor-core small-M kernel."""
    return _has_op("_qmma_cuda")


@functools.lru_cache(maxsize=None)
def int8_available() -> bool:
    """True when torch_uqr._C was compiled with the CUDA C++ int8-activation kernel (path "int8")."""
    return _has_op("_int8_cuda")


@functools.lru_cache(maxsize=None)
def cuda_dequant_available() -> bool:
    """True when torch_uqr._C was compiled with the CUDA C++ decode-to-dense kernel."""
    return _has_op("_dequant_cuda")


def scratch_decoder():
    """The decoder of the scratch path: the CUDA C++ kernel when built and enabled (a decode pass
    near the memory floor), else the Triton one. Both take dequantize_triton's arguments."""
    if configs.CUDA_DEQUANT_ENABLED and cuda_dequant_available():
        return dequantize_cuda
    return dequantize_triton


def qmma_fits(x: torch.Tensor, w: torch.Tensor, fmt: str, K: int, group_size: int, in_heads: bool,
              rows: int) -> bool:
    """Whether the tensor-core kernels take this call (mirror of qmma_unsupported in C++).

    They need bf16/fp16 x, 1..QMMA_KERNEL_MAX_ROWS rows, K (and a head-strided x's head dim) a
    multiple of their 256/512-element stage, 16-byte aligned weight rows, and x readable 8 bytes at
    a time (16 from QMMA_STAGED_X_MIN_ROWS rows on, where the mid-M kernel copies x in 16-byte
    pieces).
    Whether ``auto`` takes them is a separate, measured limit (configs.QMMA_MAX_ROWS).
    """
    if fmt not in configs.QMMA_FORMATS or x.dtype not in (torch.bfloat16, torch.float16):
        return False
    if not 0 < rows <= configs.QMMA_KERNEL_MAX_ROWS:
        return False
    elems, nbytes = block_geometry(fmt, group_size)
    n = 1 if elems >= 256 else 256 // elems
    while (n * nbytes) % 16:
        n *= 2
    if K % (n * elems) or w.data_ptr() % 16 or w.stride(0) % 16:
        return False
    if not x.is_contiguous() or x.data_ptr() % (16 if rows >= configs.QMMA_STAGED_X_MIN_ROWS else 8):
        return False
    return not in_heads or x.shape[-1] % (n * elems) == 0  # a stage must not straddle x heads


# Formats whose int8 kernel is the one-row block-column form only (mlx4 too, with its group sizes).
ONE_ROW_INT8 = ("ternary", "var_affine", "exl3")


def int8_fits(x: torch.Tensor, w: torch.Tensor, fmt: str, K: int, group_size: int, in_heads: bool,
              rows: int) -> bool:
    """Whether the int8 kernel (qmma_int8.cu) takes this call (mirror of int8_unsupported in C++):
    q4_0 / q4_k 1..INT8_MAX_ROWS rows, mlx4 with g = 32 / 64, ternary, var_affine and exl3 one row, and the small-M kernel's
    conditions (qmma_fits: bf16/fp16 x, K and x heads whole 256-element stages, aligned x and weight
    rows)."""
    if fmt not in INT8_FORMATS or not 0 < rows <= configs.INT8_MAX_ROWS:
        return False
    if (fmt == "mlx4" and (rows != 1 or group_size not in (32, 64))) or (fmt in ONE_ROW_INT8 and rows != 1):
        return False
    return qmma_fits(x, w, fmt, K, group_size, in_heads, rows)


def _int8_forced(x: torch.Tensor, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int,
                 out_heads: int, in_heads: bool, rows: int) -> torch.Tensor:
    """kernel="int8": the int8 kernel or an error saying why it cannot run (no silent fallback,
    so a test or bench row labelled int8 measured it)."""
    if not int8_fits(x, w, fmt, K, group_size, in_heads, rows):
        raise ValueError(f"kernel: 'int8' takes fmt {' / '.join(INT8_FORMATS)} with bf16 or fp16 x, "
                         f"1..{configs.INT8_MAX_ROWS} rows (mlx4 with g = 32 or 64, {' / '.join(ONE_ROW_INT8)}: 1), K (and in_heads' head dim) "
                         "a multiple of 256, contiguous "
                         "aligned x and 16-byte-aligned w rows; "
                         f"got fmt {fmt!r}, x {x.dtype} {list(x.shape)}, {rows} rows, K={K}")
    if not int8_available():
        raise RuntimeError("kernel: 'int8' needs torch_uqr._C built with the CUDA kernels (no uqr::_int8_cuda)")
    return torch.ops.uqr._int8_cuda(x, w, fmt, N, K, group_size, out_heads, in_heads)


def qmma_auto(fmt: str, rows: int, N: int, wgmma: bool = False) -> bool:
    """Whether path ``auto`` prefers the tensor-core kernels for this many rows and weight rows N
    (limits measured on the H200, configs.py): the small-M kernel up to QMMA_MAX_ROWS rows, the
    mid-M kernel above that up to QMMA_MID_MAX_ROWS when N fills the GPU with its 128-row CTAs
    (QMMA_MID_MAX_ROWS_WITH_WGMMA, or its per-format entry, when ``wgmma``: the Hopper kernel is
    there to take over)."""
    if rows <= configs.QMMA_FORMAT_MAX_ROWS.get(fmt, configs.QMMA_MAX_ROWS):
        return True
    top = configs.QMMA_MID_FORMAT_MAX_ROWS.get(fmt, configs.QMMA_MID_MAX_ROWS)
    if wgmma:
        top = min(top, configs.QMMA_MID_FORMAT_MAX_ROWS_WITH_WGMMA.get(fmt, configs.QMMA_MID_MAX_ROWS_WITH_WGMMA))
    return rows <= top and N >= configs.QMMA_MID_MIN_N


@functools.lru_cache(maxsize=None)
def wgmma_available(device_index: int) -> bool:
    """True when torch_uqr._C has the Hopper wgmma kernel and the device is an sm_90 GPU."""
    return _has_op("_wgmma_cuda") and torch.cuda.get_device_capability(device_index) == (9, 0)


def wgmma_fits(x: torch.Tensor, w: torch.Tensor, fmt: str, K: int, group_size: int, in_heads: bool,
               rows: int) -> bool:
    """Whether the Hopper wgmma kernel (qmma_wgmma.cu) can take this call: an sm_90 device, and
    qmma_fits' conditions with the mid-M kernel's 16-byte x, plus K a multiple of 64 (the mirror of
    the C++ wgmma_unsupported)."""
    if x.device.type != "cuda" or K % 64:
        return False
    if not wgmma_available(x.device.index if x.device.index is not None else torch.cuda.current_device()):
        return False
    return qmma_fits(x, w, fmt, K, group_size, in_heads, max(rows, configs.QMMA_SMALL_MAX_ROWS + 1))


def wgmma_auto(x: torch.Tensor, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int, in_heads: bool,
               rows: int) -> bool:
    """Whether path ``auto`` takes the Hopper wgmma kernel: rows, N and K in one of the measured
    ranges of configs.WGMMA_ROWS for this format, and a call it can take (wgmma_fits)."""
    ranges = configs.WGMMA_ROWS.get(fmt, ())
    if not any(lo <= rows <= hi and N >= min_n and K >= min_k for lo, hi, min_n, min_k in ranges):
        return False
    return wgmma_fits(x, w, fmt, K, group_size, in_heads, rows)


def scratch_auto(fmt: str, rows: int, x_dtype: torch.dtype, bmm_per_batch: bool = False) -> bool:
    """Whether path ``auto`` decodes into a scratch matrix + cuBLAS for ``rows`` activation rows
    that no tensor-core kernel took (limits measured on the H200, configs.py). ``bmm_per_batch``:
    the scratch path would launch one cuBLAS call per x batch (direct-head y of a batched x), so
    the lower half-precision limit, measured on single matrices, does not apply."""
    if x_dtype in (torch.bfloat16, torch.float16) and not bmm_per_batch:
        return rows >= configs.SCRATCH_HALF_FORMAT_MIN_M.get(fmt, configs.SCRATCH_HALF_MIN_M)
    return rows >= configs.SCRATCH_AUTO_MIN_M


def _check_weight(w: torch.Tensor, x: torch.Tensor, fmt: str, N: int, K: int, group_size: int) -> None:
    if fmt not in FORMAT_CODES:
        raise ValueError(f"fmt: expected one of {sorted(FORMAT_CODES)}, got {fmt!r}")
    if fmt != "mlx4" and group_size not in (0, block_geometry(fmt)[0]):
        raise ValueError(f"group_size: expected 0 for {fmt}, got {group_size}")
    elems, nbytes = block_geometry(fmt, group_size)
    if N <= 0 or K <= 0 or K % elems:
        raise ValueError(f"K: expected a positive multiple of {fmt}'s block of {elems} (N={N}, K={K})")
    row_bytes = K // elems * nbytes
    if w.dtype != torch.uint8 or w.dim() != 2 or tuple(w.shape) != (N, row_bytes) or w.stride(1) != 1:
        raise ValueError(f"w: expected uint8 [{N}, {row_bytes}] with unit-stride rows for {fmt} "
                         f"(N={N}, K={K}), got {w.dtype} {list(w.shape)} strides {w.stride()}")
    if w.device != x.device:
        raise ValueError(f"w: expected on x's device {x.device}, got {w.device}")
    if w.stride(0) % 2:
        raise ValueError("w: row stride must be even (fp16 fields are read as aligned halves)")


def _scratch_matmul(lay: GemmLayout, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int) -> None:
    """Decode W once into x's dtype, then cuBLAS; layouts are bridged with torch views/copies."""
    x = lay.x
    # [batch, M, K] view of x; head-strided x is gathered by torch (one copy, amortised at large M).
    if lay.x_hs:
        x = x.reshape(-1, x.shape[-3], x.shape[-2], x.shape[-1]).transpose(1, 2).reshape(-1, lay.M, K)
    else:
        x = x.reshape(-1, lay.M, K)
    pipe = configs.scratch_pipeline_for(lay.M * lay.batch, N)
    if pipe is not None and not lay.y_hs:
        # Decode slice by slice on a side stream while cuBLAS multiplies the previous slice.
        scratch_pipelined(x.reshape(-1, K), w, fmt, N, K, group_size, lay.y.view(-1, N), scratch_decoder(), *pipe)
        return
    wd = scratch_decoder()(w, fmt, N, K, group_size, dtype=lay.x.dtype)
    if lay.y_hs:
        # Direct-head y [batch, H, M, D]: head h is x @ W[hD:(h+1)D]^T, an [M, D] block of y. One
        # strided-batched cuBLAS call per x batch, x broadcast over heads by a stride-0 view, writes
        # each block in place (no [M, N] product and no copy into y).
        H, D = N // lay.y_hd, lay.y_hd
        w_heads = wd.view(H, D, K).transpose(1, 2)
        y_view = lay.y.view(-1, H, lay.M, D)
        for b in range(x.shape[0]):
            torch.bmm(x[b].expand(H, lay.M, K), w_heads, out=y_view[b])
    else:  # cuBLAS writes y in place (a copy of y costs ~10% at M = 4096: NOTES v2)
        torch.matmul(x, wd.t(), out=lay.y.view(-1, lay.M, N))


def gemm_triton(x: torch.Tensor, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int = 0,
                out_heads: int = 0, in_heads: bool = False, path: str = "auto", kernel: str = "auto",
                config: GemmConfig | VecConfig | None = None) -> torch.Tensor:
    """y = x W^T with W packed in ``fmt``; ``kernel``/``config`` override the choice (tests, bench)."""
    if path not in PATHS:
        raise ValueError(f"path: expected one of {PATHS}, got {path!r}")
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")
    if path == "vec" and fmt != "ternary":
        raise ValueError(f"path: 'vec' is only valid for fmt 'ternary', got fmt {fmt!r}")
    if path == "int8" and fmt not in INT8_FORMATS:
        raise ValueError(f"path: 'int8' is only valid for fmt {', '.join(map(repr, INT8_FORMATS))}, got fmt {fmt!r}")
    _check_weight(w, x, fmt, N, K, group_size)
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x: expected float16, bfloat16 or float32, got {x.dtype}")
    rows = x.numel() // K
    if kernel == "int8":
        return _int8_forced(x, w, fmt, N, K, group_size, out_heads, in_heads, rows)
    if path == "int8":
        if (kernel == "auto" and rows <= configs.INT8_AUTO_MAX_ROWS[fmt] and int8_available()
                and int8_fits(x, w, fmt, K, group_size, in_heads, rows)):
            return torch.ops.uqr._int8_cuda(x, w, fmt, N, K, group_size, out_heads, in_heads)
        path = "auto"  # int8 is an opt-in speed-up, not a contract: calls it would not speed up run exact
    on_hopper = x.is_cuda and wgmma_available(x.device.index if x.device.index is not None else torch.cuda.current_device())
    if kernel == "qmma" or (kernel == "auto" and path == "auto" and configs.QMMA_ENABLED and qmma_available()
                            and qmma_auto(fmt, rows, N, on_hopper) and qmma_fits(x, w, fmt, K, group_size, in_heads, rows)):
        if path == "vec":
            raise ValueError("kernel: 'qmma' has no vec path")
        return torch.ops.uqr._qmma_cuda(x, w, fmt, N, K, group_size, out_heads, in_heads)
    if kernel == "wgmma" or (kernel == "auto" and path == "auto" and on_hopper
                             and wgmma_auto(x, w, fmt, N, K, group_size, in_heads, rows)):
        if path == "vec":
            raise ValueError("kernel: 'wgmma' has no vec path")
        return torch.ops.uqr._wgmma_cuda(x, w, fmt, N, K, group_size, out_heads, in_heads)
    lay = plan_gemm(x, N, K, out_heads, in_heads)
    if lay.y.numel() == 0:
        return lay.y
    sms = _sm_count(x.device)
    rows = lay.M * lay.batch
    if kernel == "auto":
        if path == "auto" and rows <= configs.GEMV_AUTO_MAX_M:
            kernel = "gemv"
        else:
            kernel = "scratch" if scratch_auto(fmt, rows, lay.x.dtype, lay.y_hs and lay.batch > 1) else "fused"
    if path == "auto":
        path = "vec" if fmt == "ternary" and rows <= configs.VEC_AUTO_MAX_M else "mma"
    if path == "vec":
        gemm_ternary_vec(lay, w, N, K, config or configs.row_config(configs.VEC_CONFIG, lay.M, N, K, sms))
    elif kernel == "gemv":
        base = configs.GEMV_FORMAT_CONFIGS.get(fmt, configs.GEMV_CONFIG)
        gemm_gemv(lay, w, fmt, N, K, group_size, config or configs.row_config(base, lay.M, N, K, sms))
    elif kernel == "scratch":
        _scratch_matmul(lay, w, fmt, N, K, group_size)
    else:
        gemm_mma(lay, w, fmt, N, K, group_size,
                 config or configs.mma_config(lay.M, N, K, sms, lay.x.element_size()))
    return lay.y


def gemm_cuda(x: torch.Tensor, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int,
              out_heads: int, in_heads: bool, path: str) -> torch.Tensor:
    """The ``uqr::gemm`` CUDA kernel: same arguments as the operator schema (opschema)."""
    return gemm_triton(x, w, fmt, N, K, group_size, out_heads, in_heads, path)
