"""GGUF ``q3_K``: 256 weights in 110 bytes, ``u8 hmask[32]; u8 qs[64]; u8 scales[12]; half d``.

Sixteen sub-blocks of 16 with a 6-bit scale ``sc_j`` (stored + 32); ``y = d·(sc_j - 32)·(q - 4)``
with 3-bit codes q. The low 2 bits of element e's code sit at bits ``2s, 2s+1`` of qs byte
``32h + l`` (e = 128h + 32s + l); its high bit is bit ``e / 32`` of ``hmask[e % 32]``. Scale j's low
4 bits are the low (j < 8) or high (j >= 8) nibble of ``scales[j % 8]``, its high 2 bits bits
``2(j / 4)``.. of ``scales[8 + j % 4]``.
"""
from __future__ import annotations

import torch

from ._bytes import as_blocks, f16_field, random_f16, read_f16
from ._checks import f16_or_raise, require_finite_f16
from ._ggml import GROUP_MAX_EPS, first_absmax, nearest_int, pack_2bit_quarters, rdiv, seq_sum_tensor, unpack_2bit_quarters

NAME = "q3_k"
BLOCK = 256
BLOCK_BYTES = 110


def unpack_scales(s: torch.Tensor) -> torch.Tensor:
    """``scales[12]`` bytes ``[n, 12]`` -> the 16 stored 6-bit values (int32, 0..63)."""
    s = s.to(torch.int32)
    j = torch.arange(16, device=s.device)
    low = (s[:, j % 8] >> (4 * (j // 8))) & 15
    high = (s[:, 8 + j % 4] >> (2 * (j // 4))) & 3
    return low | (high << 4)


def pack_scales(ls: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`unpack_scales` for values 0..63 ``[n, 16]``."""
    ls = ls.to(torch.int32)
    low = (ls[:, :8] & 15) | ((ls[:, 8:] & 15) << 4)
    h = (ls >> 4) & 3  # [n, 16]; byte 8 + j%4 gets bits 2(j/4)
    high = h[:, 0:4] | (h[:, 4:8] << 2) | (h[:, 8:12] << 4) | (h[:, 12:16] << 6)
    return torch.cat([low, high], 1).to(torch.uint8)


def codes(b: torch.Tensor) -> torch.Tensor:
    """The 3-bit codes q (int32 ``[n, 256]``, 0..7) of blocks ``b``."""
    low = unpack_2bit_quarters(b[:, 32:96])
    hm = b[:, 0:32].to(torch.int32)  # bit e/32 of hmask[e % 32]
    high = (hm.unsqueeze(1) >> torch.arange(8, device=b.device, dtype=torch.int32).reshape(1, 8, 1)) & 1
    return low | (high.reshape(-1, 256) << 2)


def _make_q3_quants(xt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml's ``make_q3_quants(16, 4, x, L, true)`` on element-major groups ``xt`` ``[16, n]``:
    codes at ``-4/max``, then 5 rounds of one-code-at-a-time weighted (x²) least-squares moves.
    Returns the scale ``[n]`` and the codes + 4 (int32 ``[16, n]``; 0 for an all-zero group)."""
    amax, mx = first_absmax(xt)
    iscale = rdiv(-4.0, mx)
    L = nearest_int(iscale * xt).clamp(-4, 3)
    w = xt * xt
    wx = w * xt
    Lf = L.float()
    sumlx, suml2 = seq_sum_tensor(wx * Lf), seq_sum_tensor((w * Lf) * Lf)
    for _ in range(5):  # a round without a change leaves the state as it is: no early exit needed
        for i in range(xt.shape[0]):
            li = L[i].float()
            slx = sumlx - wx[i] * li
            sl2 = suml2 - (w[i] * li) * li
            new = nearest_int((xt[i] * sl2) / slx).clamp(-4, 3)
            nf = new.float()
            slx2 = slx + wx[i] * nf
            sl22 = sl2 + (w[i] * nf) * nf
            take = (slx > 0) & (new != L[i]) & (sl22 > 0) & ((slx2 * slx2) * suml2 > (sumlx * sumlx) * sl22)
            L[i] = torch.where(take, new, L[i])
            sumlx = torch.where(take, slx2, sumlx)
            suml2 = torch.where(take, sl22, suml2)
    zero = amax < GROUP_MAX_EPS
    scale = torch.where(zero, torch.zeros_like(sumlx), sumlx / suml2)
    return scale, torch.where(zero.unsqueeze(0), torch.zeros_like(L), L + 4)


def quantize(w: torch.Tensor, group_size: int = 0) -> torch.Tensor:
    """ggml's reference quantizer (``quantize_row_q3_K_ref``), bit for bit."""
    xt = w.reshape(-1, 16).t().contiguous()
    n = xt.shape[1] // 16
    scales, L = _make_q3_quants(xt)
    scales = scales.reshape(n, 16)
    _, max_scale = first_absmax(scales.t())
    has = max_scale != 0
    iscale = torch.where(has, rdiv(-32.0, max_scale), torch.zeros_like(max_scale))
    ls = torch.where(has.unsqueeze(1), nearest_int(iscale.unsqueeze(1) * scales).clamp(-32, 31) + 32,
                     torch.zeros_like(scales, dtype=torch.int32))
    d = f16_or_raise(torch.where(has, rdiv(1.0, iscale), torch.zeros_like(iscale)), NAME, "scale d")
    dj = d.unsqueeze(1) * (ls - 32).float()  # [n, 16]
    x = w.reshape(n, 16, 16)
    requant = nearest_int(x / dj.unsqueeze(2)).clamp(-4, 3) + 4
    L = torch.where((dj != 0).unsqueeze(2), requant, L.t().reshape(n, 16, 16)).reshape(n, 256)
    hmask = ((L > 3).to(torch.int32).reshape(n, 8, 32) << torch.arange(8, dtype=torch.int32, device=w.device)
             .reshape(1, 8, 1)).sum(1, dtype=torch.int32).to(torch.uint8)
    qs = pack_2bit_quarters(L & 3)
    return torch.cat([hmask, qs, pack_scales(ls), f16_field(d)], 1).reshape(w.shape[0], -1)


def decode(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> torch.Tensor:
    """Exact float32 ``[N, K]``: ``(d·(sc - 32))·(q - 4)`` (11 + 6 + 3 significant bits)."""
    b = as_blocks(data, BLOCK_BYTES)
    dl = read_f16(b, 108).unsqueeze(1) * (unpack_scales(b[:, 96:108]) - 32).float()
    q = (codes(b) - 4).float().reshape(-1, 16, 16)
    return (dl.unsqueeze(2) * q).reshape(N, K)


def validate(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> None:
    """Every scale and code is valid; only a non-finite ``d`` is refused."""
    require_finite_f16(read_f16(as_blocks(data, BLOCK_BYTES), 108), NAME, "scale d")


def random_blocks(N: int, K: int, generator: torch.Generator, group_size: int = 0) -> torch.Tensor:
    """Random valid rows: random codes and scales, finite ``d``."""
    n = N * K // BLOCK
    rest = torch.randint(0, 256, (n, 108), generator=generator, dtype=torch.uint8)
    return torch.cat([rest, f16_field(random_f16(n, generator, 0.001))], 1).reshape(N, -1)
