"""Tuning constants of the CUDA kernels (Triton and CUDA C++), in one place, and the choice of
configuration by M.

The tables were set from the H200 / H100 benchmarks (python -m torch_uqr bench); the measurements
behind each threshold, and what was tried and dropped, are in docs/perf/history.md. Tiles are named
from the weight's side: BN weight rows (the dot's M side), BM activation rows, NS 32-element
sub-blocks along K per step (BK = 32 * NS).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ...formats import table as format_table


@dataclass(frozen=True)
class GemmConfig:
    """One launch configuration of the tensor-core kernel (gemm.py)."""
    BN: int
    BM: int
    NS: int
    SPLIT_K: int = 1
    num_warps: int = 4
    num_stages: int = 2


@dataclass(frozen=True)
class VecConfig:
    """One launch configuration of a one-row kernel (gemv.py, ternary_vec.py)."""
    BN: int
    NS: int
    SPLIT_K: int = 1
    num_warps: int = 4
    reduce_each: bool = False  # gemv only: reduce over k every step ([BN] accumulator, fewer registers)
    fixed_split: bool = False  # use SPLIT_K as given instead of as an upper bound


# (largest M, config) in increasing M; SPLIT_K here is an upper bound, cut by split_for() below.
MMA_TABLE: list[tuple[int, GemmConfig]] = [
    (16, GemmConfig(BN=64, BM=16, NS=8, SPLIT_K=16, num_warps=4, num_stages=3)),
    (32, GemmConfig(BN=64, BM=32, NS=4, SPLIT_K=16, num_warps=4, num_stages=2)),
    (64, GemmConfig(BN=64, BM=64, NS=4, SPLIT_K=8, num_warps=4, num_stages=2)),
    (256, GemmConfig(BN=64, BM=128, NS=2, SPLIT_K=4, num_warps=4, num_stages=3)),
    (1 << 62, GemmConfig(BN=128, BM=128, NS=4, SPLIT_K=1, num_warps=8, num_stages=2)),
]
VEC_CONFIG = VecConfig(BN=16, NS=8, SPLIT_K=16, num_warps=4)
# The row kernel reduces over k every step (fewer registers, faster at M = 1), except for q4_k: its
# swept winner gave wrong results on the H200 (not reproduced by the interpreter), so q4_k keeps the
# [BN, BK] accumulator until its reduce-each form is verified on a GPU.
GEMV_CONFIG = VecConfig(BN=32, NS=4, SPLIT_K=16, num_warps=4, reduce_each=True)
GEMV_FORMAT_CONFIGS: dict[str, VecConfig] = {
    "q4_k": VecConfig(BN=32, NS=4, SPLIT_K=16, num_warps=4, reduce_each=False),
}

# The ternary vec path re-decodes the weights for every activation row, so it only pays at tiny M.
VEC_AUTO_MAX_M = 0  # measured slower than gemv even at M = 1: auto never picks vec
# Up to this many activation rows (bf16 / fp16 x), path "auto" uses the CUDA C++ small-M tensor-core
# kernel csrc/cuda/qmma_small_m.cu (op uqr::_qmma_cuda; its limit QMMA_SMALL_MAX_ROWS is
# kQmmaMaxRows there) for the formats it handles. Set from the H200 benchmark.
QMMA_MAX_ROWS = 16
QMMA_SMALL_MAX_ROWS = 16
QMMA_KERNEL_MAX_ROWS = 1 << 20  # the op's limit (kQmmaMidMaxRows): above 16 rows, qmma_mid_m.cu
# From this many rows the op runs the mid-M kernel (x staged in shared memory by 16-byte copies): at
# 9-16 rows with K split over CTAs (dispatch.qmma_takes_mid; tuning knob split16).
QMMA_STAGED_X_MIN_ROWS = 9
QMMA_ENABLED = True
# The formats with a CUDA C++ tensor-core kernel slot (qmma_traits.cuh): the table says which.
QMMA_FORMATS = tuple(f.name for f in format_table.TABLE if f.cuda_qmma)
# Per-format row limit where the Triton fused kernel measured faster above it (none today).
QMMA_FORMAT_MAX_ROWS: dict[str, int] = {}
# The mid-M kernel (qmma_mid_m.cu: CTAs of 128 weight rows, no split over K) for 17..64 rows, only
# where there are enough weight rows to fill the GPU (N >= QMMA_MID_MIN_N): with fewer CTAs than SMs
# it lost to both the fused and the scratch paths, and from 128 rows the scratch path is as fast.
QMMA_MID_MAX_ROWS = 64
# Where the Hopper wgmma kernel runs (an sm_90 GPU) it is ahead from 17 rows, so the mid-M kernel
# keeps only the rows where a format's wgmma build is not (q8_0 to 32 rows).
QMMA_MID_MAX_ROWS_WITH_WGMMA = 16
QMMA_MID_FORMAT_MAX_ROWS_WITH_WGMMA: dict[str, int] = {"q8_0": 32}
QMMA_MID_FORMAT_MAX_ROWS: dict[str, int] = {"q8_0": 32}
QMMA_MID_MIN_N = 8192
# The CUDA C++ int8 kernel (csrc/cuda/qmma_int8.cu, op uqr::_int8_cuda) takes up to this many
# activation rows: its two 8-wide MMA column tiles (kInt8MaxRows there).
INT8_MAX_ROWS = 16
# Path "int8" (opt-in: x rounded to int8, integer dot products) runs it up to these row counts, where
# it measured faster than the exact small-M kernel; other calls take path "auto", which is exact and
# was as fast or faster. q4_0 loads its per-block scale and zero terms per column, so it pays only at
# one row; q4_k's come per 256 elements. The block-column formats take one row only.
INT8_AUTO_MAX_ROWS: dict[str, int] = {"q4_0": 1, "q4_k": 8, "mlx4": 1, "ternary": 1, "var_affine": 1, "exl3": 1}
# Path "auto" takes the Hopper wgmma kernel (csrc/cuda/qmma_wgmma.cu, op uqr::_wgmma_cuda) on an
# sm_90 GPU for the (first, last, least N, least K) row ranges of its format, where neither small-M
# kernel took the call first (qmma_auto): 17-128 rows for every format (it is up to 2.5x ahead of
# the scratch path there); 129-256 rows only with a long K, and not for var_affine and exl3, whose
# decode then costs more than the scratch path's; from 257 rows the scratch path wins.
# Which tile builds a format's stage fits (wg_fits in qmma_wgmma.cu) the plan asks the extension
# (dispatch.WGMMA_BUILDS), so no list here can drift from the kernels.
WgmmaRange = tuple[int, int, int, int]
# A format with no row of its own (a new one) takes the range every format measured fastest in.
WGMMA_DEFAULT_ROWS: tuple[WgmmaRange, ...] = ((17, 128, 0, 0),)
WGMMA_ROWS: dict[str, tuple[WgmmaRange, ...]] = {
    **{f: ((17, 128, 0, 0), (129, 256, 0, 8192)) for f in ("q4_0", "q4_1", "q4_k", "mlx4", "ternary")},
    **{f: ((17, 128, 0, 0),) for f in ("var_affine", "exl3")},
    "q8_0": ((33, 128, 0, 0),),
    # Their table-lookup decode makes the kernel slower than the scratch path at 128 rows (H100,
    # 14336 x 4096: 141 against 109 us). 17-64 rows (one 64-row tile) were not timed apart: kept
    # on the kernel, whose cost there is near its 16-row one (65 us) while the scratch path's
    # decode pass is over half of its 109 us (cuBLAS on the decoded matrix: 47).
    **{f: ((17, 64, 0, 0),) for f in ("iq4_xs", "mxfp4")},
}
# The largest ring stage (elements) of the tensor-core kernels (kQmmaMaxStageElems in
# qmma_traits.cuh): 512 (mlx4 g = 128) fits their shared memory; q6_k's 2048 (eight 210-byte
# blocks, the fewest whose bytes keep the 16-byte copies aligned) does not, so q6_k runs on the
# Triton kernels.
QMMA_MAX_STAGE_ELEMS = 512
# Up to this many activation rows, path "auto" uses the CUDA-core row kernel (gemv.py).
GEMV_AUTO_MAX_M = 1
# From this M on, decoding once into a scratch matrix and calling cuBLAS beats the fused kernel.
SCRATCH_AUTO_MIN_M = 128
# With bf16 / fp16 x, rows the tensor-core kernels do not take (17-127 when N < QMMA_MID_MIN_N, or
# 65-127) go to the scratch path from 17 rows. q8_0 and ternary keep the fused kernel longer: their
# fused tile is cheap to decode, and it stays ahead until it needs a second 64-row tile.
SCRATCH_HALF_MIN_M = 17
SCRATCH_HALF_FORMAT_MIN_M: dict[str, int] = {"q8_0": 65, "ternary": 128}
# The scratch path decodes with the CUDA C++ kernel (csrc/cuda/dequant.cu) when the extension has
# it, else with the Triton decoders; False forces Triton (A/B runs).
CUDA_DEQUANT_ENABLED = True
# The scratch path split over N into slices decoded on a side stream while cuBLAS multiplies the
# previous one (scratch_pipeline.py): (min rows, min N, slices, ring buffers, first slice's share of
# N; 0: equal slices), the last matching entry wins; no entry, or one with 1 slice = one decode, then
# one product. Two slices pay around 512 rows with a large N (only the first slice's decode is
# exposed, so it is the smaller one); with N = 4096 and from 2048 rows every split lost (cuBLAS's
# cooperative kernel leaves the side stream no SMs, and narrow slices cost it efficiency).
SCRATCH_PIPELINE: tuple[tuple[int, int, int, int, float], ...] = ((448, 8192, 2, 2, 0.35), (768, 0, 1, 1, 0.0))
# A split over K is worth it while the (n, m) tiles alone leave SMs idle; aim for this many programs
# (small-M tiles are latency-bound: split 16 measured faster than split 4 at M = 16).
TARGET_PROGRAMS_PER_SM = 8
# The one-row kernels are latency-bound (few bytes in flight per program): want more programs.
ROW_PROGRAMS_PER_SM = 8
DEFAULT_SMS = 132  # H200; used when no device is visible (interpreter)


def split_for(tiles: int, k_tiles: int, max_split: int, sms: int, per_sm: int = TARGET_PROGRAMS_PER_SM) -> int:
    """Smallest split over K reaching ``per_sm`` programs per SM, at most ``max_split``."""
    want = per_sm * sms
    split = 1
    while tiles * split < want and split * 2 <= min(max_split, k_tiles):
        split *= 2
    return split


def mma_config(M: int, N: int, K: int, sms: int = DEFAULT_SMS, x_bytes: int = 2) -> GemmConfig:
    """The tensor-core configuration for an (M, N, K) problem with ``x_bytes``-wide activations."""
    cfg = next(c for top, c in MMA_TABLE if M <= top)
    if x_bytes == 4 and cfg.NS > 2:
        # fp32 (tf32) operands double every shared-memory stage: halve K per step to stay under
        # Hopper's 227 KB (BN=128, BM=128, NS=4 failed with OutOfResources).
        cfg = replace(cfg, NS=cfg.NS // 2)
    tiles = -(-N // cfg.BN) * -(-M // cfg.BM)
    return replace(cfg, SPLIT_K=split_for(tiles, -(-K // (32 * cfg.NS)), cfg.SPLIT_K, sms))


def row_config(cfg: VecConfig, M: int, N: int, K: int, sms: int = DEFAULT_SMS) -> VecConfig:
    """A one-row kernel's configuration; one program per (row block, K split, activation row)."""
    if cfg.fixed_split:
        return cfg
    tiles = -(-N // cfg.BN) * M
    return replace(cfg, SPLIT_K=split_for(tiles, -(-K // (32 * cfg.NS)), cfg.SPLIT_K, sms, ROW_PROGRAMS_PER_SM))


def scratch_pipeline_for(rows: int, N: int) -> tuple[int, int, float] | None:
    """(slices, ring buffers, first slice's share of N) of the pipelined scratch path for ``rows`` x
    rows and N weight rows, or None for the plain path (configs.SCRATCH_PIPELINE)."""
    pick = None
    for min_rows, min_n, chunks, ring, first in SCRATCH_PIPELINE:
        if rows >= min_rows and N >= min_n:
            pick = (chunks, ring, first) if chunks > 1 else None
    return pick


# The launch plan of the CUDA C++ kernels (dispatch.plan_qmma / plan_int8 / plan_wgmma), beyond the
# row limits above; tuning.override changes single rules for A/B runs.
# Stream-K at 9-16 rows (the mid-M kernel's 16-row build): a grid of STREAMK_PER_SM CTAs an SM dealt
# equal ranges of all row tiles' stages, taken only where the power-of-two K split would leave more
# than STREAMK_MAX_EMPTY_PERCENT of the CTA slots empty (a split of 112 row tiles left SMs idle a
# fifth of the kernel; equal ranges were faster for every format).
STREAMK_PER_SM = 2
STREAMK_MAX_EMPTY_PERCENT = 5
# The stream-K launch's build at 128 registers (2 CTAs an SM, all stream-K launches) rather than 85,
# for the formats whose builds gain most registers from it (the rest measured within noise).
STREAMK_WIDE_REGS_FORMATS = ("q4_k", "exl3")
# One activation row of the int8 kernel, block-column kernel off: x staged through the weight ring
# where the grid has fewer than this many CTAs (16 weight rows) an SM (N = 4096: 256).
INT8_XRING_CTAS_PER_SM = 4
# Hopper wgmma kernel: 128-row column tiles above this many rows (one CTA an SM), else 64-row tiles,
# two CTAs an SM where the grid splits K.
WGMMA_BM64_MAX_ROWS = 64
