"""GGUF ``q2_K``: 256 weights in 84 bytes, ``u8 scales[16]; u8 qs[64]; half d; half dmin``.

Sixteen sub-blocks of 16; byte j of scales holds sub-block j's 4-bit scale (low nibble) and 4-bit
min (high nibble): ``y = d·sc_j·q - dmin·m_j`` with 2-bit codes q, packed as q3_k's low bits (element
``e = 128h + 32s + l`` at bits ``2s, 2s+1`` of qs byte ``32h + l``).
"""
from __future__ import annotations

import torch

from ._bytes import as_blocks, f16_field, random_f16, read_f16
from ._checks import f16_or_raise, require_finite_f16
from ._ggml import nearest_int, pack_2bit_quarters, rdiv, seq_sum_tensor, unpack_2bit_quarters

NAME = "q2_k"
BLOCK = 256
BLOCK_BYTES = 84


def _make_qkx2_quants(xt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ggml's ``make_qkx2_quants(16, 3, x, |x|, ..., -0.5, 0.1, 15, use_mad=true)`` on element-major
    groups ``xt`` ``[16, n]``: min/max codes, then 16 trial scales ``(2.5 + 0.1 is)/(max - min)`` (min:
    the best offset so far), each refit (scale, min <= 0) by weighted least squares and kept if its
    weighted absolute error is lower. Returns (scale ``[n]``, -min ``[n]``, codes int32 ``[16, n]``)."""
    w = xt.abs()
    mn = torch.minimum(xt.min(0).values, torch.zeros(()))
    mx = xt.max(0).values
    sum_w = w[0].clone()
    sum_x = w[0] * xt[0]
    for i in range(1, xt.shape[0]):  # ggml starts from element 0, not from 0 + element 0
        sum_w = sum_w + w[i]
        sum_x = sum_x + w[i] * xt[i]
    flat = mx == mn

    def codes_at(iscale: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
        return nearest_int(iscale * (xt - lo)).clamp(0, 3)

    def mad(scale: torch.Tensor, lo: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
        return seq_sum_tensor(w * ((scale * L.float() + lo) - xt).abs())

    iscale = rdiv(3.0, mx - mn)
    scale = rdiv(1.0, iscale)
    L = codes_at(iscale, mn)
    best = mad(scale, mn, L)
    lo = mn
    for step in range(16):
        # ggml's `min` is the best fit so far: later trials are placed (and coded) relative to it
        La = codes_at(rdiv(_trial(step), mx - lo), lo)
        Lf = La.float()
        wl = w * Lf
        sum_l, sum_l2, sum_xl = seq_sum_tensor(wl), seq_sum_tensor(wl * Lf), seq_sum_tensor(wl * xt)
        D = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
        pos = this_min > 0
        this_scale = torch.where(pos, sum_xl / sum_l2, this_scale)
        this_min = torch.where(pos, torch.zeros_like(this_min), this_min)
        cur = mad(this_scale, this_min, La)
        take = (D > 0) & (cur < best)
        L = torch.where(take, La, L)
        best = torch.where(take, cur, best)
        scale = torch.where(take, this_scale, scale)
        lo = torch.where(take, this_min, lo)
    L = torch.where(flat, torch.zeros_like(L), L)
    scale = torch.where(flat, torch.zeros_like(scale), scale)
    return scale, -lo, L


def _trial(step: int) -> float:
    """``rmin + rdelta·is + nmax`` in float32 as ggml evaluates it: (-0.5f + 0.1f·is) + 3."""
    f = torch.tensor
    return float((f(-0.5, dtype=torch.float32) + f(0.1, dtype=torch.float32) * float(step)) + 3.0)


def quantize(w: torch.Tensor, group_size: int = 0) -> torch.Tensor:
    """ggml's reference quantizer (``quantize_row_q2_K_ref``), bit for bit."""
    xt = w.reshape(-1, 16).t().contiguous()
    n = xt.shape[1] // 16
    scales, mins, L = _make_qkx2_quants(xt)
    scales, mins = scales.reshape(n, 16), mins.reshape(n, 16)
    max_scale = torch.clamp(scales.max(1).values, min=0.0)
    max_min = torch.clamp(mins.max(1).values, min=0.0)
    has_s, has_m = max_scale > 0, max_min > 0
    ls = torch.where(has_s.unsqueeze(1), nearest_int(rdiv(15.0, max_scale).unsqueeze(1) * scales), 0) & 255
    lm = torch.where(has_m.unsqueeze(1), nearest_int(rdiv(15.0, max_min).unsqueeze(1) * mins), 0)
    sc = (ls | (lm << 4)) & 255
    d = f16_or_raise(torch.where(has_s, max_scale / 15.0, torch.zeros_like(max_scale)), NAME, "scale d")
    dmin = f16_or_raise(torch.where(has_m, max_min / 15.0, torch.zeros_like(max_min)), NAME, "scale dmin",
                        tolerance=None)
    dj = d.unsqueeze(1) * (sc & 15).float()
    mj = dmin.unsqueeze(1) * (sc >> 4).float()
    x = w.reshape(n, 16, 16)
    requant = nearest_int((x + mj.unsqueeze(2)) / dj.unsqueeze(2)).clamp(0, 3)
    L = torch.where((dj != 0).unsqueeze(2), requant, L.t().reshape(n, 16, 16)).reshape(n, 256)
    fields = [sc.to(torch.uint8), pack_2bit_quarters(L), f16_field(d), f16_field(dmin)]
    return torch.cat(fields, 1).reshape(w.shape[0], -1)


def decode(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> torch.Tensor:
    """Float32 ``[N, K]``: ``(d·sc)·q - dmin·m``; both products are exact, the difference rounds once."""
    b = as_blocks(data, BLOCK_BYTES)
    sc = b[:, 0:16].to(torch.int32)
    dl = read_f16(b, 80).unsqueeze(1) * (sc & 15).float()
    ml = read_f16(b, 82).unsqueeze(1) * (sc >> 4).float()
    q = unpack_2bit_quarters(b[:, 16:80]).float().reshape(-1, 16, 16)
    return (dl.unsqueeze(2) * q - ml.unsqueeze(2)).reshape(N, K)


def validate(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> None:
    """Every scale and code is valid; only a non-finite ``d`` or ``dmin`` is refused."""
    b = as_blocks(data, BLOCK_BYTES)
    require_finite_f16(read_f16(b, 80), NAME, "scale d")
    require_finite_f16(read_f16(b, 82), NAME, "scale dmin")


def random_blocks(N: int, K: int, generator: torch.Generator, group_size: int = 0) -> torch.Tensor:
    """Random valid rows: random scale bytes and codes, finite ``d`` and ``dmin``."""
    n = N * K // BLOCK
    rest = torch.randint(0, 256, (n, 80), generator=generator, dtype=torch.uint8)
    d = f16_field(random_f16(n, generator, 0.002))
    dmin = f16_field(random_f16(n, generator, 0.002))
    return torch.cat([rest, d, dmin], 1).reshape(N, -1)
