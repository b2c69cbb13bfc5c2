"""Linux parse check of the Objective-C++ MPS glue (csrc/mps/*.mm).

clang parses each .mm in Objective-C++ mode (ARC, blocks) against the real PyTorch headers and the
framework declarations in tests/objcxx/, with the embedded shader header generated as setup.py
generates it. A misspelt Metal call or a wrong ATen signature fails here. It cannot run the glue:
that needs an Apple GPU. Needs clang (Debian/Ubuntu package `clang`); skipped without it.

The stubs model two SDKs (tests/objcxx/Availability.h): the oldest the docs promise (macOS 13: no
MTLLanguageVersion3_1, no mathMode) and a current one (macOS 15: both, and fastMathEnabled
deprecated). The glue must parse against both, deprecation warnings as errors; planted edits show
that each SDK guard, the deprecation pragma, the safe-math call and the autorelease pool are needed.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from build_flags import load_setup
from torch_uqr.backends.metal.source import REPO_ROOT, write_embedded_header

CLANG = shutil.which("clang++") or shutil.which("clang")
pytestmark = pytest.mark.skipif(
    CLANG is None, reason="clang is not installed (apt-get install -y clang): Objective-C++ parse check skipped")

STUBS = REPO_ROOT / "tests" / "objcxx"
GLUE = sorted((REPO_ROOT / "csrc" / "mps").glob("*.mm"))
MAIN_GLUE = REPO_ROOT / "csrc" / "mps" / "gemm_mps.mm"
# The C++ standard setup.py would pass with the installed torch (C++20 from torch 2.14 on).
FLAGS = ["-fsyntax-only", "-x", "objective-c++", f"-std={load_setup().cxx_standard()}",
         "-Wno-c++20-extensions", "-fobjc-arc",
         "-fblocks", "-fobjc-runtime=macosx-13.0", "-DUQR_WITH_MPS=1", "-Werror=deprecated-declarations"]
SDKS = [13, 15]  # tests/objcxx/Availability.h: macOS 13 SDK, current SDK


def parse(path: Path, extra_includes: list[str], sdk: int = 15) -> subprocess.CompletedProcess:
    includes = [f"-I{STUBS}", *[f"-I{p}" for p in extra_includes]]
    return subprocess.run([CLANG, *FLAGS, f"-DUQR_STUB_SDK={sdk}", *includes, str(path)],
                          capture_output=True, text=True, timeout=300)


def parse_glue(mm: Path, tmp_path: Path, sdk: int) -> subprocess.CompletedProcess:
    """Parse a glue file (the real one or an edited copy) as the package build would compile it."""
    from torch.utils.cpp_extension import include_paths
    write_embedded_header(tmp_path / "uqr_shader_source.h")
    return parse(mm, [str(tmp_path), str(REPO_ROOT / "csrc" / "include"), str(REPO_ROOT / "csrc" / "mps"),
                      *include_paths()], sdk)


def edited_glue(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of gemm_mps.mm with one exact edit (the copy's includes resolve as the original's)."""
    text = MAIN_GLUE.read_text()
    assert text.count(old) == 1, f"gemm_mps.mm no longer contains exactly one {old!r}"
    out = tmp_path / "gemm_mps_edited.mm"
    out.write_text(text.replace(old, new))
    return out


def test_there_is_glue_to_check() -> None:
    assert GLUE, "csrc/mps/ holds no .mm file"


@pytest.mark.parametrize("sdk", SDKS, ids=[f"macos{s}-sdk" for s in SDKS])
@pytest.mark.parametrize("mm", GLUE, ids=[p.name for p in GLUE])
def test_glue_parses_as_objective_cpp(mm: Path, sdk: int, tmp_path: Path) -> None:
    proc = parse_glue(mm, tmp_path, sdk)
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.parametrize("sdk,symbol", [(13, "MTLLanguageVersion3_1"), (13, "MTLMathModeSafe"),
                                        (15, "MTLLanguageVersion3_1"), (15, "mathMode")])
def test_stub_sdks_differ_as_apples_do(sdk: int, symbol: str, tmp_path: Path) -> None:
    """The macOS 13 stub lacks what macOS 14/15 added; the current one has it."""
    src = tmp_path / "sym.mm"
    use = ("MTLLanguageVersion v = MTLLanguageVersion3_1; (void)v;" if symbol == "MTLLanguageVersion3_1"
           else "o.mathMode = MTLMathModeSafe;")
    src.write_text(f"#import <Metal/Metal.h>\nvoid f(MTLCompileOptions* o) {{ {use} }}\n")
    proc = parse(src, [], sdk)
    if sdk == 13:
        assert proc.returncode != 0 and symbol in proc.stderr, proc.stderr[-2000:]
    else:
        assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("sdk,old,new,expect", [
    # Without the SDK guard, a macOS 13 SDK has no MTLLanguageVersion3_1 / mathMode to name.
    (13, "  #define UQR_SDK_HAS_METAL_3_1 0", "  #define UQR_SDK_HAS_METAL_3_1 1", "MTLLanguageVersion3_1"),
    (13, "  #define UQR_SDK_HAS_MATH_MODE 0", "  #define UQR_SDK_HAS_MATH_MODE 1", "mathMode"),
    # Without the pragma, setting fastMathEnabled is a deprecation error against a current SDK.
    (15, '#pragma clang diagnostic ignored "-Wdeprecated-declarations"\n', "", "fastMathEnabled"),
], ids=["metal31-guard", "mathmode-guard", "deprecation-pragma"])
def test_parse_catches_a_missing_sdk_guard(sdk: int, old: str, new: str, expect: str, tmp_path: Path) -> None:
    proc = parse_glue(edited_glue(tmp_path, old, new), tmp_path, sdk)
    assert proc.returncode != 0 and expect in proc.stderr, proc.stderr[-3000:]


# --- Source checks the parse cannot make: safe math is requested, Objective-C work is pooled. ---

def function_body(text: str, signature: str) -> tuple[int, int]:
    """[start, end) of the brace-delimited body of the function whose definition starts with
    ``signature`` (the first such occurrence)."""
    brace, end = _block(text, text.index("{", text.index(signature)))
    return brace + 1, end


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    return re.sub(r"//[^\n]*", lambda m: " " * len(m.group(0)), text)


def safe_math_problems(text: str) -> list[str]:
    """What is wrong with how the glue asks Metal for safe math (empty: nothing)."""
    text = strip_comments(text)
    problems = []
    s, e = function_body(text, "void use_safe_math(")
    helper = text[s:e]
    for needed in ("options.mathMode = MTLMathModeSafe", "options.fastMathEnabled = NO",
                   "@available(macOS 15.0, *)"):
        if needed not in helper:
            problems.append(f"use_safe_math does not contain {needed!r}")
    s, e = function_body(text, "bool compile(")
    body = text[s:e]
    call, build = body.find("use_safe_math(options)"), body.find("newLibraryWithSource")
    if call < 0 or build < 0 or call > build:
        problems.append("compile() does not call use_safe_math(options) before newLibraryWithSource")
    if re.search(r"fastMathEnabled\s*=\s*YES|MTLMathModeFast|MTLMathModeRelaxed", text):
        problems.append("fast or relaxed math is requested somewhere")
    return problems


_OBJC_WORK = re.compile(r"\[\w+[\w.()>-]*\s+\w+:|\bpipelines\(\)|\bdispatch_sync\(|@\"")


def unpooled_objc_work(text: str) -> list[str]:
    """Objective-C work (message sends, pipeline lookups, dispatches, NSString literals) in the body
    of gemm() that is not inside an @autoreleasepool block."""
    text = strip_comments(text)
    s, e = function_body(text, "at::Tensor gemm(")
    pooled = []
    for m in re.finditer(r"@autoreleasepool\s*\{", text[s:e]):
        pooled.append(_block(text, s + m.end() - 1))
    bad = []
    for m in _OBJC_WORK.finditer(text, s, e):
        if not any(ps <= m.start() < pe for ps, pe in pooled):
            bad.append(f"line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}")
    return bad


def _block(text: str, brace: int) -> tuple[int, int]:
    """(index of the `{` at ``brace``, index of its matching `}`)."""
    depth = 0
    for j in range(brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return brace, j
    raise ValueError("unbalanced braces")


def test_glue_requests_safe_math() -> None:
    assert safe_math_problems(MAIN_GLUE.read_text()) == []


def test_safe_math_check_catches_fast_math() -> None:
    text = MAIN_GLUE.read_text()
    assert text.count("    use_safe_math(options);\n") == 1
    assert any("before newLibraryWithSource" in p
               for p in safe_math_problems(text.replace("    use_safe_math(options);\n", "")))
    assert safe_math_problems(text.replace("options.fastMathEnabled = NO", "options.fastMathEnabled = YES"))


def test_glue_objc_work_is_inside_an_autorelease_pool() -> None:
    assert unpooled_objc_work(MAIN_GLUE.read_text()) == []


def test_pool_check_catches_work_outside_the_pool() -> None:
    text = MAIN_GLUE.read_text()
    moved = "  std::string error;\n  NSString* label = [NSString stringWithUTF8String:launch.name];\n"
    assert text.count("  std::string error;\n") == 1
    bad = unpooled_objc_work(text.replace("  std::string error;\n", moved))
    assert len(bad) == 1 and "stringWithUTF8String" in bad[0]
    # And the outer pool itself: drop it and the pipeline lookup is unpooled.
    no_pool = text.replace("  @autoreleasepool {\n    id<MTLComputePipelineState> pso",
                           "  {\n    id<MTLComputePipelineState> pso")
    assert no_pool != text and any("pipelines()" in b for b in unpooled_objc_work(no_pool))


def test_stubs_reject_a_misspelt_metal_call(tmp_path: Path) -> None:
    """The declarations are strict enough that a typo in a Metal selector is an error."""
    src = tmp_path / "typo.mm"
    src.write_text("#import <Metal/Metal.h>\n"
                   "void f(id<MTLComputeCommandEncoder> e, id<MTLBuffer> b) { [e setBufer:b offset:0 atIndex:0]; }\n")
    proc = parse(src, [])
    assert proc.returncode != 0 and "setBufer" in proc.stderr
    src.write_text(src.read_text().replace("setBufer", "setBuffer"))
    assert parse(src, []).returncode == 0
