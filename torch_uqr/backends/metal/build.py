"""Compiles the real shader source, as C++ against the Metal shim, into the emulator binaries.

Three variants, cached by a hash of everything that goes into them (source text, shim, flags,
compiler version) under ``$UQR_CACHE_DIR`` or ``~/.cache/torch_uqr/backends/metal``:

* ``"lib"``: a shared library the Python runner calls through ctypes (optimised);
* ``"asan"`` / ``"tsan"``: stand-alone executables built with AddressSanitizer / ThreadSanitizer.
  They run as their own process because neither sanitizer can be loaded into a running Python.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterable

from ...formats import table as format_table
from .source import LAUNCH_HEADER, SHADER_MAIN, flatten, strip_attributes

__all__ = ["VARIANTS", "cache_root", "translation_unit", "build"]

HERE = Path(__file__).resolve().parent
SHIM = HERE / "shim.h"
DRIVER = HERE / "driver.cpp"

_COMMON = ["-std=c++20", "-pthread", "-w"]
VARIANTS: dict[str, list[str]] = {
    "lib": ["-O2", "-fPIC", "-shared"],
    "asan": ["-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer", "-DUQR_EMU_MAIN"],
    "tsan": ["-O1", "-g", "-fsanitize=thread", "-DUQR_EMU_MAIN"],
}


def cache_root() -> Path:
    """Where built emulators are kept (``$UQR_CACHE_DIR`` overrides the default)."""
    base = os.environ.get("UQR_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "torch_uqr")
    return Path(base) / "metal_emu"


_ALL_FORMATS_LINE = "UQR_FORMAT_LIST(UQR_FORMAT_KERNELS)"


def translation_unit(overrides: dict[Path, str] | None = None, only_formats: Iterable[str] | None = None) -> str:
    """Shader library + launch planner + driver as one C++ file (attributes stripped).

    ``only_formats`` keeps just those formats' instantiation lines of uqr_gemm.metal: the sanitizer
    builds compile one format in a fraction of the time of all eight.
    """
    if not SHADER_MAIN.is_file() or not LAUNCH_HEADER.is_file():
        raise RuntimeError(f"metal-emu compiles the shaders from a source checkout; {SHADER_MAIN} or "
                           f"{LAUNCH_HEADER} is missing (install with `pip install -e .` from the repository)")
    body = strip_attributes(flatten([SHADER_MAIN, LAUNCH_HEADER], overrides=overrides))
    if only_formats is not None:
        if body.count(_ALL_FORMATS_LINE) != 1:
            raise RuntimeError(f"uqr_gemm.metal: expected one '{_ALL_FORMATS_LINE}' line to restrict")
        keep = [format_table.spec(f) for f in only_formats]  # raises on an unknown name
        body = body.replace(_ALL_FORMATS_LINE, "\n".join(
            f'UQR_FORMAT_KERNELS(UQR_{f.name.upper()}, "{f.name}")' for f in keep))
    return body + f'#line 1 "{DRIVER.name}"\n' + DRIVER.read_text()


@functools.lru_cache(maxsize=None)
def _compiler() -> tuple[str, str]:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise RuntimeError("metal-emu needs a C++20 compiler (g++ >= 12); none found on PATH")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    return cxx, version


def build(variant: str = "lib", overrides: dict[Path, str] | None = None,
          only_formats: Iterable[str] | None = None) -> Path:
    """Path of the built ``variant`` (compiling it on first use).

    ``overrides`` replaces source files' text (see ``source.flatten``); ``only_formats`` restricts
    the kernels compiled (see ``translation_unit``).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant: expected one of {sorted(VARIANTS)}, got {variant!r}")
    cxx, version = _compiler()
    tu = translation_unit(overrides, only_formats)
    shim = SHIM.read_text()
    flags = _COMMON + VARIANTS[variant]
    key = hashlib.sha256("\0".join([tu, shim, " ".join(flags), version]).encode()).hexdigest()[:16]
    out_dir = cache_root() / f"{variant}-{key}"
    target = out_dir / ("libuqr_metal_emu.so" if variant == "lib" else "uqr_metal_emu")
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    # One builder at a time per variant: parallel test processes wait for the first one's result.
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return target
        (out_dir / "metal_stdlib").write_text(f'#include "{SHIM}"\n')
        src = out_dir / "emu_tu.cpp"
        src.write_text(tu)
        tmp = target.with_suffix(".tmp")
        cmd = [cxx, *flags, "-I", str(out_dir), str(src), "-o", str(tmp)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"metal-emu: compiling the shaders failed ({' '.join(cmd)}):\n"
                               f"{proc.stderr[-6000:]}")
        os.replace(tmp, target)
    return target
