"""The emulated kernels under AddressSanitizer and ThreadSanitizer (g++ -fsanitize builds).

Each run compiles one format's kernels into a sanitizer executable (a few seconds, cached) and runs
one small gemm in a child process. The negative tests edit the kernel source in memory (the tree is
not touched) to prove the harness catches what it claims to: an out-of-bounds store under ASan, and
a missing threadgroup_barrier under TSan.
"""
from __future__ import annotations

import pytest
import torch

from torch_uqr.backends.metal.sanitized import SanitizedRun, run_sanitized
from torch_uqr.backends.metal.source import REPO_ROOT
from gemm_helpers import assert_close, randn, reference, weights

# sanitizer builds of the emulator: minutes on the 2-core CI machine (.ci/run runs them once, not for the newest torch too)
pytestmark = pytest.mark.slow

KERNELS = REPO_ROOT / "shaders" / "uqr_gemm_kernels.h"
LAUNCH = REPO_ROOT / "csrc" / "mps" / "launch.h"
TG_MEMORY = "out.threadgroup_bytes = staged > out_tile ? staged : out_tile;"
STAGED_BARRIER = "    threadgroup_barrier(mem_flags::mem_threadgroup);  // UQR_BARRIER_TILES_STAGED\n"
BOUNDED_STORE = "if (m < p.M && n < p.N) y[uqr_y_offset(p, b, m, n)] = T(sh_C[i]);"
N, K = 70, 256


def edited(path, old: str, new: str) -> dict:
    text = path.read_text()
    assert text.count(old) == 1, f"{path.name} no longer contains exactly one {old!r}"
    return {path: text.replace(old, new)}


def run(variant: str, fmt: str, M: int, path: str, in_heads: bool = False, overrides: dict | None = None
        ) -> tuple[SanitizedRun, torch.Tensor]:
    qt, W = weights(fmt, None, N, K)
    x = randn(2, M, 2, K // 2, dtype=torch.float16).transpose(1, 2) if in_heads else randn(M, K, dtype=torch.float16)
    r = run_sanitized(variant, x, qt.data, fmt, N, K, 0, 0, in_heads, path, overrides=overrides)
    if "FATAL: ThreadSanitizer" in r.stderr:
        pytest.skip(f"ThreadSanitizer cannot run in this environment: {r.stderr.strip()[:300]}")
    return r, reference(x, W, 0, in_heads)


@pytest.mark.parametrize("fmt,path,M,in_heads", [("q4_k", "mma", 37, True), ("q4_k", "auto", 3, True),
                                                 ("ternary", "vec", 11, False)])
def test_asan_clean(fmt: str, path: str, M: int, in_heads: bool) -> None:
    r, ref = run("asan", fmt, M, path, in_heads)
    assert r.returncode == 0 and "AddressSanitizer" not in r.stderr, r.stderr[-3000:]
    assert_close(r.y, ref, torch.float16, f"asan {fmt} {path}")


def test_asan_catches_an_out_of_bounds_store() -> None:
    """Without the row bound, a 5-row y gets the whole 32-row tile written into it."""
    r, _ = run("asan", "q4_0", 5, "mma",
               overrides=edited(KERNELS, BOUNDED_STORE, "if (n < p.N) y[uqr_y_offset(p, b, m, n)] = T(sh_C[i]);"))
    assert r.returncode != 0
    assert "AddressSanitizer: heap-buffer-overflow" in r.stderr, r.stderr[-3000:]


def test_asan_catches_a_threadgroup_memory_overrun() -> None:
    """Size threadgroup memory for the fp16 staging tiles only (6 KiB): the 8 KiB fp32 output tile
    that aliases them then runs past the end."""
    r, _ = run("asan", "q4_0", 5, "mma", overrides=edited(LAUNCH, TG_MEMORY, "out.threadgroup_bytes = staged;"))
    assert r.returncode != 0
    assert "AddressSanitizer: heap-buffer-overflow" in r.stderr, r.stderr[-3000:]


@pytest.mark.parametrize("path,M", [("mma", 37), ("auto", 3)])
def test_tsan_clean_intact_kernels(path: str, M: int) -> None:
    r, ref = run("tsan", "q4_0", M, path)
    assert r.returncode == 0 and "ThreadSanitizer" not in r.stderr, r.stderr[-3000:]
    assert_close(r.y, ref, torch.float16, f"tsan q4_0 {path}")


def test_tsan_reports_the_race_of_a_removed_barrier() -> None:
    """Drop the barrier between staging the tiles and the MMA reading them: other simdgroups'
    writes to sh_A / sh_B now race with the reads, and TSan must say so."""
    r, _ = run("tsan", "q4_0", 37, "mma", overrides=edited(KERNELS, STAGED_BARRIER, ""))
    assert "WARNING: ThreadSanitizer: data race" in r.stderr, r.stderr[-3000:]
    assert "uqr_gemm_kernels.h" in r.stderr or "uqr_mma.h" in r.stderr or "uqr_loaders.h" in r.stderr
    assert r.returncode != 0
