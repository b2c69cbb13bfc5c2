"""The CPU block decoders against the Python reference decode, bit for bit, for every format.

``torch.ops.uqr.gemm`` with identity rows as x returns the decoded weights themselves: each output
is one weight times 1 plus weights times 0, all exact in fp32, so any difference from the reference
(``module.decode``, what ``torch_uqr.dequantize`` runs) is a decoder difference, not accumulation
error. Blocks: random valid ones, random bytes, and a valid block with each byte in turn set to
values that put an fp16 / E8M0 scale at its extremes (subnormal, largest finite, inf, NaN) and
every code bit on or off. M = 1 and 8 run the fused decode+dot kernel (4- and 1-row weight tiles),
M = K the panel path.

A weight row with a non-finite value makes its whole output column non-finite (0 * inf = NaN), so
such rows are held only to being non-finite (NaN / inf propagate); every other row must match
exactly.
"""
from __future__ import annotations

import importlib

import pytest
import torch

from torch_uqr.formats import table as format_table

uqr_formats = importlib.import_module("torch_uqr.formats")

CASES = format_table.format_cases()
IDS = [f if g is None else f"{f}-g{g}" for f, g in CASES]
K = 256  # a whole block of the 256-weight formats, several blocks of the others
# fp16 high byte: 0x00 subnormal, 0x04 smallest normal, 0x7B largest finite, 0x7C inf, 0xFF NaN
# (E8M0: 0x00 / 0x01 subnormal halves, 0xFF the largest); low byte / codes: 0x00, 0xFF.
EXTREMES = (0x00, 0x01, 0x04, 0x7B, 0x7C, 0x80, 0xFB, 0xFF)


def blocks(fmt: str, g: int | None, seed: int) -> torch.Tensor:
    """[n, block bytes] uint8: random valid blocks, random bytes and the byte-extreme variants."""
    gen = torch.Generator().manual_seed(seed)
    elems, nbytes = format_table.spec(fmt).block_geometry(g or 0)
    n_valid = 64
    valid = uqr_formats.get(fmt).random_blocks(n_valid, elems, gen, g or 0).view(n_valid, nbytes)
    rand = torch.randint(0, 256, (64, nbytes), generator=gen, dtype=torch.uint8)
    ext = valid[:1].repeat(nbytes * len(EXTREMES), 1)
    for pos in range(nbytes):
        for i, v in enumerate(EXTREMES):
            ext[pos * len(EXTREMES) + i, pos] = v
    out = torch.cat([valid, valid_for_reference(fmt, g, torch.cat([rand, ext]))])
    # whole rows, and a row count of 3 mod 4 so the fused kernel's 4-row tiles leave a 1-row tail
    per_row = K // elems
    rows = -(-out.shape[0] // per_row)
    rows += (3 - rows) % 4
    pad = rows * per_row - out.shape[0]
    return torch.cat([out, valid[torch.arange(pad) % n_valid]]) if pad else out


def valid_for_reference(fmt: str, g: int | None, cand: torch.Tensor) -> torch.Tensor:
    """The blocks of cand whose decode the reference defines: those ``validate`` accepts, plus those
    it rejects only for a non-finite scale (their rows are held to propagating it). Other invalid
    fields (var_affine's depth budget, ternary's code 3) decode by rules of their own
    (docs/formats.md, "Invalid bytes") that the fuzz tests hold."""
    module = uqr_formats.get(fmt)
    elems = format_table.spec(fmt).block_geometry(g or 0)[0]
    keep = []
    for i in range(cand.shape[0]):
        block = cand[i:i + 1]
        try:
            module.validate(block, 1, elems, g or 0)
            keep.append(i)
        except ValueError:
            try:
                if not torch.isfinite(module.decode(block, 1, elems, g or 0)).all():
                    keep.append(i)
            except (RuntimeError, ValueError, IndexError):
                pass
    return cand[keep]


@pytest.mark.parametrize("fmt,g", CASES, ids=IDS)
@pytest.mark.parametrize("M", [1, 8, K])
def test_cpu_decode_matches_reference_bitwise(fmt: str, g: int | None, M: int) -> None:
    elems, _ = format_table.spec(fmt).block_geometry(g or 0)
    data = blocks(fmt, g, seed=1234)
    N = data.shape[0] // (K // elems)
    w = data.reshape(N, -1).contiguous()
    ref = uqr_formats.get(fmt).decode(w, N, K, g or 0).reshape(N, K).float()
    eye = torch.eye(K, dtype=torch.float32)
    y = torch.cat([torch.ops.uqr.gemm(eye[k0:k0 + M], w, fmt, N, K, g or 0, 0, False, "auto")
                   for k0 in range(0, K, M)])  # [K, N]: y[k, n] = W[n, k]
    got = y.t()
    finite = torch.isfinite(ref).all(dim=1)
    assert finite.sum() > N // 2, "most rows should be finite, or the test checks little"
    bad = (got[finite] != ref[finite]).nonzero()
    assert bad.numel() == 0, (
        f"{fmt} M={M}: {bad.shape[0]} weights differ, first at row/col {bad[0].tolist()}: "
        f"{got[finite][tuple(bad[0])].item()!r} vs reference {ref[finite][tuple(bad[0])].item()!r}")
    assert not torch.isfinite(got[~finite]).any(), f"{fmt} M={M}: a non-finite weight did not propagate"
