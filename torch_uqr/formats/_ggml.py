"""ggml's reference quantizers' building blocks and searches (no importance matrix), bit for bit.

The GGUF k-quants and q6_k choose their scales by small searches whose every sum is a float32
loop in element order. To give the bytes llama.cpp's reference quantizer gives, these functions
keep that order: groups are vectorized over, in element-major ``[E, n]`` arrays, and each sum
over a group's E elements adds the E rows in order in float32 (:func:`seq_sum`). Every other operation is one IEEE float32 operation as in C: rounding is ``np.rint``
(ties to even, ggml's ``nearest_int`` for the values these searches round, |v| < 2**22) and
``num / x`` divides once (torch would multiply by a reciprocal, which rounds twice).
The searches run on the CPU, in slices of groups that keep their temporaries in cache.

The table-lookup and 2-bit helpers at the end (iq4_nl / iq4_xs / q3_k / q2_k) work on torch
tensors laid out element-major (``[elements, blocks]``); :func:`seq_sum_tensor` is their ordered sum.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ._checks import f16_or_raise

__all__ = ["GROUP_MAX_EPS", "min_max_codes", "IQ4_VALUES", "f32", "sliced", "rdiv", "seq_sum", "seq_sum_tensor", "make_qx_quants",
           "make_qkx2_quants", "k_block_weights", "nearest_int", "first_absmax", "best_index", "nearest_level",
           "lut_decode", "pack_2bit_quarters", "unpack_2bit_quarters"]

#: ggml's threshold below which a group counts as all zeros.
GROUP_MAX_EPS = np.float32(1e-15)
#: The 16 levels of iq4_nl / iq4_xs (ggml's non-linear 4-bit table).
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
_SLICE = 16384  # groups per slice


def f32(v) -> np.float32:
    return np.float32(v)


def sliced(groups: torch.Tensor, search: Callable[[np.ndarray], tuple]) -> tuple[torch.Tensor, ...]:
    """Run ``search`` on element-major float32 slices of ``groups`` ``[n, E]`` and join its
    results: ``[n]`` arrays and ``[E, n]`` arrays, both along their last axis, as CPU tensors."""
    x = groups.detach().to("cpu", torch.float32).numpy()
    # Weights too large for fp16 overflow here as in C; the caller's fp16 check reports them.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        parts = [search(np.ascontiguousarray(x[i:i + _SLICE].T)) for i in range(0, x.shape[0], _SLICE)]
    return tuple(torch.from_numpy(np.concatenate(p, axis=-1)) for p in zip(*parts))


def rdiv(num: float, t: torch.Tensor) -> torch.Tensor:
    """``num / t`` rounded once, as C divides (torch's ``num / t`` is ``num * (1 / t)``)."""
    return torch.full_like(t, float(num)).div_(t)


def seq_sum(terms: np.ndarray) -> np.ndarray:
    """``acc = 0; for t in terms: acc += t`` in float32: the sum of ``[E, n]`` over E, in order.

    numpy reduces the outer axis of a C-contiguous array row by row (one vector add per row, no
    pairwise summation, which it uses along the contiguous axis, as it does for a single column).
    The leading 0 only changes the sign of an all-zero sum, which + 0 reproduces.
    """
    if terms.shape[1] < 2:
        acc = np.zeros(terms.shape[1:], np.float32)
        for t in terms:
            acc = acc + t
        return acc
    return np.add.reduce(np.ascontiguousarray(terms), axis=0) + f32(0)


def make_qx_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric codes in [-nmax, nmax - 1] for each column of ``x`` ``[E, n]`` with weights x²
    (ggml's ``make_qx_quants``, rmse_type 1): of the scales ``-(nmax + 0.1 i) / max``, i in
    -9..9 (max: the element of largest magnitude, the first one on ties), the one whose
    least-squares refit explains the most.

    Returns (scale ``[n]``, codes + nmax ``[E, n]`` int32); groups with max |x| below
    :data:`GROUP_MAX_EPS` get scale 0 and codes 0.
    """
    ax = np.abs(x)
    imax = ax.argmax(0)  # the first largest |x|, as ggml's strict '>' scan
    vmax = np.take_along_axis(x, imax[None], 0)[0]
    zero = ax.max(0) < GROUP_MAX_EPS
    vmax = np.where(zero, f32(1), vmax)
    w = x * x
    wx = w * x

    def fit(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        q = np.clip(np.rint(iscale * x), -nmax, nmax - 1)
        return seq_sum(wx * q), seq_sum(w * q * q)

    iscale = f32(-nmax) / vmax
    best_iscale = iscale
    sumlx, suml2 = fit(iscale)
    scale = np.where(suml2 != 0, sumlx / suml2, f32(0))
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        cand = -(f32(nmax) + f32(0.1) * f32(step)) / vmax
        sumlx, suml2 = fit(cand)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        scale = np.where(better, sumlx / suml2, scale)
        best = np.where(better, scale * sumlx, best)
        best_iscale = np.where(better, cand, best_iscale)
    codes = np.clip(np.rint(best_iscale * x), -nmax, nmax - 1).astype(np.int32) + nmax
    return np.where(zero, f32(0), scale), np.where(zero, 0, codes)


def make_qkx2_quants(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float,
                     nstep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Affine codes in [0, nmax] for each column of ``x`` ``[E, n]`` under weights ``w``
    (ggml's ``make_qkx2_quants``): min/max rounding, then nstep + 1 candidate scales
    ``(rmin + rdelta i + nmax) / (max - min)``, each refit by weighted least squares (offset
    kept <= 0); the one of least weighted squared error wins, and its offset moves the range
    the later candidates are taken from, as in ggml.

    Returns (scale ``[n]``, min ``[n]`` (the value subtracted, >= 0), codes ``[E, n]`` int32).
    """
    hi = x.max(0)
    lo = np.minimum(x.min(0), f32(0))
    sum_w = seq_sum(w)  # ggml starts these two from element 0, not 0: the same but for -0
    sum_x = seq_sum(w * x)
    flat = hi == lo
    one = f32(1)

    def error(scale: np.ndarray, offset: np.ndarray, q: np.ndarray) -> np.ndarray:
        diff = scale * q + offset - x
        return seq_sum(w * (diff * diff))

    iscale = f32(nmax) / np.where(flat, one, hi - lo)
    scale = one / iscale
    q = np.clip(np.rint(iscale * (x - lo)), 0, nmax)
    best = error(scale, lo, q)
    for step in range(nstep + 1):
        num = f32(f32(rmin) + f32(rdelta) * f32(step)) + f32(nmax)
        cand = np.clip(np.rint(num / np.where(flat, one, hi - lo) * (x - lo)), 0, nmax)
        wl = w * cand
        sum_l = seq_sum(wl)
        sum_l2 = seq_sum(wl * cand)
        sum_xl = seq_sum(wl * x)
        det = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
        pos = this_min > 0
        this_min = np.where(pos, f32(0), this_min)
        this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
        cur = error(this_scale, this_min, cand)
        better = (det > 0) & (cur < best)
        best = np.where(better, cur, best)
        q = np.where(better, cand, q)
        scale = np.where(better, this_scale, scale)
        lo = np.where(better, this_min, lo)
    q = np.where(flat, f32(0), q)
    scale = np.where(flat, f32(0), scale)
    return scale, -lo, q.astype(np.int32)


def k_block_weights(x: np.ndarray) -> np.ndarray:
    """ggml's q4_K / q5_K weights of a sub-block ``[E, n]``: rms of the sub-block plus |x|."""
    av = np.sqrt(seq_sum(x * x) / f32(x.shape[0]))
    return av + np.abs(x)


# Torch-tensor helpers of iq4_nl, iq4_xs, q3_k and q2_k.

def nearest_int(v: torch.Tensor) -> torch.Tensor:
    """ggml's ``nearest_int``: add 1.5·2^23 in float32 and read the mantissa bits (round half to even
    for |v| < 2^22; larger values give ggml's own wrapped result, reproduced as well). int32."""
    bits = (v.to(torch.float32) + 12582912.0).view(torch.int32)
    return (bits & 0x007FFFFF) - 0x00400000


def seq_sum_tensor(terms: torch.Tensor) -> torch.Tensor:
    """``0 + t[0] + t[1] + ...`` over the FIRST dim, left to right in float32 (a C loop's sum).
    Blocks are laid out element-major (``[elements, blocks]``) so each step adds a contiguous row."""
    if terms.device.type == "cpu":
        # numpy's small adds run on one thread; torch's pay a thread hand-off per add (measured
        # 2 ms against 0.15 ms per 128K-element add on a busy 2-core machine).
        t = terms.contiguous().numpy()
        acc = np.zeros(t.shape[1:], dtype=np.float32)
        for j in range(t.shape[0]):
            np.add(acc, t[j], out=acc)
        return torch.from_numpy(acc)
    acc = torch.zeros(terms.shape[1:], dtype=torch.float32, device=terms.device)
    for j in range(terms.shape[0]):
        acc += terms[j]
    return acc


def first_absmax(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(amax, max) over the first dim (``[elements, blocks]``): the largest |x| and the signed value
    of its first occurrence (ggml's ``if (ax > amax)`` scan)."""
    ax = x.abs()
    i = ax.argmax(0, keepdim=True)  # first index of the maximum
    return torch.gather(ax, 0, i).squeeze(0), torch.gather(x, 0, i).squeeze(0)


def best_index(table: tuple[int, ...], x: torch.Tensor) -> torch.Tensor:
    """ggml's ``best_index_int8`` for a sorted table of integer levels: the index of the nearest
    level, ties to the upper one; below the first / above the last level the end index. int64.

    ggml compares ``x - lo < hi - x``; for |x| < 2^8 both differences are exact in float32, so the
    test is ``x < (lo + hi)/2`` exactly, and with half-integer midpoints it depends only on
    ``floor(2x)`` (exact: a power-of-two scaling): one table lookup per value."""
    lut, lo = _index_lut(table, x.device)
    return torch.take(lut, _lut_position(x, lo, lut.numel()))


def nearest_level(table: tuple[int, ...], x: torch.Tensor) -> torch.Tensor:
    """``table[best_index(table, x)]`` as float32, in one lookup."""
    lut, lo = _index_lut(table, x.device)
    levels = torch.tensor(table, dtype=torch.float32, device=x.device)[lut]
    return torch.take(levels, _lut_position(x, lo, lut.numel()))


def _lut_position(x: torch.Tensor, lo: int, n: int) -> torch.Tensor:
    # NaN (0/0 for an all-zero group) falls through ggml's search to the last index.
    return (torch.floor(x * 2.0).nan_to_num_(nan=float(lo + n)).clamp_(lo, lo + n - 1) - lo).long()


_LUTS: dict = {}


def _index_lut(table: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, int]:
    """For every integer n in [2·min - 2, 2·max + 2]: the best index of any x with floor(2x) = n."""
    key = (table, str(device))
    if key not in _LUTS:
        lo, hi = 2 * table[0] - 2, 2 * table[-1] + 2
        n = torch.arange(lo, hi + 1, dtype=torch.int64)
        mids2 = torch.tensor([a + b for a, b in zip(table, table[1:])], dtype=torch.int64)  # 2·midpoints
        _LUTS[key] = ((n.unsqueeze(1) >= mids2).sum(1).to(device), lo)
    return _LUTS[key]


def lut_decode(codes: torch.Tensor, table: tuple[int, ...]) -> torch.Tensor:
    """The table entries of 4-bit codes (any int tensor) as float32."""
    lut = torch.tensor(table, dtype=torch.float32, device=codes.device)
    return lut[codes.long()]


def pack_2bit_quarters(codes: torch.Tensor) -> torch.Tensor:
    """The q2_k / q3_k low-bit packing: codes ``[n, 256]`` in 0..3 -> ``[n, 64]`` bytes where byte
    ``32h + l`` holds element ``128h + 32s + l`` at bits ``2s, 2s+1``."""
    q = codes.to(torch.int32).reshape(-1, 2, 4, 32)
    out = q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)
    return out.reshape(-1, 64).to(torch.uint8)


def unpack_2bit_quarters(qs: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_2bit_quarters`: ``[n, 64]`` bytes -> int32 codes ``[n, 256]``."""
    q = qs.to(torch.int32).reshape(-1, 2, 1, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.int32, device=qs.device).reshape(1, 1, 4, 1)
    return ((q >> shifts) & 3).reshape(-1, 256)


def min_max_codes(x: torch.Tensor, qmax: int, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ggml's rounding of blocks ``x`` ``[n, 32]`` for the formats with a scale and a minimum:
    ``d = (max - min)/qmax``, ``m = min``, codes ``trunc((x - min)/d + 0.5)``. Returns fp16-rounded
    (d, m) ``[n]`` and the codes."""
    lo = x.min(1).values
    hi = x.max(1).values
    d = (hi - lo) / qmax
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.trunc((x - lo.unsqueeze(1)) * inv.unsqueeze(1) + 0.5).clamp(0, qmax)
    return f16_or_raise(d, name, "scale d"), f16_or_raise(lo, name, "min m", tolerance=None), q
