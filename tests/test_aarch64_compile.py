"""The CPU kernels' NEON code compiles for aarch64 (clang cross-compile; nothing runs it here).

cpu_simd.h picks a NEON vector type under aarch64 (four float32x4_t per 16 lanes) and the block
decoders are written on it. No aarch64 machine or emulator is assumed, so this is a compile check:
``tests/aarch64/kernels_check.cpp`` (every decoder, the panel decode in fp32 / fp16 / bf16 and a
fused decode-and-dot loop; no ATen) is compiled to an aarch64 object with the host's C++ headers,
and the object must contain NEON FMAs; then every CPU source (``csrc/cpu/*.cpp``, with ATen) is
syntax-checked for aarch64 with torch's headers. The host headers are x86-64 glibc's, so two of their
target-dependent files are shimmed (the word size and the ``stubs`` include); that is enough for
torch's header-only c10 types and the kernels, and says nothing about running on ARM.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor

import pytest
from torch.utils.cpp_extension import include_paths

from build_flags import load_setup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLANG = shutil.which("clang++")
CHECK_TU = os.path.join(ROOT, "tests", "aarch64", "kernels_check.cpp")
CPU_SOURCES = sorted(glob.glob(os.path.join(ROOT, "csrc", "cpu", "*.cpp")))
TARGET = ["--target=aarch64-linux-gnu", "-march=armv8.2-a+dotprod+fp16"]


def _host_cxx_dirs() -> list[str]:
    """libstdc++'s headers and glibc's (the host's, target-neutral apart from the shimmed files)."""
    out = subprocess.run(["g++", "-dumpversion"], capture_output=True, text=True)
    ver = out.stdout.strip().split(".")[0] if out.returncode == 0 else ""
    dirs = [f"/usr/include/c++/{ver}", f"/usr/include/x86_64-linux-gnu/c++/{ver}", "/usr/include/x86_64-linux-gnu",
            "/usr/include"]
    return [d for d in dirs if os.path.isdir(d)]


def _shim(tmp_path) -> str:
    shim = tmp_path / "shim"
    (shim / "bits").mkdir(parents=True, exist_ok=True)
    (shim / "gnu").mkdir(exist_ok=True)
    (shim / "bits" / "wordsize.h").write_text(
        "#define __WORDSIZE 64\n#define __WORDSIZE_TIME64_COMPAT32 1\n#define __SYSCALL_WORDSIZE 64\n")
    (shim / "gnu" / "stubs-32.h").write_text("")
    return str(shim)


def _compile(tmp_path, source: str, extra: list[str]) -> subprocess.CompletedProcess:
    # The standard setup.py builds with: torch 2.14's headers need C++20.
    flags = TARGET + [f"-std={load_setup().cxx_standard()}", "-nostdinc++", "-isystem", _shim(tmp_path)]
    for d in _host_cxx_dirs():
        flags += ["-isystem", d]
    for d in include_paths():
        flags += ["-isystem", d]
    flags += ["-I", os.path.join(ROOT, "csrc", "include"), "-I", os.path.join(ROOT, "csrc"), "-w"]
    return subprocess.run([CLANG, *flags, *extra, source], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def clang_aarch64(tmp_path_factory):
    if CLANG is None:
        pytest.skip("clang++ not found (needed to cross-compile the NEON kernels)")
    if not _host_cxx_dirs():
        pytest.skip("no host libstdc++ headers under /usr/include")
    probe = tmp_path_factory.mktemp("probe")
    src = probe / "p.cpp"
    src.write_text("#include <arm_neon.h>\nfloat32x4_t f(float32x4_t a) { return vaddq_f32(a, a); }\n")
    r = _compile(probe, str(src), ["-c", "-o", str(probe / "p.o")])
    if r.returncode != 0:
        pytest.skip(f"this clang cannot target aarch64: {r.stderr[-300:]}")
    return CLANG


def test_neon_kernels_compile(clang_aarch64, tmp_path) -> None:
    obj = tmp_path / "kernels_check.o"
    r = _compile(tmp_path, CHECK_TU, ["-O2", "-c", "-o", str(obj)])
    assert r.returncode == 0, r.stderr[-4000:]
    objdump = shutil.which("llvm-objdump") or shutil.which("llvm-objdump-14") or shutil.which("llvm-objdump-15")
    if objdump is None:
        return
    text = subprocess.run([objdump, "-d", str(obj)], capture_output=True, text=True).stdout
    # The fused loop and the decoders run on NEON vectors: fmla on .4s lanes.
    assert "fmla" in text and ".4s" in text, "no NEON FMAs in the aarch64 object"


def test_the_check_can_fail(clang_aarch64, tmp_path) -> None:
    """A NEON-only error is caught: the same TU with a misuse of a NEON intrinsic does not compile."""
    bad = tmp_path / "bad.cpp"
    bad.write_text(open(CHECK_TU).read() + "\nfloat32x4_t uqr_bad(float32x4_t a) { return vaddq_f32(a); }\n")
    r = _compile(tmp_path, str(bad), ["-fsyntax-only"])
    assert r.returncode != 0


def test_cpu_sources_parse_for_aarch64(clang_aarch64, tmp_path) -> None:
    """The whole CPU backend (ATen glue included) parses under the aarch64 target."""
    extra = ["-fsyntax-only", "-isystem", sysconfig.get_paths()["include"]]
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        results = list(pool.map(lambda src: (src, _compile(tmp_path, src, extra)), CPU_SOURCES))
    failed = [(os.path.basename(src), r.stderr[-2000:]) for src, r in results if r.returncode != 0]
    assert not failed, failed
