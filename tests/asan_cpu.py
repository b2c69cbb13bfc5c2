"""The CPU kernels built with AddressSanitizer, and a child process that runs gemm calls through them.

``build()`` compiles the operator's CPU sources (csrc/ops.cpp, csrc/cpu/*.cpp: what setup.py
compiles on a machine without CUDA or Metal) with ``-fsanitize=address`` into a shared library,
cached under ``$UQR_CACHE_DIR`` or ``~/.cache/torch_uqr`` by a hash of the sources, headers, flags and
compiler. ``run(cases)`` hands a list of gemm calls to ``python3 tests/asan_cpu.py``, which starts
with libasan preloaded (an uninstrumented Python cannot load it later), loads that library in
place of torch_uqr._C (the child never imports torch_uqr: both register the ``uqr`` op library) and
makes every call. ASan aborts the child at the first invalid access and says where.

Each case's weight tensor is its own allocation of exactly its bytes, so a read past the last block
of ``w`` lands in ASan's redzone; the decoders' stack buffers are instrumented too.
"""
from __future__ import annotations

import glob
import hashlib
import os
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address", "-fPIC", "-march=native",
         "-fopenmp", "-fvisibility=hidden", "-w"]


@dataclass
class Case:
    """One ``torch.ops.uqr.gemm`` call: x is random [M, K] of ``dtype``, w the given bytes [N, row_bytes]."""

    fmt: str
    N: int
    K: int
    group_size: int
    path: str
    M: int
    w: bytes
    dtype: str = "float32"


def _sources(root: Path) -> list[Path]:
    return sorted(Path(p) for p in glob.glob(str(root / "csrc" / "*.cpp")) + glob.glob(str(root / "csrc" / "cpu" / "*.cpp")))


def _compiler_version() -> str:
    return subprocess.run(["c++", "--version"], capture_output=True, text=True).stdout


def libasan() -> str | None:
    """Path of the compiler's ASan runtime, or None where there is none."""
    out = subprocess.run(["c++", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    return out if out and os.path.isabs(out) and os.path.exists(out) else None


def build(root: Path = ROOT) -> Path:
    """The ASan build of the CPU operator library of the source tree ``root`` (this checkout by
    default); compiled on first use (a few minutes), then cached."""
    import torch
    from torch.utils.cpp_extension import include_paths, library_paths

    sys.path.insert(0, str(ROOT / "tests"))
    from build_flags import load_setup
    std = load_setup().cxx_standard()
    headers = sorted(glob.glob(str(root / "csrc" / "**" / "*.h"), recursive=True))
    key = hashlib.sha256()
    for p in [*map(str, _sources(root)), *headers]:
        key.update(p.encode() + Path(p).read_bytes())
    key.update(" ".join(FLAGS + [std, torch.__version__, _compiler_version()]).encode())
    base = os.environ.get("UQR_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "torch_uqr")
    out_dir = Path(base) / "cpu_asan" / key.hexdigest()[:16]
    lib = out_dir / "uqr_asan.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    incs = [f"-I{root / 'csrc' / 'include'}", f"-I{sysconfig.get_paths()['include']}"] + \
        [f"-I{p}" for p in include_paths()]
    defines = ["-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=uqr_asan"]

    def compile_one(src: Path) -> Path:
        obj = out_dir / (src.stem + ".o")
        if obj.exists():  # objects appear only complete (renamed into place), so a rerun resumes
            return obj
        tmp = out_dir / (src.stem + ".o.tmp")
        cmd = ["c++", f"-std={std}", *FLAGS, *defines, *incs, "-c", str(src), "-o", str(tmp)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"ASan build of {src.name} failed:\n{r.stderr[-4000:]}")
        tmp.rename(obj)
        return obj

    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        objs = list(pool.map(compile_one, _sources(root)))
    tmp = out_dir / "uqr_asan.so.tmp"
    libs = [f"-L{p}" for p in library_paths()] + ["-lc10", "-ltorch_cpu", "-ltorch"]
    r = subprocess.run(["c++", "-shared", "-fsanitize=address", "-fopenmp", *map(str, objs), "-o", str(tmp), *libs],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ASan link failed:\n{r.stderr[-4000:]}")
    tmp.rename(lib)
    return lib


def run(cases: list[Case], lib: Path | None = None, timeout: float = 600,
        selftest: bool = False) -> subprocess.CompletedProcess:
    """Make every call of ``cases`` in a child under ASan; returns the finished child (returncode 0
    and no report on stderr when every call stayed in bounds). ``selftest``: the child first reads
    one byte past a tensor's allocation on purpose, which ASan must report."""
    import torch
    lib = lib or build()
    runtime = libasan()
    if runtime is None:
        raise RuntimeError("no libasan.so next to the C++ compiler")
    with tempfile.TemporaryDirectory(prefix="uqr_asan_") as tmp:
        request = Path(tmp) / "cases.pt"
        torch.save([c.__dict__ for c in cases], request)
        env = dict(os.environ)
        env["LD_PRELOAD"] = runtime
        env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=0:halt_on_error=1"
        argv = [sys.executable, __file__, str(lib), str(request)] + (["--selftest"] if selftest else [])
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def _child(lib: str, request: str, selftest: bool) -> int:
    import ctypes

    import torch
    torch.ops.load_library(lib)
    torch.set_num_threads(1)  # thousands of tiny calls: no thread pool wake-ups (and no spinning on a shared machine)
    if selftest:  # libc's memcpy is intercepted: reading 35 bytes of a 34-byte tensor is a report
        t = torch.zeros(34, dtype=torch.uint8)
        ctypes.string_at(t.data_ptr(), 35)
    gen = torch.Generator().manual_seed(0)
    cases = torch.load(request)
    for i, c in enumerate(cases):
        row_bytes = len(c["w"]) // c["N"]
        w = torch.empty(c["N"], row_bytes, dtype=torch.uint8)  # exactly its bytes: the redzone follows
        w.copy_(torch.frombuffer(bytearray(c["w"]), dtype=torch.uint8).view(c["N"], row_bytes))
        x = torch.randn(c["M"], c["K"], generator=gen).to(getattr(torch, c["dtype"]))
        torch.ops.uqr.gemm(x, w, c["fmt"], c["N"], c["K"], c["group_size"], 0, False, c["path"])
    print(f"ok {len(cases)} calls")
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], sys.argv[2], "--selftest" in sys.argv[3:]))
