"""Fuzzed block bytes straight into the kernels: whatever a block holds, no read leaves it.

The operator validates shapes, not block contents (``QTensor.from_bytes`` does that), so
``torch.ops.uqr.gemm`` can be handed any bytes; the decoders must stay inside each block anyway
(docs/formats.md, "Invalid bytes"). For every format of the table: random bytes, valid blocks with
bit flips, all-0x00 / all-0xFF blocks and every byte of a valid block set to field extremes, run

* on every CPU path of the format through an AddressSanitizer build of the CPU kernels, in a child
  process (tests/asan_cpu.py): each call's w is its own allocation with the fuzzed block last, so
  a read past it is a heap-buffer-overflow report;
* through the Metal emulator's ASan build (``run_sanitized``), fuzzed rows with a crafted last row;
* on CUDA (skipped without a GPU), meant to run under compute-sanitizer:
  ``compute-sanitizer --tool memcheck python3 -m pytest -q tests/test_fuzz_blocks.py -k cuda``.
"""
from __future__ import annotations

import pytest
import torch

import torch_uqr as uqr
from torch_uqr.formats import table as format_table
from gemm_helpers import FORMAT_CASES, FORMAT_IDS, uqr_formats

import asan_cpu

# sanitizer builds and fuzzing: minutes on the 2-core CI machine (.ci/run runs them once, not for the newest torch too)
pytestmark = pytest.mark.slow

EXTREMES = (0x00, 0x07, 0x80, 0xFF)  # nothing, low (depth, code) bits all set, sign bit, everything


def layout(fmt: str, g: int | None) -> tuple[int, int]:
    """(elements, bytes) of one block of fmt at group size g."""
    return format_table.spec(fmt).block_geometry(g or 0)


def fuzzed_blocks(fmt: str, g: int | None, seed: int, n_random: int = 24) -> list[bytes]:
    """Blocks a kernel must survive: random bytes, bit-flipped valid blocks, all-0x00 / all-0xFF,
    a valid block with its header bytes all 0xFF, and each byte of a valid block set to each of
    EXTREMES (so every field, whatever it indexes or shifts by, takes its extreme values)."""
    gen = torch.Generator().manual_seed(seed)
    elems, nbytes = layout(fmt, g)
    valid = uqr_formats.get(fmt).random_blocks(n_random, elems, gen, g or 0).view(n_random, nbytes)
    out = [bytes(torch.randint(0, 256, (nbytes,), generator=gen, dtype=torch.uint8).tolist())
           for _ in range(n_random)]
    for i in range(n_random):
        b = bytearray(valid[i].tolist())
        for bit in torch.randint(0, 8 * nbytes, (1 + i % 8,), generator=gen).tolist():
            b[bit >> 3] ^= 1 << (bit & 7)
        out.append(bytes(b))
    out += [bytes(nbytes), bytes([0xFF]) * nbytes]
    base = bytearray(valid[0].tolist())
    header = bytearray(base)
    header[:min(nbytes, 48)] = bytes([0xFF]) * min(nbytes, 48)
    out.append(bytes(header))
    for pos in range(nbytes):
        for v in EXTREMES:
            b = bytearray(base)
            b[pos] = v
            out.append(bytes(b))
    return out


def cpu_cases(fmt: str, g: int | None, seed: int, n_random: int = 8, n_extremes: int = 40) -> list[asan_cpu.Case]:
    """Fuzzed blocks (the random, bit-flipped and all-0x00 / 0xFF ones, and an even sample of
    ``n_extremes`` field-extreme ones, which every byte position of the header is part of for the
    formats with a header up to that size), each the last of a 2 x 2-block weight, on every CPU
    path, taking turns at M = 1 (the small-M kernels) and M = 17 (panel; bf16: the half-precision
    library path). About 60 blocks a format keep the ASan child within seconds."""
    elems, nbytes = layout(fmt, g)
    gen = torch.Generator().manual_seed(seed + 1)
    lead = bytes(uqr_formats.get(fmt).random_blocks(2, 2 * elems, gen, g or 0).flatten().tolist())[:-nbytes]
    blocks = fuzzed_blocks(fmt, g, seed, n_random)
    head, extremes = blocks[:2 * n_random + 3], blocks[2 * n_random + 3:]
    blocks = head + extremes[::max(1, len(extremes) // n_extremes)]
    combos = ((1, "float32"), (17, "float32"), (17, "bfloat16"))
    cases = []
    for i, blk in enumerate(blocks):
        for path in format_table.spec(fmt).paths("cpu"):
            M, dtype = combos[i % len(combos)]
            cases.append(asan_cpu.Case(fmt, 2, 2 * elems, g or 0, path, M, lead + blk, dtype))
    return cases


@pytest.fixture(scope="module")
def asan_lib():
    if asan_cpu.libasan() is None:
        pytest.skip("no AddressSanitizer runtime next to the C++ compiler")
    return asan_cpu.build()


@pytest.mark.parametrize("fmt,group_size", FORMAT_CASES, ids=FORMAT_IDS)
def test_cpu_paths_stay_inside_fuzzed_blocks(asan_lib, fmt: str, group_size: int | None) -> None:
    cases = cpu_cases(fmt, group_size, seed=32)
    r = asan_cpu.run(cases, asan_lib)
    assert "AddressSanitizer" not in r.stderr and r.returncode == 0, r.stderr[-4000:]
    assert f"ok {len(cases)} calls" in r.stdout


def test_asan_harness_reports_a_read_past_a_tensor(asan_lib) -> None:
    """The harness catches what it claims to: in the child, a read one byte past a tensor's
    allocation (the way a decoder would overrun the last block of w) is reported and fails it."""
    case = asan_cpu.Case("q8_0", 1, 32, 0, "auto", 1, bytes(34))
    assert asan_cpu.run([case], asan_lib).returncode == 0
    r = asan_cpu.run([case], asan_lib, selftest=True)
    assert r.returncode != 0 and "AddressSanitizer: heap-buffer-overflow" in r.stderr, r.stderr[-3000:]


@pytest.mark.parametrize("fmt,group_size", FORMAT_CASES, ids=FORMAT_IDS)
def test_metal_emulator_stays_inside_fuzzed_blocks(fmt: str, group_size: int | None) -> None:
    from torch_uqr.backends.metal.sanitized import run_sanitized
    elems, nbytes = layout(fmt, group_size)
    blocks = fuzzed_blocks(fmt, group_size, seed=33, n_random=4)
    # The emulator's w is one allocation: a crafted block is the last row (a read past it is
    # reported), a sample of the others fills the rows before it (faults, reads far outside w).
    body = blocks[:11] + blocks[11::max(1, len(blocks) // 24)]
    for last in (bytes([0xFF]) * nbytes, blocks[10]):  # all 0xFF; the header all 0xFF
        rows = body + [last]
        w = torch.tensor(list(b"".join(rows)), dtype=torch.uint8).view(len(rows), nbytes)
        for path in format_table.spec(fmt).paths("metal"):
            for M in (1, 33):
                x = torch.randn(M, elems, dtype=torch.float16)
                r = run_sanitized("asan", x, w, fmt, len(rows), elems, group_size or 0, path=path)
                assert r.returncode == 0 and "AddressSanitizer" not in r.stderr, \
                    f"{fmt} {path} M={M}: {r.stderr[-3000:]}"


def test_metal_fuzz_catches_an_unclamped_decoder() -> None:
    """The fuzz catches what it claims to: with var_affine's depth and start clamps edited out of
    formats.h (in memory), a block whose modes say 7 makes the emulator read past w."""
    from torch_uqr.backends.metal.sanitized import run_sanitized
    from torch_uqr.backends.metal.source import REPO_ROOT
    formats_h = REPO_ROOT / "csrc" / "include" / "uqr" / "formats.h"
    text = formats_h.read_text()
    clamps = ("return b < 3u ? 3u : (b > 5u ? 5u : b);", "return bytes_before < last ? bytes_before : last;")
    for line in clamps:
        assert text.count(line) == 1, f"formats.h no longer contains exactly one {line!r}"
    unclamped = text.replace(clamps[0], "return b;").replace(clamps[1], "return bytes_before;")
    elems, nbytes = layout("var_affine", None)
    blk = bytearray(fuzzed_blocks("var_affine", None, seed=35, n_random=1)[1])
    blk[20:28] = bytes([7]) * 8
    w = torch.tensor(list(blk), dtype=torch.uint8).view(1, nbytes)
    x = torch.randn(1, elems, dtype=torch.float16)
    r = run_sanitized("asan", x, w, "var_affine", 1, elems, 0, path="auto", overrides={formats_h: unclamped})
    assert r.returncode != 0 and "AddressSanitizer" in r.stderr, r.stderr[-3000:]
    fixed = run_sanitized("asan", x, w, "var_affine", 1, elems, 0, path="auto")
    assert fixed.returncode == 0 and "AddressSanitizer" not in fixed.stderr, fixed.stderr[-3000:]


def _cuda_ready() -> bool:
    return torch.cuda.is_available() and uqr.ops.op_available()


@pytest.mark.skipif(not _cuda_ready(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt,group_size", FORMAT_CASES, ids=FORMAT_IDS)
def test_cuda_kernels_stay_inside_fuzzed_blocks(fmt: str, group_size: int | None) -> None:
    """Every CUDA path at several M on fuzzed rows (the crafted block last); under compute-sanitizer
    an out-of-bounds read is reported and fails the run, without it this still catches faults."""
    elems, nbytes = layout(fmt, group_size)
    blocks = fuzzed_blocks(fmt, group_size, seed=34, n_random=16)
    K = 4 * elems
    while len(blocks) % 4:
        blocks.append(blocks[-1])
    blocks.append(bytes([0xFF]) * nbytes)
    while len(blocks) % 4:
        blocks.insert(0, blocks[0])
    w = torch.tensor(list(b"".join(blocks)), dtype=torch.uint8).view(-1, 4 * nbytes).cuda()
    N = w.shape[0]
    for path in format_table.spec(fmt).paths("cuda"):
        for M in (1, 5, 17, 130):
            x = torch.randn(M, K, device="cuda", dtype=torch.float16)
            torch.ops.uqr.gemm(x, w, fmt, N, K, group_size or 0, 0, False, path)
    torch.cuda.synchronize()
