"""ggml's scalar building blocks, reproduced bit for bit on float32 tensors, so the GGUF formats'
reference quantizers can be run vectorized over blocks and still write ggml's bytes.

ggml's quantizers are sequential C loops over float32; the same arithmetic in the same order gives
the same bits. The helpers here keep that order: a sum over a block's elements is accumulated
left to right (:func:`seq_sum`), never by a tree reduction, and every product is its own
rounded operation.
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["GROUP_MAX_EPS", "IQ4_VALUES", "nearest_int", "rdiv", "seq_sum", "first_absmax", "best_index", "nearest_level",
           "lut_decode", "pack_2bit_quarters", "unpack_2bit_quarters"]

#: Below this magnitude ggml treats a group as all zero.
GROUP_MAX_EPS = 1e-15
#: The 16 levels of iq4_nl / iq4_xs (ggml's non-linear 4-bit table).
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def nearest_int(v: torch.Tensor) -> torch.Tensor:
    """ggml's ``nearest_int``: add 1.5·2^23 in float32 and read the mantissa bits (round half to even
    for |v| < 2^22; larger values give ggml's own wrapped result, reproduced as well). int32."""
    bits = (v.to(torch.float32) + 12582912.0).view(torch.int32)
    return (bits & 0x007FFFFF) - 0x00400000


def rdiv(a: float, t: torch.Tensor) -> torch.Tensor:
    """``a / t`` as C divides floats. (``float / tensor`` in torch multiplies by the reciprocal:
    two roundings, which changes ggml's codes.)"""
    return torch.full_like(t, a) / t


def seq_sum(terms: torch.Tensor) -> torch.Tensor:
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
