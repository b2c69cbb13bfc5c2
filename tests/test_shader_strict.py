"""Strict checks of the Metal shader source (torch_uqr/backends/metal/strict.py) and the shared launch
limits (shaders/uqr_limits.h).

Each check passes on the real source and is shown to fail on an error planted in an in-memory copy
(the tree is not touched): a pointer passed across address spaces, each construct the lint forbids,
mismatched argument bindings between the kernels, the Objective-C++ host and the emulator, and tile
constants that break Apple's launch limits, caught in all three places that read them. Needs clang
(Debian/Ubuntu package `clang`); the emulator cases also need g++.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from torch_uqr.backends.metal import strict
from torch_uqr.backends.metal.source import REPO_ROOT

pytestmark = pytest.mark.skipif(strict.clang() is None,
                                reason="clang is not installed (apt-get install -y clang): strict shader checks skipped")

SHADERS = REPO_ROOT / "shaders"
KERNELS = SHADERS / "uqr_gemm_kernels.h"
LOADERS = SHADERS / "uqr_loaders.h"
MMA = SHADERS / "uqr_mma.h"
TILES = SHADERS / "uqr_tiles.h"
LAUNCH = REPO_ROOT / "csrc" / "mps" / "launch.h"


def edited(path: Path, old: str, new: str, count: int = 1) -> dict[Path, str]:
    """{path: its text with the first `count` occurrences of `old` replaced} (old must occur)."""
    text = path.read_text()
    assert old in text, f"{path.name} no longer contains {old!r}"
    return {path: text.replace(old, new, count)}


# --- Strict compile: distinct address spaces --------------------------------------------------

@pytest.mark.parametrize("metal_version", strict.METAL_VERSIONS)
def test_real_source_compiles_with_distinct_address_spaces(metal_version: int) -> None:
    proc = strict.strict_compile(metal_version=metal_version)
    assert proc.returncode == 0, proc.stderr[-4000:]


ADDRESS_SPACE_PLANTS = {
    # The loader now expects device memory for the tile; the kernel passes threadgroup memory.
    "threadgroup-to-device": (LOADERS, "threadgroup S* sh_A, uint tiitg", "device S* sh_A, uint tiitg"),
    # The params helper takes a thread reference; the kernel's params are in constant memory.
    "constant-to-thread": (LOADERS, "inline void uqr_stage_x_tile(device const T* x, constant uqr_gemm_params& p",
                           "inline void uqr_stage_x_tile(device const T* x, thread const uqr_gemm_params& p"),
    # The MMA core reads its fragments from device memory instead of the staged tiles.
    "fragment-load-from-device": (MMA, "void step(const threadgroup S* sh_A, const threadgroup S* sh_B)",
                                  "void step(const device S* sh_A, const device S* sh_B)"),
}


@pytest.mark.parametrize("plant", sorted(ADDRESS_SPACE_PLANTS))
def test_strict_compile_rejects_a_cross_address_space_pointer(plant: str) -> None:
    path, old, new = ADDRESS_SPACE_PLANTS[plant]
    proc = strict.strict_compile(edited(path, old, new))
    assert proc.returncode != 0
    # clang names the spaces by their macros: "... 'device float const *' with an lvalue of type
    # 'threadgroup float *'", or no overload / reference binding that accepts the other space.
    assert re.search(r"error: (no matching function|cannot initialize|binding reference|reference to type)",
                     proc.stderr), proc.stderr[-3000:]


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="the emulator needs a C++20 compiler (g++)")
def test_the_emulator_alone_accepts_a_cross_address_space_pointer() -> None:
    """Why the strict compile exists: the emulator build, where the address-space words are empty
    macros, compiles the planted error that Apple's compiler (and the strict compile) rejects."""
    from torch_uqr.backends.metal import build
    path, old, new = ADDRESS_SPACE_PLANTS["fragment-load-from-device"]
    assert build.build("asan", edited(path, old, new), only_formats=["q4_0"]).exists()


def test_strict_compile_sees_the_bfloat_branch_only_from_metal_3_1() -> None:
    """A bfloat-only error is reported for Metal 3.1 and invisible to Metal 3.0 (no bf16 kernels):
    both versions are compiled because both branches ship."""
    plant = edited(SHADERS / "uqr_gemm.metal", 'uqr_gemm_mv, bfloat, FMT)', 'uqr_gemm_mv, bfloat_t, FMT)')
    assert strict.strict_compile(plant, metal_version=300).returncode == 0
    proc = strict.strict_compile(plant, metal_version=310)
    assert proc.returncode != 0 and "bfloat_t" in proc.stderr


# --- Lint of the Metal branch -----------------------------------------------------------------

@pytest.mark.parametrize("metal_version", strict.METAL_VERSIONS)
def test_real_source_passes_the_lint(metal_version: int) -> None:
    assert strict.lint(metal_version=metal_version) == []


def test_lint_reads_the_real_bindings() -> None:
    """The binding check compares something: two kernels with 4 buffers, host and emulator lists."""
    code, _ = strict._preprocess(None, 310)
    kernels = strict.kernel_signatures(code)
    assert set(kernels) == {"uqr_gemm_mma", "uqr_gemm_mv"}
    for params in kernels.values():
        assert [(p.name, p.attribute) for p in params[:5]] == [
            ("x", "buffer(0)"), ("w", "buffer(1)"), ("y", "buffer(2)"), ("p", "buffer(3)"), ("shmem", "threadgroup(0)")]
    buffers, tg, problems = strict.host_bindings(strict.GLUE.read_text())
    assert buffers == {0: ("buffer", "x"), 1: ("buffer", "w"), 2: ("buffer", "y"), 3: ("bytes", "p")}
    assert tg == [0] and problems == []
    assert strict.emulator_binding_order(strict.DRIVER.read_text()) == ["x", "w", "y", "p"]


CHUNK_SUM = "      for (int e = 0; e < 8; ++e) s = fma(xv[8 * m + e], v[e], s);\n"
CHUNK_HEAD = "                         int m_count, thread float* acc) {\n"
MMA_STRUCT = "  uint row0, col0;\n"
GLUE_Y = "[encoder setBuffer:storage_buffer(y) offset:byte_offset(y) atIndex:2];"
DRIVER_ORDER = "void* buffers[4] = {const_cast<void*>(x), const_cast<void*>(w), y,"

LINT_PLANTS = {
    "new": ({KERNELS: (CHUNK_HEAD, CHUNK_HEAD + "  thread float* scratch = new float[8];\n")}, "new/delete"),
    "std": ({KERNELS: (CHUNK_SUM, CHUNK_SUM.replace("s = fma(", "s = std::fma("))}, "std::"),
    "exception": ({KERNELS: (CHUNK_HEAD, CHUNK_HEAD + "  if (m_count < 0) throw 1;\n")}, "exceptions"),
    "virtual": ({MMA: (MMA_STRUCT, MMA_STRUCT + "  virtual void reset() {}\n")}, "virtual"),
    "double": ({KERNELS: (CHUNK_SUM, CHUNK_SUM.replace("s = fma(", "s = (double)fma("))}, "no double"),
    "function-pointer": ({KERNELS: (CHUNK_HEAD, CHUNK_HEAD + "  void (*hook)(int) = 0;\n")}, "function pointers"),
    "libc": ({KERNELS: (CHUNK_HEAD, CHUNK_HEAD + "  printf(\"%d\", m_count);\n")}, "C library"),
    "recursion": ({KERNELS: (CHUNK_HEAD, CHUNK_HEAD + "  if (m_count < 0) uqr_mv_chunk<FMT>(blk, chunk, xv, m_count + 1, acc);\n")},
                  "recursion uqr_mv_chunk -> uqr_mv_chunk"),
    "mutual-recursion": ({REPO_ROOT / "csrc" / "include" / "uqr" / "platform.h": (
        "  return (uqr_u16)(p[0] | (p[1] << 8));",
        "  return p ? (uqr_u16)(p[0] | (p[1] << 8)) : (uqr_u16)uqr_load_half(p);")},
        "recursion uqr_load_half -> uqr_load_u16 -> uqr_load_half"),
    "system-header": ({LOADERS: ('#include "uqr_tiles.h"\n', '#include "uqr_tiles.h"\n#include <vector>\n')},
                      "#include <vector>: not a Metal header"),
    "unqualified-pointer": ({KERNELS: ("thread const float* xv,", "const float* xv,")},
                            "parameter 'const float* xv' is a pointer or reference without an address space"),
    "unqualified-reference": ({LOADERS: ("inline void uqr_stage_w_tile(device const uchar* w, constant uqr_gemm_params& p",
                                         "inline void uqr_stage_w_tile(device const uchar* w, const uqr_gemm_params& p")},
                              "without an address space"),
    "unknown-attribute": ({KERNELS: ("uint tiisg [[thread_index_in_simdgroup]]", "uint tiisg [[thread_index_in_simd_group]]")},
                          "unknown attribute [[thread_index_in_simd_group]]"),
    "buffer-index-swap": ({KERNELS: ("device T* y [[buffer(2)]]", "device T* y [[buffer(4)]]")},
                          "y [[buffer(4)]] is never bound by the host"),
    "buffer-index-duplicate": ({KERNELS: ("device const uchar* w [[buffer(1)]]", "device const uchar* w [[buffer(0)]]")},
                               "[[buffer(0)]] on both x and w"),
    "params-in-device-memory": ({KERNELS: ("constant uqr_gemm_params& p [[buffer(3)]]",
                                           "device const uqr_gemm_params& p [[buffer(3)]]")},
                                "is in device memory but the host binds it with setBytes"),
    "threadgroup-index": ({KERNELS: ("[[threadgroup(0)]]", "[[threadgroup(1)]]")},
                          "threadgroup memory indices [1], but gemm_mps.mm sets lengths at [0]"),
    "host-index": ({strict.GLUE: (GLUE_Y, GLUE_Y.replace("atIndex:2", "atIndex:5"))},
                   "is never bound by the host"),
    "host-swap": ({strict.GLUE: ("storage_buffer(xs) offset:byte_offset(xs) atIndex:0",
                                 "storage_buffer(xs) offset:byte_offset(xs) atIndex:1"),
                   },
                  "buffer index 1 is bound twice"),
    "emulator-order": ({strict.DRIVER: (DRIVER_ORDER, "void* buffers[4] = {const_cast<void*>(w), const_cast<void*>(x), y,")},
                       "but the emulator (driver.cpp) binds ['w', 'x', 'y', 'p'] by position"),
    "kernel-argument-order": ({KERNELS: (
        "kernel void uqr_gemm_mv(device const T* x [[buffer(0)]],\n                        device const uchar* w [[buffer(1)]],",
        "kernel void uqr_gemm_mv(device const uchar* w [[buffer(1)]],\n                        device const T* x [[buffer(0)]],")},
        "buffer arguments in order ['w', 'x', 'y', 'p']"),
}


@pytest.mark.parametrize("plant", sorted(LINT_PLANTS))
def test_lint_catches_a_planted_error(plant: str) -> None:
    edits, expected = LINT_PLANTS[plant]
    overrides: dict[Path, str] = {}
    for path, (old, new) in edits.items():
        text = overrides.get(path, path.read_text())
        assert old in text, f"{path.name} no longer contains {old!r}"
        overrides[path] = text.replace(old, new, 1)
    problems = strict.lint(overrides)
    assert any(expected in p for p in problems), "\n".join(problems) or "no problem reported"


# --- Shared launch limits (shaders/uqr_limits.h), checked by host, shaders and emulator --------

# Tiles that break the limits: a 32 x 256 prefill tile stages 36 KiB as float (> 32 KiB), and 8
# weight rows per matrix-vector simdgroup make 64 results for 32 lanes.
STATIC_ASSERT = re.compile(r"static_assert failed|static assertion failed")  # clang / g++ wording
LIMIT_PLANTS = {
    "threadgroup-memory": ("#define UQR_MMA_BN 64", "#define UQR_MMA_BN 256", "32 KiB"),
    "simd-width": ("#define UQR_MV_ROWS 4", "#define UQR_MV_ROWS 8", "each of the 32 lanes"),
}


def compile_launch_header(tmp_path: Path, tiles_text: str | None = None) -> subprocess.CompletedProcess:
    """csrc/mps/launch.h as the Objective-C++ glue includes it (plain C++ with the same headers),
    from a copy of the tree's layout so uqr_tiles.h can be edited."""
    (tmp_path / "csrc" / "mps").mkdir(parents=True)
    shutil.copytree(SHADERS, tmp_path / "shaders")
    shutil.copy(LAUNCH, tmp_path / "csrc" / "mps" / "launch.h")
    if tiles_text is not None:
        (tmp_path / "shaders" / "uqr_tiles.h").write_text(tiles_text)
    src = tmp_path / "host.cpp"
    src.write_text('#include "launch.h"\nint main() { return 0; }\n')
    return subprocess.run([strict.clang(), "-std=c++17", "-fsyntax-only", "-x", "c++",
                           f"-I{REPO_ROOT / 'csrc' / 'include'}", f"-I{tmp_path / 'csrc' / 'mps'}", str(src)],
                          capture_output=True, text=True, timeout=120)


def test_limits_hold_for_the_real_tiles_in_the_host_header(tmp_path: Path) -> None:
    proc = compile_launch_header(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("plant", sorted(LIMIT_PLANTS))
def test_limits_are_checked_by_the_host_header(plant: str, tmp_path: Path) -> None:
    old, new, message = LIMIT_PLANTS[plant]
    proc = compile_launch_header(tmp_path, edited(TILES, old, new)[TILES])
    assert proc.returncode != 0 and STATIC_ASSERT.search(proc.stderr) and message in proc.stderr, \
        proc.stderr[-3000:]


@pytest.mark.parametrize("plant", sorted(LIMIT_PLANTS))
def test_limits_are_checked_by_the_shaders(plant: str) -> None:
    old, new, message = LIMIT_PLANTS[plant]
    proc = strict.strict_compile(edited(TILES, old, new))
    assert proc.returncode != 0 and STATIC_ASSERT.search(proc.stderr) and message in proc.stderr, \
        proc.stderr[-3000:]


needs_gxx = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                               reason="the emulator needs a C++20 compiler (g++)")


@needs_gxx
def test_limits_are_checked_by_the_emulator_build() -> None:
    from torch_uqr.backends.metal import build
    old, new, message = LIMIT_PLANTS["threadgroup-memory"]
    with pytest.raises(RuntimeError, match="static assert") as info:
        build.build("asan", edited(TILES, old, new), only_formats=["q4_0"])
    assert message in str(info.value)


@needs_gxx
def test_emulator_refuses_a_launch_beyond_the_limits() -> None:
    """launch.h planning 4 bytes more threadgroup memory than the aligned size: the static_asserts
    (about the tile constants) still hold, and the emulator's run-time check refuses the launch."""
    import torch
    from torch_uqr.backends.metal.sanitized import run_sanitized
    from gemm_helpers import randn, weights
    line = "out.threadgroup_bytes = staged > out_tile ? staged : out_tile;"
    plant = edited(LAUNCH, line, "out.threadgroup_bytes = (staged > out_tile ? staged : out_tile) + 4;")
    qt, _ = weights("q4_0", None, 70, 256)
    r = run_sanitized("asan", randn(37, 256, dtype=torch.float16), qt.data, "q4_0", 70, 256, path="mma",
                      overrides=plant)
    assert r.returncode == 3, r.stderr[-2000:]
    assert "threadgroup memory" in r.stderr and "multiples of 16" in r.stderr
