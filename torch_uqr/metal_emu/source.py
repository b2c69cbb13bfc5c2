"""The shader source as one text: what the Mac glue embeds and what the emulator compiles.

Metal's runtime compiler (``newLibraryWithSource``) has no include path, so the project's quoted
includes (``shaders/*.h`` and ``csrc/include/uqr/*.h``) are inlined, each file once (they all use
``#pragma once``); angle-bracket includes (``<metal_stdlib>``) stay. ``setup.py`` embeds the result
for the Objective-C++ glue; the emulator additionally strips ``[[...]]`` attributes, which C++ would
otherwise read with the Metal words already defined away as macros (kernel arguments are bound by
position instead, see ``shim.h``).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

__all__ = ["REPO_ROOT", "SHADER_MAIN", "LAUNCH_HEADER", "INCLUDE_DIRS", "flatten", "strip_attributes",
           "metal_source"]

REPO_ROOT = Path(__file__).resolve().parents[2]
SHADER_MAIN = REPO_ROOT / "shaders" / "uqr_gemm.metal"
LAUNCH_HEADER = REPO_ROOT / "csrc" / "mps" / "launch.h"
INCLUDE_DIRS = (REPO_ROOT / "shaders", REPO_ROOT / "csrc" / "include")

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')
_PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\s*$")
_ATTRIBUTE = re.compile(r"\[\[[^\[\]]*\]\]")


def _resolve(name: str, including_dir: Path, include_dirs: Iterable[Path]) -> Path:
    for d in (including_dir, *include_dirs):
        candidate = (d / name).resolve()
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"shader include {name!r} not found next to {including_dir} or in "
                            f"{[str(d) for d in include_dirs]}")


def _display_name(path: Path) -> str:
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return path.name


def flatten(roots: Iterable[Path], include_dirs: Iterable[Path] = INCLUDE_DIRS,
            overrides: dict[Path, str] | None = None) -> str:
    """Concatenate ``roots`` with their quoted includes inlined once each.

    ``#line`` markers keep compiler messages pointing at the original files. ``overrides`` maps a
    file to replacement text (tests use it to compile an edited kernel without touching the tree).
    """
    include_dirs = tuple(include_dirs)
    overrides = {Path(k).resolve(): v for k, v in (overrides or {}).items()}
    seen: set[Path] = set()
    out: list[str] = []

    def visit(path: Path) -> None:
        path = path.resolve()
        if path in seen:
            return
        seen.add(path)
        text = overrides.get(path)
        if text is None:
            text = path.read_text()
        name = _display_name(path)
        out.append(f'#line 1 "{name}"')
        for lineno, line in enumerate(text.splitlines(), start=1):
            m = _INCLUDE.match(line)
            if m:
                visit(_resolve(m.group(1), path.parent, include_dirs))
                out.append(f'#line {lineno + 1} "{name}"')
            elif _PRAGMA_ONCE.match(line):
                out.append("")
            else:
                out.append(line)

    for root in roots:
        visit(Path(root))
    return "\n".join(out) + "\n"


def strip_attributes(source: str) -> str:
    """Remove every ``[[...]]`` attribute specifier (Metal's binding and entry-point attributes)."""
    return _ATTRIBUTE.sub("", source)


def metal_source() -> str:
    """The complete Metal library source, as handed to ``newLibraryWithSource``."""
    return flatten([SHADER_MAIN])
