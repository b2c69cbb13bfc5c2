"""Every C++ source compiles with the flags setup.py uses, against the installed torch's headers and
against the newest torch that installs here (its headers unpacked by scripts/torch_headers.sh, which
.ci/run calls): a torch release that raises the C++ standard shows up here before a user's
`pip install` fails.

Syntax-only compiles (``-fsyntax-only``; nvcc to PTX for one target), so the check is quick.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch.utils.cpp_extension import include_paths

from build_flags import load_setup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADERS_DIR = os.path.join(ROOT, ".torch-headers")  # scripts/torch_headers.sh unpacks here
CXX = shutil.which("g++") or shutil.which("c++")
NVCC = shutil.which("nvcc") or (
    "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


SETUP = load_setup()


def _header_sets() -> list[tuple[str, list[str]]]:
    """(torch version, include dirs): the installed torch, then every unpacked newer one."""
    sets = [(torch.__version__, include_paths())]
    for version_dir in sorted(glob.glob(os.path.join(HEADERS_DIR, "*"))):
        inc = os.path.join(version_dir, "torch", "include")
        if os.path.isdir(inc):
            sets.append((os.path.basename(version_dir),
                         [inc, os.path.join(inc, "torch", "csrc", "api", "include")]))
    return sets


HEADER_SETS = _header_sets()
CPP_SOURCES = sorted(glob.glob(os.path.join(ROOT, "csrc", "*.cpp")) +
                     glob.glob(os.path.join(ROOT, "csrc", "cpu", "*.cpp")))
CUDA_HOST_SOURCES = sorted(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cpp")))
CU_SOURCES = sorted(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cu")))


def test_newest_torch_headers_present_in_ci() -> None:
    """In CI, .ci/run unpacks the newest torch's headers first: without them this check would
    silently cover only the pinned torch."""
    if os.environ.get("CI") != "true":
        pytest.skip("outside CI the newer headers are optional (bash scripts/torch_headers.sh)")
    assert len(HEADER_SETS) >= 2, f"no unpacked torch headers under {HEADERS_DIR}"


@pytest.mark.parametrize("version,dirs", HEADER_SETS, ids=[v for v, _ in HEADER_SETS])
def test_standard_follows_the_headers(version: str, dirs: list[str]) -> None:
    std = SETUP.cxx_standard(dirs)
    requires_20 = "202002L" in open(os.path.join(dirs[0], "ATen", "ATen.h")).read()
    assert std == ("c++20" if requires_20 else "c++17")
    # torch 2.14 is the first release whose headers require C++20.
    major_minor = tuple(int(p) for p in version.split("+")[0].split(".")[:2])
    assert requires_20 == (major_minor >= (2, 14)), f"torch {version}: unexpected C++ requirement"


def test_flags_carry_the_chosen_standard_once() -> None:
    """An explicit -std= turns off torch's own choice, so exactly one, the chosen one, is passed."""
    std = SETUP.cxx_standard()
    for flags in (SETUP.extra_compile_args(), SETUP.nvcc_args()):
        stds = [f for f in flags if f.startswith("-std=")]
        assert stds == [f"-std={std}"], flags


def test_a_planted_lower_standard_fails_on_newer_headers(tmp_path) -> None:
    """The check can fail: C++17 against headers that require C++20 is refused by the compiler."""
    newer = [(v, d) for v, d in HEADER_SETS if SETUP.cxx_standard(d) == "c++20"]
    if not newer or CXX is None:
        pytest.skip("no C++20-only torch headers unpacked (bash scripts/torch_headers.sh)")
    src = tmp_path / "t.cpp"
    src.write_text("#include <ATen/ATen.h>\nint main() { return 0; }\n")
    res = _compile_cxx(str(src), newer[-1][1], "c++17", cuda=False)
    assert res.returncode != 0 and "C++20" in res.stderr


def _cuda_home() -> str:
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda", os.path.dirname(os.path.dirname(NVCC))):
        if home and os.path.exists(os.path.join(home, "include", "cuda_runtime.h")):
            return home
    raise RuntimeError("CUDA headers (cuda_runtime.h) not found; set CUDA_HOME")


def _compile_cxx(source: str, dirs: list[str], std: str, cuda: bool, march: str | None = None
                 ) -> subprocess.CompletedProcess:
    flags = [f for f in SETUP.extra_compile_args(std) if f not in ("-march=native",)]
    if march is not None:
        flags.append(f"-march={march}")
    cmd = [CXX, *flags, "-fsyntax-only", "-fPIC",
           "-DTORCH_EXTENSION_NAME=_C", "-DTORCH_API_INCLUDE_EXTENSION_H",
           *[f"-I{d}" for d in dirs], f"-I{sysconfig.get_paths()['include']}",
           f"-I{os.path.join(ROOT, 'csrc', 'include')}", f"-I{os.path.join(ROOT, 'csrc')}"]
    if cuda:
        cmd += ["-DUQR_WITH_CUDA=1", f"-I{os.path.join(_cuda_home(), 'include')}"]
    return subprocess.run(cmd + [source], capture_output=True, text=True, timeout=600)


def _compile_all(sources: list[str], version: str, dirs: list[str], cuda: bool, march: str | None = None) -> None:
    std = SETUP.cxx_standard(dirs)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(lambda s: (s, _compile_cxx(s, dirs, std, cuda, march)), sources))
    failed = [f"{os.path.relpath(s, ROOT)}:\n{r.stderr[-2000:]}" for s, r in results if r.returncode]
    assert not failed, f"with torch {version} -std={std}" + (f" -march={march}" if march else "") + ":\n" + "\n".join(failed)


@pytest.mark.skipif(CXX is None, reason="no C++ compiler on PATH")
@pytest.mark.parametrize("version,dirs", HEADER_SETS, ids=[v for v, _ in HEADER_SETS])
def test_cpu_sources_compile(version: str, dirs: list[str]) -> None:
    _compile_all(CPP_SOURCES, version, dirs, cuda=False)


# setup.py builds with -march=native, so each machine compiles only its own vector branch of the
# CPU kernels: compile every x86 branch here, whatever this machine has. x86-64-v3 is AVX2 + FMA +
# F16C (Zen 2 / 3, Haswell on); sapphirerapids adds AVX-512 BW / VL / VNNI / VBMI and GFNI.
X86_LEVELS = ["x86-64-v3", "sapphirerapids"]


@pytest.mark.skipif(CXX is None, reason="no C++ compiler on PATH")
@pytest.mark.skipif(not sys.platform.startswith("linux") or os.uname().machine != "x86_64", reason="x86-64 only")
@pytest.mark.parametrize("march", X86_LEVELS)
def test_cpu_sources_compile_for_every_x86_level(march: str) -> None:
    cpu_kernels = [s for s in CPP_SOURCES if os.sep + "cpu" + os.sep in s]
    _compile_all(cpu_kernels, torch.__version__, include_paths(), cuda=False, march=march)


def _has_cuda_headers(dirs: list[str]) -> bool:
    """CPU wheels ship c10/cuda without its generated config header; CUDA wheels have it."""
    return os.path.exists(os.path.join(dirs[0], "c10", "cuda", "impl", "cuda_cmake_macros.h"))


CUDA_HEADER_SETS = [(v, d) for v, d in HEADER_SETS if _has_cuda_headers(d)]


@pytest.mark.skipif(CXX is None or NVCC is None or not CUDA_HEADER_SETS,
                    reason="needs a C++ compiler, nvcc and the headers of a CUDA build of torch")
@pytest.mark.parametrize("version,dirs", CUDA_HEADER_SETS, ids=[v for v, _ in CUDA_HEADER_SETS])
def test_cuda_host_sources_compile(version: str, dirs: list[str]) -> None:
    _compile_all(CUDA_HOST_SOURCES, version, dirs, cuda=True)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("source", CU_SOURCES, ids=[os.path.basename(s) for s in CU_SOURCES])
def test_cuda_kernels_compile_as_cxx20(tmp_path, source: str) -> None:
    """The .cu files include no torch header, but nvcc gets the same -std as the host compiler:
    they must compile as C++20 (the C++17 build is tests/test_cuda_build.py's)."""
    flags = [f for f in SETUP.nvcc_args("c++20") if f not in ("--threads", "2", "-gencode")
             and not f.startswith("arch=")]
    cmd = [NVCC, *flags, "-arch=compute_90a", "-ptx", "-I", os.path.join(ROOT, "csrc", "include"),
           source, "-o", str(tmp_path / "k.ptx")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
