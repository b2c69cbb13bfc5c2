"""The CUDA router: ``route`` picks the kernel by M and path and, for the CUDA C++ kernels, their
whole launch plan; ``gemm_cuda_route`` runs a call (and takes forced kernels for tests and bench).
The C++ kernel of ``uqr::gemm`` asks ``route`` once per call shape (``route_codes``) and caches the
answer; ``gemm_cuda`` runs the calls routed to the kernels launched from Python (register.py).

    path "vec"  -> ternary_vec.py (ternary only)
    path "mma"  -> gemm.py, or for large M a decode into a scratch matrix + cuBLAS (the CUDA C++
                   decoder csrc/cuda/dequant.cu when built and configs.CUDA_DEQUANT_ENABLED,
                   else Triton's: scratch_decoder)
    path "auto" -> the CUDA C++ tensor-core kernels (op uqr::_qmma_cuda) for bf16/fp16 x, the
                   formats they handle and aligned shapes (qmma_fits): csrc/cuda/qmma_small_m.cu
                   up to configs.QMMA_MAX_ROWS rows, qmma_mid_m.cu for 17..QMMA_MID_MAX_ROWS
                   rows (..QMMA_MID_MAX_ROWS_WITH_WGMMA on an sm_90 GPU) when N >= QMMA_MID_MIN_N
                   (qmma_auto); then, on an sm_90 GPU, the Hopper wgmma kernel
                   csrc/cuda/qmma_wgmma.cu (op uqr::_wgmma_cuda) for the rows of
                   configs.WGMMA_ROWS (wgmma_auto); else vec for ternary at tiny M; gemv.py (CUDA
                   cores) at tiny M; else as mma
    path "int8" -> (q4_0 / q4_k, opt-in, not exact: x rounded to int8 per 32 / 256 elements as the
                   CPU int8 path does) the CUDA C++ int8 tensor-core kernel csrc/cuda/qmma_int8.cu
                   (op uqr::_int8_cuda) for bf16/fp16 x, up to configs.INT8_AUTO_MAX_ROWS rows
                   (where it measured faster) and the shapes the small-M kernel takes
                   (int8_fits); every other call runs as "auto"

The CUDA C++ ops take their launch plan as arguments (plan_qmma, plan_wgmma, plan_int8: kernel,
tile, K splits, stream-K, register build, warps, dependent launch, int8 variant), decided here from
configs.py's tables, the device's properties and the tuning overrides of tuning.py; the C++ side
reads no environment and only checks that a plan can run. The thresholds come from the H200 and
H100 benchmarks. ``kernel`` forces one kernel (tests, bench); a forced "qmma", "wgmma" or "int8"
that does not take the call raises.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from ...formats import table as format_table
from . import configs, tuning
from .configs import GemmConfig, VecConfig
from .dequant import dequantize_cuda, dequantize_triton
from .formats_meta import FORMAT_CODES, block_geometry
from .gemm import gemm_mma
from .gemv import gemm_gemv
from ..strides import GemmPlan, plan
from .scratch_pipeline import scratch_pipelined
from .ternary_vec import gemm_ternary_vec

PATHS = format_table.PATHS
# The formats that have the int8-activation kernel (uqr::_int8_cuda), from the format table.
INT8_FORMATS = format_table.names_with_path("int8", "cuda")
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

    They need bf16/fp16 x, 1..QMMA_KERNEL_MAX_ROWS rows, a stage of at most QMMA_MAX_STAGE_ELEMS
    elements, K (and a head-strided x's head dim) a multiple of it, 16-byte aligned weight rows, and x readable 8 bytes at
    a time (16 where the mid-M kernel takes the rows, qmma_takes_mid: it copies x in 16-byte pieces).
    Whether ``auto`` takes them is a separate, measured limit (configs.QMMA_MAX_ROWS).
    """
    if fmt not in configs.QMMA_FORMATS or x.dtype not in (torch.bfloat16, torch.float16):
        return False
    if stage_elems(fmt, group_size) > configs.QMMA_MAX_STAGE_ELEMS:
        return False
    if not 0 < rows <= configs.QMMA_KERNEL_MAX_ROWS:
        return False
    elems, nbytes = block_geometry(fmt, group_size)
    n = 1 if elems >= 256 else 256 // elems
    while (n * nbytes) % 16:
        n *= 2
    if K % (n * elems) or w.data_ptr() % 16 or w.stride(0) % 16:
        return False
    if not x.is_contiguous() or x.data_ptr() % (16 if qmma_takes_mid(rows) else 8):
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
    return run_int8(x, w, fmt, N, K, group_size, out_heads, in_heads)


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
    ranges = configs.WGMMA_ROWS.get(fmt, configs.WGMMA_DEFAULT_ROWS)
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


# ---------------------------------------------------------------------------------------------
# The launch plan of the CUDA C++ kernels. Every choice the C++ launchers make is decided here,
# from configs.py's rules, the tuning overrides (tuning.py) and the device's properties (SM count,
# compute capability, and the kernels' residency from uqr::_cuda_residency), and passed to the ops
# as arguments (csrc/cuda/qmma_small_m.h: QmmaPlan, WgmmaPlan; qmma_int8.h: Int8Plan). The plan_*
# functions are pure: the device properties come in as arguments, so CPU tests can check them.

MID_TILE_ROWS = 128  # weight rows of a mid-M / wgmma CTA (8 warps x 16; kSkTileRows, kWgWarps * 16)
SMALL_TILE_ROWS = 16  # weight rows of a small-M / int8 CTA (kWarpRows)
KSPLIT_WARPS = (1, 2, 4, 8)  # K-splitting warps a small-M / int8 CTA can have (ksplit::kMaxWarps = 8)
# int8 kernel variants (Int8Variant in qmma_int8.h).
INT8_TILES, INT8_XRING, INT8_XPIPE, INT8_COLS = 0, 1, 2, 3


def stage_elems(fmt: str, group_size: int = 0) -> int:
    """K elements of one ring stage of the tensor-core kernels (stage_blocks in qmma_traits.cuh): the
    fewest whole blocks spanning >= 256 elements whose bytes are a multiple of 16."""
    elems, nbytes = block_geometry(fmt, group_size)
    n = 1 if elems >= 256 else 256 // elems
    while (n * nbytes) % 16:
        n *= 2
    return n * elems


def qmma_takes_mid(rows: int, tune: Optional[tuning.Tuning] = None) -> bool:
    """Whether uqr::_qmma_cuda runs the mid-M kernel for ``rows`` activation rows: above the small-M
    kernel's QMMA_SMALL_MAX_ROWS, and from QMMA_STAGED_X_MIN_ROWS on with K split over CTAs unless
    the tuning turns that off (split16=False)."""
    tune = tune or tuning.current()
    return rows > configs.QMMA_SMALL_MAX_ROWS or (tune.split16 is not False and rows >= configs.QMMA_STAGED_X_MIN_ROWS)


def pick_warps(per_sm: Sequence[int], n_stages: int, grid: int, sms: int) -> int:
    """K-splitting warps of a small-M / int8 CTA: as many as keep the whole grid resident in one
    wave (a second, mostly empty wave cost ~2x), with >= 2 stages per warp so the ring has something
    to overlap. ``per_sm``: resident CTAs an SM at 1, 2, 4 and 8 warps."""
    warps = 1
    for i in (3, 2, 1, 0):
        wk = KSPLIT_WARPS[i]
        if wk > 1 and n_stages < 2 * wk:
            continue
        warps = wk
        if per_sm[i] * sms >= grid:
            break
    return warps


def mid_cols(rows: int, N: int, sms: int) -> int:
    """The mid-M kernel's column tile (activation rows): 16 at 9-16 rows (the split-K build); else 64
    (x read N / 128 times), or 32 where 64 would leave SMs idle (small N) or be mostly padding."""
    if rows <= configs.QMMA_SMALL_MAX_ROWS:
        return 16
    if rows <= 32:
        return 32
    return 64 if -(-N // MID_TILE_ROWS) * -(-rows // 64) >= sms else 32


def plain_splits(N: int, n_stages: int, sms: int, fit: int) -> int:
    """K split in equal power-of-two ways at 9-16 rows: the most that keep the grid within one wave
    of the ``fit`` CTAs an SM holds, with >= 2 stages a split."""
    tiles = -(-N // MID_TILE_ROWS)
    splits = 1
    while tiles * splits * 2 <= sms * fit and n_stages // (splits * 2) >= 2:
        splits *= 2
    return splits


def streamk_ctas(N: int, n_stages: int, rows: int, sms: int, fit: int, tune: tuning.Tuning) -> int:
    """The stream-K grid at 9-16 rows, 0 for off (configs.STREAMK_*). It needs more CTAs than row
    tiles (a range then spans at most two tiles) and >= 2 stages a CTA; forced splits turn it off."""
    if rows > configs.QMMA_SMALL_MAX_ROWS or tune.streamk is False or tune.split16_splits:
        return 0
    tiles = -(-N // MID_TILE_ROWS)
    units = tiles * n_stages
    slots = sms * (tune.streamk_per_sm or configs.STREAMK_PER_SM)
    empty = configs.STREAMK_MAX_EMPTY_PERCENT
    if (tune.streamk is None and not tune.streamk_ctas and not tune.streamk_per_sm
            and tiles * plain_splits(N, n_stages, sms, fit) * 100 >= slots * (100 - empty)):
        return 0
    ctas = min(tune.streamk_ctas or slots, units // 2)
    return ctas if ctas > tiles else 0


@dataclass(frozen=True)
class QmmaPlan:
    """uqr::_qmma_cuda's launch plan (QmmaPlan in csrc/cuda/qmma_small_m.h, fields in op order)."""
    mid: bool
    warps: int = 1
    mid_cols: int = 16
    splits: int = 1
    streamk_ctas: int = 0
    wide_regs: bool = False
    smem_cap: bool = True
    pdl: bool = False

    def args(self) -> tuple:
        return (self.mid, self.warps, self.mid_cols, self.splits, self.streamk_ctas, self.wide_regs,
                self.smem_cap, self.pdl)


@dataclass(frozen=True)
class WgmmaPlan:
    """uqr::_wgmma_cuda's launch plan (WgmmaPlan in qmma_small_m.h)."""
    bm: int
    ctas: int
    splits: int
    pdl: bool = False

    def args(self) -> tuple:
        return (self.bm, self.ctas, self.splits, self.pdl)


@dataclass(frozen=True)
class Int8Plan:
    """uqr::_int8_cuda's launch plan (Int8Plan in qmma_int8.h)."""
    variant: int
    warps: int
    smem_cap: bool = True
    pdl: bool = False

    def args(self) -> tuple:
        return (self.variant, self.warps, self.smem_cap, self.pdl)


# residency(kernel, rows, variant) -> resident CTAs an SM: uqr::_cuda_residency for one format,
# x dtype and device ("small_m" / "int8": at 1, 2, 4, 8 warps; "mid_split": one count; "wgmma":
# one per WGMMA_BUILDS entry).
Residency = Callable[[str, int, int], Sequence[int]]


def plan_qmma(fmt: str, group_size: int, N: int, K: int, rows: int, *, sms: int, residency: Residency,
              pdl: bool, tune: Optional[tuning.Tuning] = None) -> QmmaPlan:
    """The tensor-core kernels' plan for ``rows`` activation rows of an N x K weight. ``pdl``: the
    device launches programmatic dependents (sm_90); the tuning may turn that off."""
    tune = tune or tuning.current()
    pdl = pdl and tune.pdl is not False
    smem_cap = tune.smem_cap is not False
    n_stages = K // stage_elems(fmt, group_size)
    if not qmma_takes_mid(rows, tune):
        warps = pick_warps(residency("small_m", rows, 0), n_stages, -(-N // SMALL_TILE_ROWS), sms)
        return QmmaPlan(mid=False, warps=warps, smem_cap=smem_cap, pdl=pdl)
    cols = mid_cols(rows, N, sms)
    if rows > configs.QMMA_SMALL_MAX_ROWS:
        return QmmaPlan(mid=True, mid_cols=cols, smem_cap=smem_cap, pdl=pdl)
    if tune.split16_splits:
        return QmmaPlan(mid=True, mid_cols=cols, splits=min(tune.split16_splits, n_stages), smem_cap=smem_cap, pdl=pdl)
    fit = residency("mid_split", rows, 0)[0]
    ctas = streamk_ctas(N, n_stages, rows, sms, fit, tune)
    if ctas == 0:
        return QmmaPlan(mid=True, mid_cols=cols, splits=plain_splits(N, n_stages, sms, fit), smem_cap=smem_cap, pdl=pdl)
    # Workspace planes: a tile's n_stages meet at most (n_stages - 1) // L + 2 ranges of >= L stages.
    planes = (n_stages - 1) // (-(-N // MID_TILE_ROWS) * n_stages // ctas) + 2
    wide = tune.streamk_wide_regs if tune.streamk_wide_regs is not None else fmt in configs.STREAMK_WIDE_REGS_FORMATS
    return QmmaPlan(mid=True, mid_cols=cols, splits=planes, streamk_ctas=ctas, wide_regs=wide, smem_cap=smem_cap,
                    pdl=pdl)


# The Hopper kernel's tile builds, in the order uqr::_cuda_residency("wgmma", ...) reports them:
# (BM, CTAs an SM). A format whose stage does not fit a build's shared memory gets 0 for it.
WGMMA_BUILDS = ((128, 1), (64, 1), (64, 2))


def plan_wgmma(fmt: str, group_size: int, N: int, K: int, rows: int, *, sms: int, pdl: bool,
               builds: Sequence[int] = (1, 1, 2), tune: Optional[tuning.Tuning] = None) -> WgmmaPlan:
    """The Hopper kernel's plan (configs.WGMMA_BM64_MAX_ROWS; qmma_wgmma.cu says why): column tile,
    CTAs an SM, and K splits while the tiles leave most CTA slots idle (N = 4096: 32 row tiles), so
    the grid fills one wave, keeping >= 4 stages per split for the pipeline. ``builds``: the CTAs an
    SM of each WGMMA_BUILDS entry for this format (0: its stage does not fit that build)."""
    tune = tune or tuning.current()
    fits128, fits64x2 = builds[0] > 0, builds[2] > 0
    bm = 128 if rows > configs.WGMMA_BM64_MAX_ROWS and fits128 else 64
    if tune.wgmma_bm == 64 or (tune.wgmma_bm == 128 and fits128):
        bm = tune.wgmma_bm
    row_tiles = -(-N // MID_TILE_ROWS)
    ctas = 1
    if bm == 64 and fits64x2 and (
            tune.wgmma_ctas == 2
            or (tune.wgmma_ctas is None and rows <= configs.WGMMA_BM64_MAX_ROWS and 2 * row_tiles <= sms)):
        ctas = 2
    tiles = row_tiles * -(-rows // bm)
    n_stages = K // stage_elems(fmt, group_size)
    splits = 1
    while tiles * splits * 2 <= sms * ctas and n_stages // (splits * 2) >= 4:
        splits *= 2
    return WgmmaPlan(bm=bm, ctas=ctas, splits=splits, pdl=pdl and tune.pdl is not False)


def plan_int8(fmt: str, group_size: int, N: int, K: int, rows: int, *, sms: int, residency: Residency,
              pdl: bool, tune: Optional[tuning.Tuning] = None) -> Int8Plan:
    """The int8 kernel's plan: one row of mlx4 / ternary / var_affine / exl3 in block columns (their
    only kernel), of q4_0 / q4_k too unless int8_cols=False, then x staged through the ring where
    the grid has few CTAs an SM (configs.INT8_XRING_CTAS_PER_SM), else x a stage ahead in registers;
    more rows in tiles of 8 or 16 columns. Warps as the small-M kernel's (pick_warps)."""
    tune = tune or tuning.current()
    grid = -(-N // SMALL_TILE_ROWS)
    variant = INT8_TILES
    if rows == 1:
        if fmt == "mlx4" or fmt in ONE_ROW_INT8 or tune.int8_cols is not False:
            variant = INT8_COLS
        elif tune.int8_xring if tune.int8_xring is not None else grid < configs.INT8_XRING_CTAS_PER_SM * sms:
            variant = INT8_XRING
        elif tune.int8_xpipe is not False:
            variant = INT8_XPIPE
    warps = pick_warps(residency("int8", rows, variant), K // stage_elems(fmt, group_size), grid, sms)
    return Int8Plan(variant=variant, warps=warps, smem_cap=tune.smem_cap is not False,
                    pdl=pdl and tune.pdl is not False)


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _pdl_device(device_index: int) -> bool:
    """Whether the device launches programmatic dependents (sm_90 and later)."""
    return torch.cuda.get_device_capability(device_index)[0] >= 9


@functools.lru_cache(maxsize=None)
def _residency(device_index: int, fmt: str, group_size: int, bf16: bool, kernel: str, rows: int,
               variant: int) -> tuple[int, ...]:
    return tuple(torch.ops.uqr._cuda_residency(kernel, fmt, group_size, bf16, rows, variant,
                                               torch.device("cuda", device_index)))


def _residency_of(device_index: int, fmt: str, group_size: int, bf16: bool) -> Residency:
    # Rows only select the build (1-8 / 9-16 rows; int8: one row, 2-8, 9-16): cache by build.
    def get(kernel: str, rows: int, variant: int) -> Sequence[int]:
        build_rows = 1 if rows == 1 and kernel == "int8" else (2 if rows <= 8 else 9)
        return _residency(device_index, fmt, group_size, bf16, kernel, build_rows, variant)
    return get


@functools.lru_cache(maxsize=4096)
def _cached_plan(kind: str, device_index: int, fmt: str, group_size: int, N: int, K: int, rows: int, bf16: bool,
                 tune: tuning.Tuning):
    sms = _sm_count(torch.device("cuda", device_index))
    pdl = _pdl_device(device_index)
    residency = _residency_of(device_index, fmt, group_size, bf16)
    if kind == "wgmma":
        return plan_wgmma(fmt, group_size, N, K, rows, sms=sms, pdl=pdl, builds=residency("wgmma", 1, 0), tune=tune)
    plan = plan_int8 if kind == "int8" else plan_qmma
    return plan(fmt, group_size, N, K, rows, sms=sms, residency=residency, pdl=pdl, tune=tune)


def launch_plan(kind: str, x: torch.Tensor, fmt: str, N: int, K: int, group_size: int = 0):
    """The plan (QmmaPlan, WgmmaPlan or Int8Plan for ``kind`` "qmma", "wgmma", "int8") of a call
    with activations ``x`` on their CUDA device, under the tuning in force; cached per device,
    shape and tuning."""
    rows = x.numel() // K
    g = group_size if format_table.spec(fmt).grouped else 0
    return _cached_plan(kind, _device_index(x.device), fmt, g, N, K, rows, x.dtype == torch.bfloat16, tuning.current())


def run_qmma(x: torch.Tensor, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int = 0, out_heads: int = 0,
             in_heads: bool = False, plan: Optional[QmmaPlan] = None) -> torch.Tensor:
    """uqr::_qmma_cuda with ``plan`` (default: launch_plan's)."""
    plan = plan or launch_plan("qmma", x, fmt, N, K, group_size)
    return torch.ops.uqr._qmma_cuda(x, w, fmt, N, K, group_size, out_heads, in_heads, *plan.args())


def run_wgmma(x: torch.Tensor, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int = 0, out_heads: int = 0,
              in_heads: bool = False, plan: Optional[WgmmaPlan] = None) -> torch.Tensor:
    """uqr::_wgmma_cuda with ``plan`` (default: launch_plan's)."""
    plan = plan or launch_plan("wgmma", x, fmt, N, K, group_size)
    return torch.ops.uqr._wgmma_cuda(x, w, fmt, N, K, group_size, out_heads, in_heads, *plan.args())


def run_int8(x: torch.Tensor, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int = 0, out_heads: int = 0,
             in_heads: bool = False, plan: Optional[Int8Plan] = None) -> torch.Tensor:
    """uqr::_int8_cuda with ``plan`` (default: launch_plan's)."""
    plan = plan or launch_plan("int8", x, fmt, N, K, group_size)
    return torch.ops.uqr._int8_cuda(x, w, fmt, N, K, group_size, out_heads, in_heads, *plan.args())


def _scratch_matmul(lay: GemmPlan, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int) -> None:
    """Decode W once into x's dtype, then cuBLAS; layouts are bridged with torch views/copies."""
    x = lay.x
    # [batch, M, K] view of x; head-strided x is gathered by torch (one copy, amortised at large M).
    if lay.x_head_stride:
        x = x.reshape(-1, x.shape[-3], x.shape[-2], x.shape[-1]).transpose(1, 2).reshape(-1, lay.M, K)
    else:
        x = x.reshape(-1, lay.M, K)
    pipe = configs.scratch_pipeline_for(lay.M * lay.batch, N)
    if pipe is not None and not lay.y_head_stride:
        # Decode slice by slice on a side stream while cuBLAS multiplies the previous slice.
        scratch_pipelined(x.reshape(-1, K), w, fmt, N, K, group_size, lay.y.view(-1, N), scratch_decoder(), *pipe)
        return
    wd = scratch_decoder()(w, fmt, N, K, group_size, dtype=lay.x.dtype)
    if lay.y_head_stride:
        # Direct-head y [batch, H, M, D]: head h is x @ W[hD:(h+1)D]^T, an [M, D] block of y. One
        # strided-batched cuBLAS call per x batch, x broadcast over heads by a stride-0 view, writes
        # each block in place (no [M, N] product and no copy into y).
        H, D = N // lay.y_head_dim, lay.y_head_dim
        w_heads = wd.view(H, D, K).transpose(1, 2)
        y_view = lay.y.view(-1, H, lay.M, D)
        for b in range(x.shape[0]):
            torch.bmm(x[b].expand(H, lay.M, K), w_heads, out=y_view[b])
    else:  # cuBLAS writes y in place (a copy of y costs ~10% at M = 4096)
        torch.matmul(x, wd.t(), out=lay.y.view(-1, lay.M, N))


# What route() answers: which kernel family runs a call. "triton" covers every kernel launched from
# Python (Triton's fused, row and add/subtract kernels, and decode-to-scratch + cuBLAS).
ROUTE_KINDS = ("triton", "qmma", "wgmma", "int8")


def route(x: torch.Tensor, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int = 0, out_heads: int = 0,
          in_heads: bool = False, path: str = "auto", lay: Optional[GemmPlan] = None):
    """The path-``auto`` decision for one call: ``(kind, plan)`` with ``kind`` in ROUTE_KINDS and, for
    the CUDA C++ kernels, their launch plan (QmmaPlan, WgmmaPlan, Int8Plan; None for "triton").

    The decision reads the call's shapes, strides, dtypes, alignment and device, the tables of
    configs.py and the tuning in force, nothing else: the C++ kernel of ``uqr::gemm`` caches it per
    such key (route_codes)."""
    if lay is None:
        lay = plan(x, w, fmt, N, K, group_size, out_heads, in_heads, path, "cuda", allocate=False)
    rows = lay.M * lay.batch
    if path == "int8":
        if (rows <= configs.INT8_AUTO_MAX_ROWS[fmt] and int8_available()
                and int8_fits(x, w, fmt, K, group_size, in_heads, rows)):
            return "int8", launch_plan("int8", x, fmt, N, K, group_size)
        path = "auto"  # int8 is an opt-in speed-up, not a contract: calls it would not speed up run exact
    if path != "auto":
        return "triton", None
    if not x.is_cuda:
        return "triton", None  # the CUDA C++ kernels take CUDA tensors only
    on_hopper = wgmma_available(_device_index(x.device))
    if (configs.QMMA_ENABLED and qmma_available() and qmma_auto(fmt, rows, N, on_hopper)
            and qmma_fits(x, w, fmt, K, group_size, in_heads, rows)):
        return "qmma", launch_plan("qmma", x, fmt, N, K, group_size)
    if on_hopper and wgmma_auto(x, w, fmt, N, K, group_size, in_heads, rows):
        return "wgmma", launch_plan("wgmma", x, fmt, N, K, group_size)
    return "triton", None


def route_codes(x: torch.Tensor, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int, out_heads: int,
                in_heads: bool, path: str) -> list[int]:
    """``uqr::_cuda_route``: route() as integers for the C++ kernel of ``uqr::gemm``: the kind's index
    in ROUTE_KINDS, then the plan's fields in op order (bools as 0 / 1)."""
    kind, p = route(x, w, fmt, N, K, group_size, out_heads, in_heads, path)
    return [ROUTE_KINDS.index(kind), *(int(v) for v in (p.args() if p is not None else ()))]


def gemm_cuda_route(x: torch.Tensor, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int = 0,
                out_heads: int = 0, in_heads: bool = False, path: str = "auto", kernel: str = "auto",
                config: GemmConfig | VecConfig | None = None) -> torch.Tensor:
    """y = x W^T with W packed in ``fmt`` on CUDA: the Triton kernels or the CUDA C++ ones, chosen by
    M and path (route()); ``kernel``/``config`` override the choice (tests, bench)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")
    # The operator's contract, checked once, in C++ (uqr::plan_gemm): errors name the argument.
    lay = plan(x, w, fmt, N, K, group_size, out_heads, in_heads, path, "cuda", allocate=False)
    rows = lay.M * lay.batch
    if kernel == "int8":
        return _int8_forced(x, w, fmt, N, K, group_size, out_heads, in_heads, rows)
    if kernel in ("qmma", "wgmma") and path == "vec":
        raise ValueError(f"kernel: {kernel!r} has no vec path")
    if kernel == "qmma":
        return run_qmma(x, w, fmt, N, K, group_size, out_heads, in_heads)
    if kernel == "wgmma":
        return run_wgmma(x, w, fmt, N, K, group_size, out_heads, in_heads)
    if kernel == "auto":
        kind, p = route(x, w, fmt, N, K, group_size, out_heads, in_heads, path, lay)
        run = {"qmma": run_qmma, "wgmma": run_wgmma, "int8": run_int8}.get(kind)
        if run is not None:
            return run(x, w, fmt, N, K, group_size, out_heads, in_heads, p)
        if path == "int8":
            path = "auto"
    return _run_triton(lay, w, fmt, N, K, group_size, path, kernel, config)


def _run_triton(lay: GemmPlan, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int, path: str,
                kernel: str, config: GemmConfig | VecConfig | None) -> torch.Tensor:
    """The kernels launched from Python: Triton's and decode-to-scratch + cuBLAS."""
    lay.allocate()
    if lay.y.numel() == 0:
        return lay.y
    rows = lay.M * lay.batch
    sms = _sm_count(lay.x.device)
    if kernel == "auto":
        if path == "auto" and rows <= configs.GEMV_AUTO_MAX_M:
            kernel = "gemv"
        else:
            kernel = "scratch" if scratch_auto(fmt, rows, lay.x.dtype, lay.y_head_stride and lay.batch > 1) else "fused"
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
    """The ``uqr::gemm`` CUDA kernel where the extension has no CUDA C++ (Triton only), and
    ``uqr::_gemm_triton``, which the C++ kernel calls for the calls route() gives to "triton": same
    arguments as the operator schema (opschema)."""
    return gemm_cuda_route(x, w, fmt, N, K, group_size, out_heads, in_heads, path)
