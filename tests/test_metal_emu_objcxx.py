"""Linux parse check of the Objective-C++ MPS glue (csrc/mps/*.mm).

clang parses each .mm in Objective-C++ mode (ARC, blocks) against the real PyTorch headers and the
framework declarations in tests/objcxx/, with the embedded shader header generated as setup.py
generates it. A misspelt Metal call or a wrong ATen signature fails here. It cannot run the glue:
that needs an Apple GPU. Needs clang (Debian/Ubuntu package `clang`); skipped without it.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from torch_uqr.metal_emu.source import REPO_ROOT, write_embedded_header

CLANG = shutil.which("clang++") or shutil.which("clang")
pytestmark = pytest.mark.skipif(
    CLANG is None, reason="clang is not installed (apt-get install -y clang): Objective-C++ parse check skipped")

STUBS = REPO_ROOT / "tests" / "objcxx"
GLUE = sorted((REPO_ROOT / "csrc" / "mps").glob("*.mm"))
FLAGS = ["-fsyntax-only", "-x", "objective-c++", "-std=c++17", "-Wno-c++20-extensions", "-fobjc-arc",
         "-fblocks", "-fobjc-runtime=macosx-13.0", "-DUQR_WITH_MPS=1"]


def parse(path: Path, extra_includes: list[str]) -> subprocess.CompletedProcess:
    includes = [f"-I{STUBS}", *[f"-I{p}" for p in extra_includes]]
    return subprocess.run([CLANG, *FLAGS, *includes, str(path)], capture_output=True, text=True, timeout=300)


def test_there_is_glue_to_check() -> None:
    assert GLUE, "csrc/mps/ holds no .mm file"


@pytest.mark.parametrize("mm", GLUE, ids=[p.name for p in GLUE])
def test_glue_parses_as_objective_cpp(mm: Path, tmp_path: Path) -> None:
    from torch.utils.cpp_extension import include_paths
    write_embedded_header(tmp_path / "uqr_shader_source.h")
    proc = parse(mm, [str(tmp_path), str(REPO_ROOT / "csrc" / "include"), str(REPO_ROOT / "csrc" / "mps"),
                      *include_paths()])
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_stubs_reject_a_misspelt_metal_call(tmp_path: Path) -> None:
    """The declarations are strict enough that a typo in a Metal selector is an error."""
    src = tmp_path / "typo.mm"
    src.write_text("#import <Metal/Metal.h>\n"
                   "void f(id<MTLComputeCommandEncoder> e, id<MTLBuffer> b) { [e setBufer:b offset:0 atIndex:0]; }\n")
    proc = parse(src, [])
    assert proc.returncode != 0 and "setBufer" in proc.stderr
    src.write_text(src.read_text().replace("setBufer", "setBuffer"))
    assert parse(src, []).returncode == 0
