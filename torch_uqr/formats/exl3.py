"""``exl3``, hierarchical codebook (EXL3-style): 256 weights in 144 bytes, 3-bit indices.

```
half d; half bias; u8 scales[8]; u8 residuals[8]; i8 codebook[16]; u8 _pad[12]; u8 qs[96]
```
``P[k] = codebook[k]``, ``R[k] = codebook[8 + k]``; element i (sub-block j = i/32) has the 3-bit index
``k_i`` at bit 3i of qs; ``y_i = d·(s_j·P[k_i] + r_j·R[k_i]) + bias``. Every sub-block thus gets its
own 8-level non-uniform codebook, a non-negative mix of two tables shared by the block.
"""
from __future__ import annotations

import torch

from ._bytes import as_blocks, f16_field, random_f16, read_codes, read_f16, read_u8, write_codes
from ._checks import f16_or_raise, require_finite_f16, require_zero

NAME = "exl3"
BLOCK = 256
BLOCK_BYTES = 144
_QS = 48
_CHUNK = 1024  # blocks fitted at once: keeps the temporaries of one iteration cache-sized
# Start P at the 8-level Lloyd-Max quantizer of a unit Gaussian and R lopsided: the block has one
# bias, so mixing in an asymmetric R is how a sub-block shifts or skews its levels. (Measured: this
# start beats an evenly spaced or a sign-only R by 0.5-2% RMS after the same iterations.)
_P0 = (-2.152, -1.344, -0.756, -0.245, 0.245, 0.756, 1.344, 2.152)
_R0 = (-1.0, -0.6, -0.3, -0.1, 0.1, 0.4, 0.9, 1.6)


def _solve2(a11, a12, a22, b1, b2):
    """Solve the 2x2 symmetric systems ``[[a11, a12], [a12, a22]]·[u, v] = [b1, b2]`` elementwise."""
    det = a11 * a22 - a12 * a12
    det = torch.where(det.abs() > 0, det, torch.ones_like(det))
    return (a22 * b1 - a12 * b2) / det, (a11 * b2 - a12 * b1) / det


def _nonneg_mix(p, rr, z, ridge):
    """Least-squares ``z ≈ s·p + r·rr`` per sub-block (over the last dim) with ``s, r >= 0``."""
    a11, a12, a22 = (p * p).sum(-1), (p * rr).sum(-1), (rr * rr).sum(-1)
    b1, b2 = (p * z).sum(-1), (rr * z).sum(-1)
    lam = ridge * (a11 + a22) + 1e-30
    s, r = _solve2(a11 + lam, a12, a22 + lam, b1, b2)
    # If the unconstrained optimum leaves the quadrant, the best point is on an axis.
    s_only = (b1 / (a11 + lam)).clamp(min=0)
    r_only = (b2 / (a22 + lam)).clamp(min=0)
    inside = (s >= 0) & (r >= 0)
    err_s = -(2 * s_only * b1 - s_only * s_only * a11)
    err_r = -(2 * r_only * b2 - r_only * r_only * a22)
    use_s = err_s <= err_r
    s = torch.where(inside, s, torch.where(use_s, s_only, torch.zeros_like(s)))
    r = torch.where(inside, r, torch.where(use_s, torch.zeros_like(r), r_only))
    return s, r


def _levels(table, index):
    """``table`` ``[n, 8]`` looked up at ``index`` ``[n, 8, 32]``."""
    return torch.gather(table.unsqueeze(1).expand(-1, 8, -1), 2, index)


def _nearest(z, book):
    """Index of the nearest of the 8 levels ``book`` ``[n, 8, 8]`` for each ``z`` ``[n, 8, 32]``.

    With the levels sorted, the rank of z is the number of midpoints below it: seven compares,
    cheaper than eight distances and an argmin (and than torch.searchsorted on tiny rows).
    """
    levels, order = book.sort(-1)
    mids = (levels[..., 1:] + levels[..., :-1]) * 0.5
    rank = (z > mids[..., 0:1]).to(torch.uint8)
    for i in range(1, 7):
        rank += z > mids[..., i:i + 1]
    return torch.gather(order, 2, rank.long())


def _per_level_sums(k, values):
    """``sum over t`` of ``values[n, j, t]`` where ``k[n, j, t] == level``, as ``[n, 8 (j), 8 (level)]``."""
    n = k.shape[0]
    slot = (k + 8 * torch.arange(8, device=k.device).view(1, 8, 1)).reshape(n, -1)
    out = torch.zeros(n, 64, dtype=values.dtype, device=values.device)
    return out.scatter_add_(1, slot, values.reshape(n, -1)).reshape(n, 8, 8)


def _fit_real(x, iters):
    """Alternating fit in real numbers: indices, then (s, r), then (P, R), then the bias."""
    n = x.shape[0]
    bias = x.mean((1, 2))
    z = x - bias[:, None, None]
    sigma = z.pow(2).mean(2).sqrt()
    P = torch.tensor(_P0, dtype=x.dtype, device=x.device).expand(n, 8).clone()
    R = torch.tensor(_R0, dtype=x.dtype, device=x.device).expand(n, 8).clone()
    s, r = 0.7 * sigma, 0.3 * sigma
    for _ in range(iters):
        k = _nearest(z, s.unsqueeze(2) * P.unsqueeze(1) + r.unsqueeze(2) * R.unsqueeze(1))
        s, r = _nonneg_mix(_levels(P, k), _levels(R, k), z, 1e-6)
        # P[k], R[k] only interact with each other, so the 16-unknown least squares splits into
        # eight 2x2 systems; a small pull towards the old values keeps unused levels in place.
        count = _per_level_sums(k, torch.ones_like(z))
        zsum = _per_level_sums(k, z)
        c11 = ((s * s).unsqueeze(2) * count).sum(1)
        c12 = ((s * r).unsqueeze(2) * count).sum(1)
        c22 = ((r * r).unsqueeze(2) * count).sum(1)
        d1 = (s.unsqueeze(2) * zsum).sum(1)
        d2 = (r.unsqueeze(2) * zsum).sum(1)
        lam = 1e-3 * (c11 + c22).mean(1, keepdim=True) + 1e-30
        P, R = _solve2(c11 + lam, c12, c22 + lam, d1 + lam * P, d2 + lam * R)
        fitted = s.unsqueeze(2) * _levels(P, k) + r.unsqueeze(2) * _levels(R, k)
        shift = (z - fitted).mean((1, 2))
        bias = bias + shift
        z = z - shift[:, None, None]
    return bias, P, R, s, r


def _decode_blocks(d, bias, s, r, P, R, k):
    """Float32 values ``[n, 8, 32]`` exactly as :func:`decode` computes them."""
    mix = s.unsqueeze(2) * _levels(P, k) + r.unsqueeze(2) * _levels(R, k)   # integers, exact
    return d[:, None, None] * mix + bias[:, None, None]


def _quantize_chunk(x, iters):
    n = x.shape[0]
    bias, P, R, s, r = _fit_real(x, iters)
    k = _nearest(x - bias[:, None, None], s.unsqueeze(2) * P.unsqueeze(1) + r.unsqueeze(2) * R.unsqueeze(1))
    ones = torch.ones(n, dtype=x.dtype, device=x.device)
    alpha = torch.maximum(P.abs().amax(1), R.abs().amax(1)) / 127
    alpha = torch.where(alpha > 0, alpha, ones)
    Pi, Ri = torch.round(P / alpha[:, None]), torch.round(R / alpha[:, None])
    beta = torch.maximum(s.amax(1), r.amax(1)) / 255
    # The u8 mixes are refit against the stored d below, so a d of a few fp16 ulps still codes the
    # block well (typical weights give d ~ 2**-19): only a d that rounds to almost nothing is lost.
    d = f16_or_raise(alpha * beta, NAME, "scale d", tolerance=2.0 ** -3)
    safe_d = torch.where(d != 0, d, ones)
    for _ in range(2):
        # Refit the integer mixes for the integer tables and the stored d, then re-pick indices
        # against the exact decoded levels.
        z = (x - bias[:, None, None]) / safe_d[:, None, None]
        si, ri = _nonneg_mix(_levels(Pi, k), _levels(Ri, k), z, 0.0)
        si, ri = torch.round(si).clamp(0, 255), torch.round(ri).clamp(0, 255)
        fitted = _decode_blocks(d, torch.zeros_like(bias), si, ri, Pi, Ri, k)
        bias = f16_or_raise((x - fitted).mean((1, 2)), NAME, "bias", tolerance=None)
        book = d[:, None, None] * (si.unsqueeze(2) * Pi.unsqueeze(1) + ri.unsqueeze(2) * Ri.unsqueeze(1)) \
            + bias[:, None, None]
        k = _nearest(x, book)
    pad = torch.zeros(n, 12, dtype=torch.uint8, device=x.device)
    table = torch.cat([Pi, Ri], 1).to(torch.int8).view(torch.uint8)
    fields = [f16_field(d), f16_field(bias), si.to(torch.uint8), ri.to(torch.uint8), table, pad,
              write_codes(k.reshape(n, BLOCK), 3)]
    return torch.cat(fields, 1)


def quantize(w: torch.Tensor, group_size: int = 0, iters: int = 6) -> torch.Tensor:
    """Fit P, R, s_j, r_j and the bias per block by alternating least squares, then code them."""
    x = w.reshape(-1, 8, 32)
    out = [_quantize_chunk(x[i:i + _CHUNK], iters) for i in range(0, x.shape[0], _CHUNK)]
    return torch.cat(out, 0).reshape(w.shape[0], -1)


def decode(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> torch.Tensor:
    """Float32 ``[N, K]``: ``d·(s_j·P[k] + r_j·R[k]) + bias`` (the integer mix is exact)."""
    b = as_blocks(data, BLOCK_BYTES)
    table = b[:, 20:36].contiguous().view(torch.int8).float()
    k = read_codes(b[:, _QS:], BLOCK, 3).reshape(-1, 8, 32).to(torch.int64)
    values = _decode_blocks(read_f16(b, 0), read_f16(b, 2), read_u8(b, 4, 8).float(),
                            read_u8(b, 12, 8).float(), table[:, :8], table[:, 8:], k)
    return values.reshape(N, K)


def validate(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> None:
    """Reject non-finite ``d``/``bias`` and non-zero ``_pad``."""
    b = as_blocks(data, BLOCK_BYTES)
    require_finite_f16(read_f16(b, 0), NAME, "scale d")
    require_finite_f16(read_f16(b, 2), NAME, "bias")
    require_zero(b[:, 36:48], NAME, "_pad")


def random_blocks(N: int, K: int, generator: torch.Generator, group_size: int = 0) -> torch.Tensor:
    """Random valid rows."""
    n = N * K // BLOCK
    mid = torch.randint(0, 256, (n, 32), generator=generator, dtype=torch.uint8)
    qs = torch.randint(0, 256, (n, 96), generator=generator, dtype=torch.uint8)
    fields = [f16_field(random_f16(n, generator, 1e-5)), f16_field(random_f16(n, generator, 0.01)),
              mid, torch.zeros(n, 12, dtype=torch.uint8), qs]
    return torch.cat(fields, 1).reshape(N, -1)
