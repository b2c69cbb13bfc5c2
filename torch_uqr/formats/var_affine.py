"""``var_affine``, grouped variable-rate affine (EXL2-style): 256 weights in 160 bytes.

```
half d; half bias; u8 scales[8]; u8 biases[8]; u8 modes[8]; u8 _pad[4]; u8 qs[128]
```
Sub-block j (elements 32j..32j+31) has depth ``B_j = modes[j] & 7`` in {3, 4, 5}; its 32 codes are
packed back to back from bit ``32·(B_0 + ... + B_{j-1})`` of qs; ``sum(B_j) <= 32`` (1024 bits).
``y = d·s_j·q + bias·b_j``.
"""
from __future__ import annotations

import torch

from ._bytes import as_blocks, f16_field, random_f16, read_bits, read_f16, read_u8, write_bits
from ._checks import f16_or_raise, first_bad, require_finite_f16, require_zero
from ._fit import fit_affine

NAME = "var_affine"
BLOCK = 256
BLOCK_BYTES = 160
DEPTHS = (3, 4, 5)
BUDGET_BITS = 1024
_QS = 32  # byte offset of the payload


def bit_offsets(depth: torch.Tensor) -> torch.Tensor:
    """Bit offset of every element ``[n, 256]`` (int64) from the sub-block depths ``[n, 8]``."""
    depth = depth.to(torch.int64)
    start = 32 * (torch.cumsum(depth, 1) - depth)
    t = torch.arange(32, device=depth.device, dtype=torch.int64)
    return (start.unsqueeze(2) + t * depth.unsqueeze(2)).reshape(-1, BLOCK)


def allocate_depths(errors: torch.Tensor) -> torch.Tensor:
    """Greedy bit allocation: ``errors`` ``[n, 8, 3]`` (squared error at depth 3/4/5) -> depths ``[n, 8]``.

    Start every sub-block at 3 bits, then hand the 8 spare bits-per-element of the budget, one at a
    time, to the sub-block whose error drops most from one more bit.
    """
    n = errors.shape[0]
    level = torch.zeros(n, 8, dtype=torch.int64, device=errors.device)
    spare = BUDGET_BITS // 32 - 3 * 8
    for _ in range(spare):
        now = torch.gather(errors, 2, level.unsqueeze(2)).squeeze(2)
        nxt = torch.gather(errors, 2, (level + 1).clamp(max=2).unsqueeze(2)).squeeze(2)
        gain = torch.where(level < 2, now - nxt, torch.full_like(now, -1.0))
        pick = gain.argmax(1, keepdim=True)
        can = torch.gather(gain, 1, pick) >= 0
        level.scatter_add_(1, pick, can.to(torch.int64))
    return level + 3


def quantize(w: torch.Tensor, group_size: int = 0) -> torch.Tensor:
    """Fit each sub-block at 3, 4 and 5 bits, allocate depths greedily, then code the scales."""
    x = w.reshape(-1, 8, 32)
    n = x.shape[0]
    fits = [fit_affine(x.reshape(-1, 32), (1 << b) - 1, offset_le_zero=True, steps=10) for b in DEPTHS]
    errors = torch.stack([f.error.reshape(n, 8) for f in fits], 2)
    depth = allocate_depths(errors)
    level = (depth - 3).unsqueeze(2)
    scale = torch.gather(torch.stack([f.scale.reshape(n, 8) for f in fits], 2), 2, level).squeeze(2)
    offset = torch.gather(torch.stack([f.offset.reshape(n, 8) for f in fits], 2), 2, level).squeeze(2)
    # The u8 multipliers s are rounded against the stored d, so a d of a few fp16 ulps still codes
    # the block well: only a d that rounds to almost nothing is lost.
    d = f16_or_raise(scale.max(1).values / 255, NAME, "scale d", tolerance=2.0 ** -3)
    # Offsets are <= 0, so a non-positive super-bias times u8 multipliers covers them all.
    bias = f16_or_raise(offset.min(1).values / 255, NAME, "bias", tolerance=None)
    s = torch.round(scale / torch.where(d > 0, d, torch.ones_like(d)).unsqueeze(1)).clamp(0, 255)
    bm = torch.round(offset / torch.where(bias < 0, bias, -torch.ones_like(bias)).unsqueeze(1)).clamp(0, 255)
    step = (d.unsqueeze(1) * s).unsqueeze(2)
    low = (bias.unsqueeze(1) * bm).unsqueeze(2)
    inv_step = torch.where(step > 0, 1.0 / step, torch.zeros_like(step))
    qmax = ((1 << depth) - 1).unsqueeze(2).to(x.dtype)
    q = torch.minimum(torch.round((x - low) * inv_step).clamp(min=0), qmax)
    qs = write_bits(q.reshape(n, BLOCK), bit_offsets(depth), depth.repeat_interleave(32, 1), 128)
    pad = torch.zeros(n, 4, dtype=torch.uint8, device=x.device)
    fields = [f16_field(d), f16_field(bias), s.to(torch.uint8), bm.to(torch.uint8),
              depth.to(torch.uint8), pad, qs]
    return torch.cat(fields, 1).reshape(w.shape[0], -1)


def decode(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> torch.Tensor:
    """Exact-as-float32 ``[N, K]``: ``(d·s_j)·q + bias·b_j`` (each product exact, one rounding)."""
    b = as_blocks(data, BLOCK_BYTES)
    depth = read_u8(b, 20, 8) & 7
    q = read_bits(b[:, _QS:], bit_offsets(depth), depth.repeat_interleave(32, 1)).float()
    step = (read_f16(b, 0).unsqueeze(1) * read_u8(b, 4, 8).float()).unsqueeze(2)
    low = (read_f16(b, 2).unsqueeze(1) * read_u8(b, 12, 8).float()).unsqueeze(2)
    return (step * q.reshape(-1, 8, 32) + low).reshape(N, K)


def validate(data: torch.Tensor, N: int, K: int, group_size: int = 0) -> None:
    """Reject non-finite scales, reserved mode bits, depths outside {3,4,5}, over-budget blocks,
    non-zero ``_pad`` and non-zero payload bits past the last code."""
    b = as_blocks(data, BLOCK_BYTES)
    require_finite_f16(read_f16(b, 0), NAME, "scale d")
    require_finite_f16(read_f16(b, 2), NAME, "bias")
    modes = read_u8(b, 20, 8)
    require_zero(modes >> 3, NAME, "reserved bits 3-7 of modes[]")
    depth = modes & 7
    bad = first_bad((depth < 3) | (depth > 5))
    if bad >= 0:
        raise ValueError(f"{NAME}: block {bad} has a bit depth outside {{3, 4, 5}}: {depth[bad].tolist()}")
    used = 32 * depth.sum(1)
    bad = first_bad(used > BUDGET_BITS)
    if bad >= 0:
        raise ValueError(f"{NAME}: block {bad} needs {int(used[bad])} payload bits, over the "
                         f"{BUDGET_BITS}-bit budget (depths {depth[bad].tolist()})")
    require_zero(b[:, 28:32], NAME, "_pad")
    # The payload always ends on a 32-bit boundary, so the unused tail is whole bytes.
    tail = torch.arange(BUDGET_BITS // 8, device=b.device) >= (used // 8).unsqueeze(1)
    require_zero(b[:, _QS:] * tail, NAME, "payload bits after the last code")


def random_blocks(N: int, K: int, generator: torch.Generator, group_size: int = 0) -> torch.Tensor:
    """Random valid rows: random depths within the budget, random codes and multipliers."""
    n = N * K // BLOCK
    # Random depths: start at 3 and add up to 8 extra bits at random positions, at most 2 each.
    extra = torch.zeros(n, 8, dtype=torch.int64)
    for _ in range(8):
        pick = torch.randint(0, 8, (n, 1), generator=generator)
        room = torch.gather(extra, 1, pick) < 2
        take = room & (torch.rand(n, 1, generator=generator) < 0.7)
        extra.scatter_add_(1, pick, take.to(torch.int64))
    depth = extra + 3
    codes = torch.randint(0, 32, (n, BLOCK), generator=generator) & ((1 << depth) - 1).repeat_interleave(32, 1)
    qs = write_bits(codes, bit_offsets(depth), depth.repeat_interleave(32, 1), 128)
    mult = torch.randint(0, 256, (n, 16), generator=generator, dtype=torch.uint8)
    fields = [f16_field(random_f16(n, generator, 0.001)), f16_field(random_f16(n, generator, 0.002)),
              mult, depth.to(torch.uint8), torch.zeros(n, 4, dtype=torch.uint8), qs]
    return torch.cat(fields, 1).reshape(N, -1)
