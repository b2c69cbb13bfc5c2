"""Stricter CI checks of the Metal shader source than the emulator build gives.

The emulator compiles the shaders as C++ with every address-space word an empty macro and every
``[[...]]`` attribute stripped, so a class of errors Apple's compiler reports passes it. Two checks
close that gap without a Mac:

* ``strict_compile``: clang parses the Metal branch of the source (``__METAL_VERSION__`` defined)
  against ``strict.h``, where ``device``, ``constant`` and ``threadgroup`` are distinct clang address
  spaces (``thread`` is the default one, where unqualified locals live): passing a pointer or
  reference across address spaces fails to compile, and the launch-limit ``static_assert``\\ s of
  ``shaders/uqr_limits.h`` are evaluated.
* ``lint``: the preprocessed Metal branch is checked for what Metal does not have (dynamic
  allocation, the C++ standard library, exceptions, virtual functions, RTTI, function pointers,
  recursion, ``double``, system headers other than Metal's), for pointer or reference parameters
  without an address space, for attributes Metal does not know, and for kernel argument bindings:
  each kernel's ``[[buffer(i)]]`` / ``[[threadgroup(i)]]`` indices against the host's
  ``setBuffer:... atIndex:`` calls in csrc/mps/gemm_mps.mm, and the order of its buffer arguments
  against the emulator's positional binding in driver.cpp.

Both take ``overrides`` (source file -> replacement text) so tests can plant an error in a copy.
"""
from __future__ import annotations

import bisect
import functools
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .source import REPO_ROOT, SHADER_MAIN, flatten, strip_attributes

__all__ = ["GLUE", "DRIVER", "STRICT_SHIM", "METAL_VERSIONS", "clang", "strict_compile", "lint",
           "kernel_signatures", "host_bindings", "emulator_binding_order"]

HERE = Path(__file__).resolve().parent
STRICT_SHIM = HERE / "strict.h"
DRIVER = HERE / "driver.cpp"
GLUE = REPO_ROOT / "csrc" / "mps" / "gemm_mps.mm"
# Metal 3.0 (macOS 13: no bfloat kernels) and Metal 3.1 (macOS 14+): both branches must compile.
METAL_VERSIONS = (300, 310)
# aarch64 has the _Float16 and __fp16 types strict.h needs; nothing is generated for it.
_CLANG_FLAGS = ["--target=aarch64-linux-gnu", "-std=c++17", "-fsyntax-only", "-x", "c++", "-ferror-limit=50"]


@functools.lru_cache(maxsize=1)
def clang() -> str | None:
    """clang++ (or clang) on PATH, or None."""
    return shutil.which("clang++") or shutil.which("clang")


def _require_clang() -> str:
    cc = clang()
    if cc is None:
        raise RuntimeError("the strict shader checks need clang (Debian/Ubuntu: apt-get install -y clang)")
    return cc


def _read(path: Path, overrides: dict[Path, str] | None) -> str:
    over = {Path(k).resolve(): v for k, v in (overrides or {}).items()}
    return over.get(path.resolve(), path.read_text())


def strict_compile(overrides: dict[Path, str] | None = None,
                   metal_version: int = 310) -> subprocess.CompletedProcess:
    """clang -fsyntax-only of the shader library with distinct address spaces (see module doc)."""
    cc = _require_clang()
    source = strip_attributes(flatten([SHADER_MAIN], overrides=overrides))
    with tempfile.TemporaryDirectory(prefix="uqr_strict_") as tmp:
        (Path(tmp) / "metal_stdlib").write_text(f'#include "{STRICT_SHIM}"\n')
        tu = Path(tmp) / "uqr_gemm_strict.cpp"
        tu.write_text(source)
        return subprocess.run([cc, *_CLANG_FLAGS, f"-D__METAL_VERSION__={metal_version}", f"-I{tmp}", str(tu)],
                              capture_output=True, text=True, timeout=300)


# ---------------------------------------------------------------------------------------------
# Lint
# ---------------------------------------------------------------------------------------------

# Metal's attribute names (those a kernel library like this one may use); anything else is a typo
# Apple's compiler rejects or, worse, ignores.
METAL_ATTRIBUTES = frozenset("""
buffer threadgroup texture sampler host_name kernel visible stitchable function_constant
max_total_threads_per_threadgroup stage_in user patch
thread_position_in_grid thread_position_in_threadgroup thread_index_in_threadgroup
threadgroup_position_in_grid threadgroups_per_grid threads_per_grid threads_per_threadgroup
dispatch_threads_per_threadgroup simdgroup_index_in_threadgroup thread_index_in_simdgroup
threads_per_simdgroup simdgroups_per_threadgroup dispatch_simdgroups_per_threadgroup
quadgroup_index_in_threadgroup thread_index_in_quadgroup quadgroups_per_threadgroup
thread_execution_width grid_origin grid_size
maybe_unused likely unlikely fallthrough nodiscard
""".split())
ADDRESS_SPACES = ("device", "constant", "threadgroup", "thread", "threadgroup_imageblock", "ray_data",
                  "object_data")
# Headers Metal provides; any other system include means the source leans on a host library.
METAL_HEADERS = frozenset({"metal_stdlib", "metal_math", "metal_simdgroup", "metal_simdgroup_matrix",
                           "metal_atomic", "metal_compute", "metal_integer", "metal_common",
                           "metal_relational"})

_FORBIDDEN = [
    (re.compile(r"\b(new|delete)\b"), "dynamic allocation (new/delete) does not exist in Metal"),
    (re.compile(r"\bstd\s*::"), "the C++ standard library (std::) is not available in Metal; use metal::"),
    (re.compile(r"\b(throw|try|catch|noexcept)\b"), "Metal has no exceptions"),
    (re.compile(r"\bvirtual\b"), "Metal has no virtual functions"),
    (re.compile(r"\b(dynamic_cast|typeid)\b"), "Metal has no RTTI"),
    (re.compile(r"\b(thread_local|register)\b"), "Metal has no thread_local or register storage"),
    (re.compile(r"\b(long\s+)?double\b"), "Metal has no double (use float)"),
    (re.compile(r"\b(malloc|calloc|realloc|free|printf|fprintf|memcpy|memset|abort|exit)\s*\("),
     "C library functions do not exist in Metal"),
    (re.compile(r"\(\s*(?:\w+\s*::\s*)*\*\s*\w*\s*\)\s*\("), "function pointers are not supported in Metal kernels"),
    (re.compile(r"\bgoto\b"), "goto is not supported by Metal"),
]
_KEYWORDS = frozenset("""if for while switch return sizeof alignof static_assert catch decltype
defined operator noexcept alignas __attribute__ template""".split())
_FUNC_HEAD = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*(?:<[^;(){}<>]*(?:<[^;(){}<>]*>[^;(){}<>]*)*>)?\s*\(")


@dataclass
class Code:
    """Preprocessed Metal-branch text and where each line came from."""

    text: str
    line_starts: list[int]
    origins: list[tuple[str, int]]

    def where(self, pos: int) -> str:
        i = bisect.bisect_right(self.line_starts, pos) - 1
        name, line = self.origins[max(i, 0)]
        return f"{name}:{line}"


def _blank_strings(text: str) -> str:
    return re.sub(r'"(?:[^"\\\n]|\\.)*"', lambda m: '"' + " " * (len(m.group(0)) - 2) + '"', text)


def _preprocess(overrides: dict[Path, str] | None, metal_version: int) -> tuple[Code | None, list[str]]:
    """The source as Apple's compiler would see it after preprocessing, with line origins."""
    cc = _require_clang()
    flat = flatten([SHADER_MAIN], overrides=overrides)
    # No system include path: an #include on the Metal branch of anything but Metal's own headers
    # (stubbed empty here) fails to preprocess, which is the finding.
    with tempfile.TemporaryDirectory(prefix="uqr_lint_") as tmp:
        (Path(tmp) / "metal_stdlib").write_text("")
        tu = Path(tmp) / "uqr_gemm_lint.metal.cpp"
        tu.write_text(flat)
        proc = subprocess.run([cc, "-E", "-x", "c++", "-std=c++17", "-nostdinc", "-nostdinc++",
                               f"-D__METAL_VERSION__={metal_version}", f"-I{tmp}", str(tu)],
                              capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        missing = re.findall(r"'([^']+)' file not found", proc.stderr)
        if missing:
            return None, [f"#include <{m}>: not a Metal header (the Metal compiler has no host system "
                          f"headers)" for m in missing]
        return None, [f"preprocessing failed: {proc.stderr.strip()[-1500:]}"]
    lines, origins = [], []
    name, line = "?", 1
    for raw in proc.stdout.splitlines():
        m = re.match(r'#\s*(\d+)\s+"([^"]*)"', raw)
        if m:
            line, name = int(m.group(1)), m.group(2)
            continue
        lines.append(raw)
        origins.append((name, line))
        line += 1
    starts, pos = [], 0
    for raw in lines:
        starts.append(pos)
        pos += len(raw) + 1
    return Code(_blank_strings("\n".join(lines)), starts, origins), []


def _match_close(text: str, i: int, open_: str, close: str) -> int:
    """Index of the bracket closing the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_:
            depth += 1
        elif text[j] == close:
            depth -= 1
            if depth == 0:
                return j
    return len(text) - 1


def _split_top(text: str, sep: str = ",") -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([<{":
            depth += 1
        elif ch in ")]>}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return [p.strip() for p in parts]


@dataclass
class Function:
    name: str
    params: str
    body: str
    pos: int        # position of the name
    body_pos: int   # position of the body's first character


def _functions(text: str) -> list[Function]:
    """Function definitions: NAME(params) [const] { body }, outside other function bodies."""
    out = []
    i = 0
    while True:
        m = _FUNC_HEAD.search(text, i)
        if not m:
            return out
        name = m.group(1)
        open_paren = m.end() - 1
        close = _match_close(text, open_paren, "(", ")")
        rest = re.match(r"\s*(?:const\s*)?\{", text[close + 1:])
        if name in _KEYWORDS or not rest:
            i = m.end()
            continue
        brace = close + 1 + rest.end() - 1
        end = _match_close(text, brace, "{", "}")
        out.append(Function(name, text[open_paren + 1:close], text[brace + 1:end], m.start(), brace + 1))
        i = end + 1


@dataclass
class KernelParam:
    position: int
    name: str
    space: str | None
    attribute: str | None  # e.g. "buffer(0)"


def _params(params: str) -> list[tuple[str, list[str]]]:
    """(declaration without attributes, [attribute texts]) per parameter."""
    out = []
    for p in _split_top(params):
        if not p or p == "void":
            continue
        attrs = re.findall(r"\[\[(.*?)\]\]", p)
        out.append((re.sub(r"\[\[.*?\]\]", "", p).strip(), attrs))
    return out


def kernel_signatures(code: Code) -> dict[str, list[KernelParam]]:
    """Each kernel function (``kernel`` before its return type) and its parameters."""
    kernels = {}
    for fn in _functions(code.text):
        head = code.text[max(0, fn.pos - 200):fn.pos]
        if not re.search(r"\bkernel\s+void\s*$", head):
            continue
        params = []
        for i, (decl, attrs) in enumerate(_params(fn.params)):
            space = next((s for s in ADDRESS_SPACES if re.search(rf"\b{s}\b", decl)), None)
            name = re.findall(r"\w+", decl)[-1]
            params.append(KernelParam(i, name, space, attrs[0].replace(" ", "") if attrs else None))
        kernels[fn.name] = params
    return kernels


# Host argument expressions of gemm_mps.mm -> the kernel parameter they bind.
HOST_ROLES = {"xs": "x", "w": "w", "y": "y", "params": "p"}


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def host_bindings(glue_text: str) -> tuple[dict[int, tuple[str, str]], list[int], list[str]]:
    """From the glue: {buffer index: (kind "buffer"/"bytes", kernel parameter)}, the threadgroup
    memory indices, and problems (an argument the lint cannot map)."""
    text = _strip_comments(glue_text)
    buffers, problems = {}, []
    for m in re.finditer(r"set(Buffer|Bytes):\s*(?:storage_buffer\(\s*(\w+)\s*\)|&\s*(\w+))[^\]]*?atIndex:\s*(\w+)\s*\]",
                         text):
        kind = "buffer" if m.group(1) == "Buffer" else "bytes"
        expr = m.group(2) or m.group(3)
        if not m.group(4).isdigit():
            problems.append(f"gemm_mps.mm: atIndex:{m.group(4)} for {expr} is not a literal index")
            continue
        index = int(m.group(4))
        role = HOST_ROLES.get(expr)
        if role is None:
            problems.append(f"gemm_mps.mm: binds {expr!r} at index {index}; the lint knows the host "
                            f"arguments {sorted(HOST_ROLES)} (update HOST_ROLES in strict.py)")
            continue
        if index in buffers:
            problems.append(f"gemm_mps.mm: buffer index {index} is bound twice")
        buffers[index] = (kind, role)
    tg = [int(i) for i in re.findall(r"setThreadgroupMemoryLength:[^\]]*?atIndex:\s*(\d+)\s*\]", text)]
    return buffers, tg, problems


def emulator_binding_order(driver_text: str) -> list[str]:
    """The kernel parameters the emulator passes as buffers 0, 1, ... (driver.cpp)."""
    m = re.search(r"void\s*\*\s*buffers\s*\[\s*\d*\s*\]\s*=\s*\{([^;]*)\}\s*;", _strip_comments(driver_text))
    if not m:
        return []
    names = []
    for item in _split_top(m.group(1)):
        inner = re.search(r"\(\s*(\w+)\s*\)\s*$", item)
        names.append(inner.group(1) if inner else item.strip())
    return names


def _check_bindings(code: Code, glue_text: str, driver_text: str) -> list[str]:
    problems = []
    host, host_tg, host_problems = host_bindings(glue_text)
    problems += host_problems
    emu_order = emulator_binding_order(driver_text)
    if not emu_order:
        problems.append("driver.cpp: no `void* buffers[] = {...}` binding list found")
    kernels = kernel_signatures(code)
    if not kernels:
        problems.append("no kernel functions found in the shader source")
    for kname, params in kernels.items():
        buffers = [p for p in params if p.attribute and re.fullmatch(r"buffer\(\d+\)", p.attribute)]
        tgs = [p for p in params if p.attribute and re.fullmatch(r"threadgroup\(\d+\)", p.attribute)]
        seen = {}
        for p in buffers:
            index = int(p.attribute[7:-1])
            if index in seen:
                problems.append(f"kernel {kname}: [[buffer({index})]] on both {seen[index]} and {p.name}")
            seen[index] = p.name
            bound = host.get(index)
            if bound is None:
                problems.append(f"kernel {kname}: {p.name} [[buffer({index})]] is never bound by the host "
                                f"(gemm_mps.mm binds {sorted(host)})")
                continue
            kind, role = bound
            if role != p.name:
                problems.append(f"kernel {kname}: [[buffer({index})]] is {p.name}, but gemm_mps.mm binds "
                                f"{role} at index {index}")
            want = "constant" if kind == "bytes" else "device"
            if p.space != want:
                problems.append(f"kernel {kname}: {p.name} [[buffer({index})]] is in {p.space} memory but the "
                                f"host binds it with set{'Bytes' if kind == 'bytes' else 'Buffer'} "
                                f"(expected {want})")
        for index in sorted(set(host) - set(seen)):
            problems.append(f"kernel {kname}: gemm_mps.mm binds {host[index][1]} at index {index}, which the "
                            f"kernel has no [[buffer({index})]] for")
        positional = [p.name for p in buffers]
        if emu_order and positional != emu_order:
            problems.append(f"kernel {kname}: buffer arguments in order {positional}, but the emulator "
                            f"(driver.cpp) binds {emu_order} by position")
        kernel_tg = sorted(int(p.attribute[12:-1]) for p in tgs)
        if kernel_tg != sorted(host_tg):
            problems.append(f"kernel {kname}: threadgroup memory indices {kernel_tg}, but gemm_mps.mm sets "
                            f"lengths at {sorted(host_tg)}")
    return problems


def _check_attributes(code: Code) -> list[str]:
    problems = []
    for m in re.finditer(r"\[\[(.*?)\]\]", code.text, flags=re.S):
        for attr in _split_top(m.group(1)):
            name = re.match(r"\s*(\w+)", attr)
            if not name or name.group(1) not in METAL_ATTRIBUTES:
                problems.append(f"{code.where(m.start())}: unknown attribute [[{attr}]]")
            elif name.group(1) in ("buffer", "threadgroup", "texture", "sampler") and \
                    not re.fullmatch(r"\w+\s*\(\s*\d+\s*\)", attr):
                problems.append(f"{code.where(m.start())}: [[{attr}]] needs a literal index")
    return problems


def _check_forbidden(code: Code) -> list[str]:
    problems = []
    for pattern, why in _FORBIDDEN:
        for m in pattern.finditer(code.text):
            problems.append(f"{code.where(m.start())}: {m.group(0).strip()!r}: {why}")
    return problems


def _check_pointer_params(code: Code, functions: list[Function]) -> list[str]:
    problems = []
    for fn in functions:
        for decl, _ in _params(fn.params):
            if ("*" in decl or "&" in decl) and not any(re.search(rf"\b{s}\b", decl) for s in ADDRESS_SPACES):
                problems.append(f"{code.where(fn.pos)}: {fn.name}: parameter '{decl}' is a pointer or reference "
                                f"without an address space (device, constant, threadgroup or thread)")
    return problems


def _check_recursion(code: Code, functions: list[Function]) -> list[str]:
    names = {fn.name for fn in functions}
    calls: dict[str, set[str]] = {}
    where: dict[str, int] = {}
    for fn in functions:
        where.setdefault(fn.name, fn.pos)
        calls.setdefault(fn.name, set()).update(m.group(1) for m in _CALL.finditer(fn.body) if m.group(1) in names)
    problems, state = [], {}

    def visit(n: str, stack: list[str]) -> None:
        state[n] = 1
        for c in sorted(calls.get(n, ())):
            if state.get(c) == 1:
                cycle = stack[stack.index(c):] + [c]
                problems.append(f"{code.where(where[c])}: recursion {' -> '.join(cycle)}: Metal does not "
                                f"support recursive calls")
            elif c not in state:
                visit(c, stack + [c])
        state[n] = 2

    for n in sorted(calls):
        if n not in state:
            visit(n, [n])
    return problems


def lint(overrides: dict[Path, str] | None = None, metal_version: int = 310) -> list[str]:
    """Problems found in the Metal branch of the shader source and its bindings (empty: none).

    ``overrides`` may replace shader files, the glue (``GLUE``) or the emulator driver (``DRIVER``).
    """
    code, problems = _preprocess(overrides, metal_version)
    if code is None:
        return problems
    functions = _functions(code.text)
    problems += _check_forbidden(code)
    problems += _check_attributes(code)
    problems += _check_pointer_params(code, functions)
    problems += _check_recursion(code, functions)
    problems += _check_bindings(code, _read(GLUE, overrides), _read(DRIVER, overrides))
    return problems
