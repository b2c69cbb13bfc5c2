"""Runs one emulated gemm under AddressSanitizer or ThreadSanitizer, in a child process.

The sanitizer builds (``build.build("asan" | "tsan")``) are executables: this module writes the
request (params, x's memory span, w, the NaN-filled y) to a file, runs the executable, and reads y
back. Each buffer is a separate allocation of exactly its size in the child, so ASan reports any
device access outside the data the kernel was given; threadgroup memory is allocated at exactly the
length launch.h asks for, so ASan reports overruns of it too. TSan reports unsynchronised accesses
between emulated threads, e.g. a missing threadgroup_barrier.
"""
from __future__ import annotations

import functools
import os
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .build import build
from .runner import prepare

__all__ = ["SanitizedRun", "run_sanitized"]


@dataclass
class SanitizedRun:
    """Outcome of one sanitized run: y (None if the child failed), its exit code and stderr."""

    y: torch.Tensor | None
    returncode: int
    stderr: str


@functools.lru_cache(maxsize=1)
def _can_disable_aslr() -> bool:
    """Whether `setarch -R` works here (containers may forbid the personality call)."""
    try:
        return subprocess.run(["setarch", os.uname().machine, "-R", "true"],
                              capture_output=True).returncode == 0
    except OSError:
        return False


def _span_bytes(t: torch.Tensor) -> bytes:
    """The bytes from t's first element to its last reachable one (strides are non-negative)."""
    if t.numel() == 0:
        return b""
    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    flat = torch.as_strided(t, (span,), (1,), t.storage_offset())
    return flat.contiguous().view(torch.uint8).numpy().tobytes()


def run_sanitized(variant: str, x: torch.Tensor, w: torch.Tensor, fmt: str, N: int, K: int,
                  group_size: int = 0, out_heads: int = 0, in_heads: bool = False, path: str = "auto",
                  overrides: dict[Path, str] | None = None, timeout: float = 300) -> SanitizedRun:
    """Run the op's arguments through the ``variant`` ("asan" or "tsan") emulator build.

    Only ``fmt``'s kernels are compiled into the build; ``overrides`` maps source files to edited
    text (e.g. a kernel with a barrier removed).
    """
    if variant not in ("asan", "tsan"):
        raise ValueError(f"variant: expected 'asan' or 'tsan', got {variant!r}")
    exe = build(variant, overrides, only_formats=[fmt])
    req = prepare(x, w, fmt, N, K, group_size, out_heads, in_heads, path)
    x_bytes = _span_bytes(req.x)
    w_bytes = req.w.numpy().tobytes()
    y_bytes = req.y.view(torch.uint8).numpy().tobytes()
    env = dict(os.environ)
    env.setdefault("TSAN_OPTIONS", "exitcode=66 history_size=2")
    env.setdefault("ASAN_OPTIONS", "detect_leaks=0")
    with tempfile.TemporaryDirectory(prefix="uqr_emu_") as tmp:
        request, output = Path(tmp) / "request.bin", Path(tmp) / "y.bin"
        with open(request, "wb") as f:
            f.write(struct.pack(f"<i{len(req.params)}q", len(req.params), *req.params))
            f.write(struct.pack("<ii", req.dtype, req.path))
            f.write(struct.pack("<qqq", len(x_bytes), len(w_bytes), len(y_bytes)))
            f.write(x_bytes + w_bytes + y_bytes)
        # ThreadSanitizer needs its fixed memory layout; some kernels' address-space randomisation
        # breaks it, and `setarch -R` turns randomisation off for the child only.
        cmd = [str(exe), str(request), str(output)]
        if variant == "tsan" and _can_disable_aslr():
            cmd = ["setarch", os.uname().machine, "-R", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        y = None
        if output.exists():
            raw = bytearray(output.read_bytes())
            y = torch.frombuffer(raw, dtype=req.y.dtype).reshape(req.y.shape).clone()
    return SanitizedRun(y, proc.returncode, proc.stderr)
