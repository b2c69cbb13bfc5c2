"""Tuning constants of the Triton kernels, in one place, and the choice of configuration by M.

The tables were set from the H200 / H100 benchmarks (python -m torch_uqr bench); tiles are named
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
# Per-step reduction (q4_0, 14336 x 4096, M = 1): 36.8 -> 32.0 us; GPU-checked for every format but
# q4_k. q4_k keeps the [BN, BK] accumulator: its swept "winner" (BN=8, 2 warps) produced wrong
# results on the H200 (not reproduced by the interpreter), so that configuration is discarded and
# q4_k's reduce_each form is left unverified.
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
QMMA_FORMATS = format_table.NAMES  # every format has a CUDA C++ kernel slot (qmma_traits.cuh)
# Per-format row limit where the Triton fused kernel measured faster above it. Empty: the last
# entry, q8_0 at 8 rows, went once its kernel beat fused at 16 (42.7 vs 47.3 us on 14336 x 4096).
QMMA_FORMAT_MAX_ROWS: dict[str, int] = {}
# The mid-M kernel (qmma_mid_m.cu: CTAs of 128 weight rows, no split over K) for 17..64 rows, only
# where there are enough weight rows to fill the GPU (N >= QMMA_MID_MIN_N). H200, 14336 x 4096,
# q4_0 at 32 / 64 rows: 35 / 56 us against the
# Triton fused kernel's 79 / 111 and the scratch path's 79 / 81; with N = 4096 (32 CTAs) it lost to
# both at every row count, and from 128 rows on the scratch path is as fast or faster. q8_0 only to
# 32 rows (48 rows: 78 us vs fused 66).
QMMA_MID_MAX_ROWS = 64
# Where the Hopper wgmma kernel runs (an sm_90 GPU), the mid-M kernel keeps no rows (16 = the
# small-M kernel's last) except q8_0's 17-32: on 14336 x 4096 (17 / 24 / 32 / 40 rows, us) wgmma is
# ahead for every other format (q4_0 31.9-32.4 vs 34.0-64.4,
# exl3 48.2-48.5 vs 51.1-93.6) and the mid-M kernel ahead for q8_0 to 32 rows (45.9-49.6 vs 52.6-52.7).
QMMA_MID_MAX_ROWS_WITH_WGMMA = 16
QMMA_MID_FORMAT_MAX_ROWS_WITH_WGMMA: dict[str, int] = {"q8_0": 32}
QMMA_MID_FORMAT_MAX_ROWS: dict[str, int] = {"q8_0": 32}
QMMA_MID_MIN_N = 8192
# The CUDA C++ int8 kernel (csrc/cuda/qmma_int8.cu, op uqr::_int8_cuda) takes up to this many
# activation rows: its two 8-wide MMA column tiles (kInt8MaxRows there).
INT8_MAX_ROWS = 16
# Path "int8" (opt-in: x rounded to int8, integer dot products) runs it up to these row counts, where
# it measured faster than the exact small-M kernel; other calls take path "auto", which is exact and
# was as fast or faster. Exact vs int8, us, 14336 x 4096:
# q4_k 23.8 vs 16.8 at 1 row, 25.3 vs 24.3 at 8, 34.5 vs 34.5 at 16; q4_0 19.1 vs 17.5 at 1 row,
# 22.0 vs 28.8 at 8 (its per-block scale and zero terms load per column; q4_k's per 256 elements).
# mlx4, ternary, var_affine and exl3: one row only (block columns), where they measured faster.
INT8_AUTO_MAX_ROWS: dict[str, int] = {"q4_0": 1, "q4_k": 8, "mlx4": 1, "ternary": 1, "var_affine": 1, "exl3": 1}
# Path "auto" takes the Hopper wgmma kernel (csrc/cuda/qmma_wgmma.cu, op uqr::_wgmma_cuda) on an
# sm_90 GPU for the (first, last, least N, least K) row ranges of its format, where neither small-M
# kernel took the call first (qmma_auto). Measured wgmma vs scratch (and the mid-M kernel), in us:
# - 17-128 rows, every format (q8_0 from 33; configs above). 14336 x 4096 at 128 rows: q4_0 43.4 vs
#   scratch 79.1, exl3 59.0 vs 83.4; 4096 x 14336 q4_0 45.3 vs 83.1; 4096 x 4096 q4_0 22.0 vs 25.4,
#   exl3 24.9 vs 26.9; 32 / 64 / 96 rows q4_0 30.7 / 31.3 / 45.9 vs 76.3 / 78.6 / 78.3.
# - 129-256 rows (160 / 192 / 256 timed). With K = 14336 (4096 x
#   14336) wgmma leads for q4_0, mlx4 and ternary (q4_0 79.6 / 82.0 / 82.4 vs 84.6 / 89.8 / 91.2),
#   not for var_affine and exl3 (exl3 105.1-108.5 vs 89.4-96.4). With K = 4096 scratch leads at 160
#   and 192 on 14336 x 4096 (q4_0 85.3 / 85.6 vs 80.4 / 80.9; at 256 84.4 vs 87.0) and at 256 on
#   4096 x 4096 (q4_0 34.2 vs 27.1). q4_1 and q4_k decode like q4_0 / mlx4 and were not timed
#   there; they take the range too.
# - from 257 rows scratch (512 rows: q4_0 158.8 vs 128.0).
WgmmaRange = tuple[int, int, int, int]
# A format with no row of its own (a new one) takes the range every format measured fastest in.
WGMMA_DEFAULT_ROWS: tuple[WgmmaRange, ...] = ((17, 128, 0, 0),)
WGMMA_ROWS: dict[str, tuple[WgmmaRange, ...]] = {
    **{f: ((17, 128, 0, 0), (129, 256, 0, 8192)) for f in ("q4_0", "q4_1", "q4_k", "mlx4", "ternary")},
    **{f: ((17, 128, 0, 0),) for f in ("var_affine", "exl3")},
    "q8_0": ((33, 128, 0, 0),),
}
# Up to this many activation rows, path "auto" uses the CUDA-core row kernel (gemv.py).
GEMV_AUTO_MAX_M = 1
# From this M on, decoding once into a scratch matrix and calling cuBLAS beats the fused kernel.
SCRATCH_AUTO_MIN_M = 128
# With bf16 / fp16 x, rows the tensor-core kernels do not take (17-127 when N < QMMA_MID_MIN_N, or
# 65-127) go to the scratch path from 17 rows: 24-128 rows, scratch vs fused on 4096 x 4096: q4_0 21.4-25.6 vs 26.0-39.6 us, q4_k 22.0-26.5 vs 33.0-42.8,
# mlx4 21.5-26.0 vs 22.0-28.9; on 14336 x 4096 at 128 rows 80.7 vs 144.2 (q4_0). q8_0 and ternary
# keep the fused kernel longer: it measured faster for them to 64 rows on both N = 4096 shapes
# (4096 x 4096 q8_0 24-64 rows: 19.4-24.9 vs 25.6-25.8). Re-timed with the CUDA decoder (24 / 32 /
# 48 / 64 / 96 rows): q8_0 fused 18.4-25.2 vs scratch 25.2-26.8 to 64 rows, but 32.5 vs 29.3 at 96
# (4096 x 14336: 99.6 vs 89.3); scratch is ahead from 72 rows on 14336 x 4096 (85.1 vs
# 101.9) and 4096 x 4096 (25.9 vs 32.2), the fused kernel needing a second 64-row tile past 64
# (4096 x 14336: 69.4 us at 64 rows, 99.6 at 96), so q8_0 switches at 65. Ternary is mixed past 64
# rows (ties within 2 us on 14336 x 4096, scratch ahead at 72-80 on 4096 x 4096, fused ahead
# at 96 on 4096 x 14336: 71.2 vs 78.1) and keeps 128. q4_0's scratch led
# from 24 rows on 4096 x 4096 (21.4 vs 26.1) and from 32 on 4096 x 14336 (79.4 vs 83.2; at 24
# rows there fused 72.1 beat 77.9, not enough to split the rule by shape).
SCRATCH_HALF_MIN_M = 17
SCRATCH_HALF_FORMAT_MIN_M: dict[str, int] = {"q8_0": 65, "ternary": 128}
# The scratch path decodes with the CUDA C++ kernel (csrc/cuda/dequant.cu) when the extension has
# it, else with the Triton decoders; False forces Triton (A/B runs).
CUDA_DEQUANT_ENABLED = True
# The scratch path split over N into slices decoded on a side stream while cuBLAS multiplies the
# previous one (scratch_pipeline.py): (min rows, min N, slices, ring buffers), the last matching
# entry wins; no entry, or one with 1 slice = one decode, then one product. Each configuration
# timed twice, us: on 14336 x 4096 two slices
# in two buffers win at 512 rows (q4_0 122.1 / 126.1 vs plain 127.9 / 131.7, q4_k 126.0 / 126.0 vs
# 132.1 / 133.6, mlx4 121.1 / 120.4 vs 129.3 / 128.6), lose at 384 (q4_0 107.8 vs 103.1) and tie at
# 768; with N = 4096 (4096 x 14336) they lose at 384-768 rows (q4_0 at 512: 133.1 vs 119.2), as
# every configuration did at 2048-4096 rows (cuBLAS's cooperative kernel leaves the side
# stream no SMs, and narrow slices cost it efficiency). The fifth field is the first slice's share
# of N (0: equal slices): only its decode is exposed. 512 rows on 14336 x 4096, us, equal halves vs
# a first slice of 35 % (each timed twice or more):
# q4_0 123.7 / 123.8 / 123.1 / 123.9 vs 123.6 / 121.8 / 122.0, q4_k 127.3 / 127.1 / 126.9 / 126.1
# vs 125.9 / 125.3 / 125.4, exl3 128.8 / 127.6 / 129.1 / 130.3 vs 127.3 / 128.2 / 127.8, mlx4
# 122.5 / 121.7 vs 120.0 / 122.6; 25 % and 40 % were slower than halves, 45 % within noise of 35 %.
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
# equal ranges of all row tiles' stages. With 2 K-splits of 112 row tiles (14336 x 4096) 92 SMs held
# two CTAs and 40 one, busy 78 % of the kernel (ncu); equal ranges measured 3-9 % faster for every
# format at 16 rows. Taken only where the power-of-two split leaves more than STREAMK_MAX_EMPTY_PERCENT
# of those CTA slots empty: the N = 4096 shapes' 256 CTAs (1.94 an SM) stay as measured.
STREAMK_PER_SM = 2
STREAMK_MAX_EMPTY_PERCENT = 5
# The stream-K launch's build at 128 registers (2 CTAs an SM, all stream-K launches) rather than 85:
# H100, 16 rows, 14336 x 4096, us, 85 -> 128: q4_k 26.4 -> 25.2/25.1, exl3 34.3/35.0 -> 32.5/32.7,
# the rest within +-3 % either way (their builds gain fewer registers).
STREAMK_WIDE_REGS_FORMATS = ("q4_k", "exl3")
# One activation row of the int8 kernel, block-column kernel off: x staged through the weight ring
# where the grid has fewer than this many CTAs (16 weight rows) an SM (N = 4096: 256).
INT8_XRING_CTAS_PER_SM = 4
# Hopper wgmma kernel: 128-row column tiles above this many rows (one CTA an SM; 128 rows: exl3 75.0
# vs 90.4 us at two CTAs of 64), else 64-row tiles, two CTAs an SM where the grid splits K.
WGMMA_BM64_MAX_ROWS = 64
