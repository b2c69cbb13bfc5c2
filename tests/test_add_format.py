"""Adding a format, done for real on a temporary copy of the tree.

A throwaway format ``q4_t`` (q4_0's bytes under a new name and id) is added the way
docs/formats.md's "Adding a format" says: its module, its table row, its decoder in the shared
header, the regenerated C header and its section of docs/formats.md, plus the CUDA kernel slots.
The test then checks how many files that touched and that every derived list took the new format
without another edit: the Python registry, the operator's format and path lists, the Triton codes,
the CUDA tuning keys, the Metal entry points, the C++ name map and the CPU decoder switch (compiled
and run against q4_0's decoder on random blocks).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
import torch.utils.cpp_extension as cpp_ext

from torch_uqr.formats import table

ROOT = Path(__file__).resolve().parent.parent
NEW = "q4_t"
# The files a format must be written in (docs/formats.md, "Adding a format"). The generated header
# is rewritten by `python -m torch_uqr.formats.table --write`, not by hand, but it counts.
REQUIRED = {f"torch_uqr/formats/{NEW}.py", "torch_uqr/formats/table.py", "csrc/include/uqr/formats.h",
            "csrc/include/uqr/format_table.h", "docs/formats.md"}
# One kernel slot per backend that needs one: the CUDA tensor-core traits and the Triton decoder.
# The CPU kernels and the Metal shaders run a new format through the shared decoder as they are.
KERNEL_SLOTS = {"csrc/cuda/qmma_traits.cuh", "torch_uqr/backends/cuda/decode.py"}

pytestmark = pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                                reason="needs the git checkout")


def _insert_before(text: str, anchor: str, new: str) -> str:
    assert anchor in text, f"anchor {anchor!r} not found: the recipe below needs updating"
    return text.replace(anchor, new + anchor, 1)


def _add_format(root: Path) -> None:
    """The recipe of docs/formats.md for a copy of q4_0 named q4_t."""
    fm = root / "torch_uqr" / "formats"
    (fm / f"{NEW}.py").write_text((fm / "q4_0.py").read_text().replace('NAME = "q4_0"', f'NAME = "{NEW}"'))

    tab = fm / "table.py"
    tab.write_text(_insert_before(tab.read_text(), "\n)\n\nBY_NAME",
                                  f'\n    FormatSpec("{NEW}", {table.TABLE[-1].id + 1}, 32, 18, "q4_0 under another name"),'))

    hdr = root / "csrc" / "include" / "uqr" / "formats.h"
    text = _insert_before(hdr.read_text(), "// One switch for code that is generic over the format",
                          f"UQR_FN void uqr_decode8_{NEW}(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {{\n"
                          "  uqr_decode8_q4_0(blk, chunk, out);\n}\n\n")
    text = _insert_before(text, "    case UQR_Q4_0: uqr_decode8_q4_0(blk, chunk, out); break;",
                          f"    case UQR_Q4_T: uqr_decode8_{NEW}(blk, chunk, out); break;\n")
    text = text.replace("  if constexpr (FMT == UQR_Q4_0)",
                        f"  if constexpr (FMT == UQR_Q4_T) uqr_decode8_{NEW}(blk, chunk, out);\n"
                        "  else if constexpr (FMT == UQR_Q4_0)", 1)
    hdr.write_text(text)

    docs = root / "docs" / "formats.md"
    docs.write_text(_insert_before(docs.read_text(), "## Adding a format",
                                   f"## {NEW}\n\nq4_0's 18-byte block under another name.\n\n"))

    traits = root / "csrc" / "cuda" / "qmma_traits.cuh"
    traits.write_text(_insert_before(traits.read_text(), "// fn(F{}) for the format traits F",
                                     "template <>\nstruct Traits<UQR_Q4_T> : Traits<UQR_Q4_0> {};\n\n"))
    triton = root / "torch_uqr" / "backends" / "cuda" / "decode.py"
    text = triton.read_text().replace("    if FMT == Q4_0:", "    if FMT == Q4_0 or FMT == Q4_T:", 1)
    triton.write_text(_insert_before(text, "\n\n@triton.jit", f'\nQ4_T: tl.constexpr = tl.constexpr(FORMAT_CODES["{NEW}"])'))

    subprocess.run([sys.executable, "-m", "torch_uqr.formats.table", "--write"], cwd=root, check=True,
                   capture_output=True, env={**os.environ, "PYTHONPATH": str(root)})


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of the tracked tree with q4_t added, committed before the change so git can diff."""
    root = tmp_path_factory.mktemp("tree") / "repo"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / rel)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "base"], cwd=root, check=True)
    _add_format(root)
    return root


def test_files_touched(tree: Path) -> None:
    out = subprocess.run(["git", "status", "--porcelain", "-uall"], cwd=tree, capture_output=True, text=True,
                         check=True).stdout
    touched = {line[3:] for line in out.splitlines()}
    assert touched == REQUIRED | KERNEL_SLOTS, sorted(touched ^ (REQUIRED | KERNEL_SLOTS))
    assert len(REQUIRED) <= 7


def test_every_derived_list_has_it(tree: Path) -> None:
    """Import the copy's package (without its compiled library) and read every list of formats."""
    probe = f"""
import json, sys
import torch
from torch_uqr import ops
from torch_uqr.formats import REGISTRY, get, table
from torch_uqr.backends.cuda import configs, formats_meta
from tests.gemm_helpers import FORMAT_CASES
new = "{NEW}"
g = torch.Generator().manual_seed(0)
w = torch.randn(8, 64, generator=g)
q_new, q_old = get(new).quantize(w), get("q4_0").quantize(w)
print(json.dumps({{
    "registry": new in REGISTRY, "ops": new in ops.FORMATS,
    "cases": (new, None) in FORMAT_CASES, "triton": formats_meta.FORMAT_CODES.get(new),
    "qmma": new in configs.QMMA_FORMATS,
    "same_bytes": bool(torch.equal(q_new, q_old)),
    "same_values": bool(torch.equal(get(new).decode(q_new, 8, 64), get("q4_0").decode(q_old, 8, 64))),
}}))
"""
    res = subprocess.run([sys.executable, "-c", probe], cwd=tree, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tree)})
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got == {"registry": True, "ops": True, "cases": True, "triton": table.TABLE[-1].id + 1, "qmma": True,
                   "same_bytes": True, "same_values": True}, got
    header = (tree / table.C_HEADER).read_text()
    for macro in ("UQR_FORMAT_LIST", "UQR_FIXED_BLOCK_LIST"):
        body = header.split(f"#define {macro}(X)")[1].split("\n\n")[0]
        assert f'X(UQR_Q4_T, "{NEW}")' in body, macro
    assert "'q4_t'" in header.split("#define UQR_FORMAT_NAMES")[1].splitlines()[0]


CPU_PROGRAM = r"""
#include <cstdio>
#include <random>
#include "cpu/block_decode.h"

// Decode random q4_0 blocks through the CPU kernels' decoder switch as q4_t and as q4_0.
int main() {
  std::mt19937 rng(7);
  int mismatches = 0;
  for (int trial = 0; trial < 200; ++trial) {
    alignas(64) uint8_t blk[UQR_Q4_T_BYTES];
    for (auto& b : blk) b = static_cast<uint8_t>(rng());
    blk[1] &= 0x3b;  // keep the fp16 scale finite
    uqr::cpu::vf got[2], want[2];
    uqr::cpu::with_decoder(UQR_Q4_T, 0, [&](auto tag) {
      using D = typename decltype(tag)::type;
      // Every case of the switch is compiled; only q4_t's runs, and must have q4_0's block.
      if (D::kElems != 32) { ++mismatches; return; }
      D::decode(blk, got);
    });
    uqr::cpu::BlockDecoder<UQR_Q4_0>::decode(blk, want);
    float a[32], b[32];
    uqr::cpu::vstore(a, got[0]); uqr::cpu::vstore(a + 16, got[1]);
    uqr::cpu::vstore(b, want[0]); uqr::cpu::vstore(b + 16, want[1]);
    for (int i = 0; i < 32; ++i) mismatches += std::memcmp(&a[i], &b[i], 4) != 0;
  }
  std::printf("%d\n", mismatches);
  return 0;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_cpu_decoder_switch_takes_it(tree: Path, tmp_path: Path) -> None:
    """The CPU kernels' decoder switch (block_decode.h) was not edited, yet decodes q4_t."""
    src = tmp_path / "probe.cpp"
    src.write_text(CPU_PROGRAM)
    exe = tmp_path / "probe"
    torch_lib = Path(torch.__file__).parent / "lib"
    cmd = ["g++", "-std=c++17", "-O1", str(src), "-o", str(exe), f"-I{tree / 'csrc'}", f"-I{tree / 'csrc' / 'include'}",
           *[f"-I{p}" for p in cpp_ext.include_paths()], f"-I{sysconfig.get_paths()['include']}",
           f"-L{torch_lib}", "-lc10", f"-Wl,-rpath,{torch_lib}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "0"


METAL_PROBE = """
import ctypes, json, sys
import torch
from torch_uqr.backends.metal.build import build
req = json.loads(sys.argv[1])
lib = ctypes.CDLL(str(build("lib", only_formats=[req["fmt"]])))
x = torch.tensor(req["x"], dtype=torch.float32)
w = torch.tensor(req["w"], dtype=torch.uint8)
y = torch.full(req["out_shape"], float("nan"))
params = (ctypes.c_longlong * len(req["params"]))(*req["params"])
err = ctypes.create_string_buffer(256)
rc = lib.uqr_emu_gemm(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(w.data_ptr()), ctypes.c_void_p(y.data_ptr()),
                      params, len(req["params"]), 2, 0, err, 256)
print(json.dumps({"rc": rc, "err": err.value.decode(), "y": y.tolist()}))
"""


@pytest.mark.slow
def test_metal_shaders_take_it(tree: Path) -> None:
    """The copy's Metal shaders (emulated) run q4_t without a shader edit: same output as q4_0."""
    import torch_uqr as uqr
    from torch_uqr.backends import strides

    N, K, M = 16, 64, 3
    w = uqr.quantize(torch.randn(N, K, generator=torch.Generator().manual_seed(1)), "q4_0")
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(2))
    want = uqr.gemm(x, w, backend="metal-emu")
    lay = strides.plan(x, w.data, "q4_0", N, K, backend="metal", allocate=False)
    params = dict(lay.params, fmt=table.TABLE[-1].id + 1)  # q4_t's id, q4_0's geometry
    req = {"fmt": NEW, "x": x.tolist(), "w": w.data.tolist(), "out_shape": list(lay.out_shape),
           "params": list(params.values())}
    res = subprocess.run([sys.executable, "-c", METAL_PROBE, json.dumps(req)], cwd=tree, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(tree)})
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["rc"] == 0, got["err"]
    assert torch.equal(torch.tensor(got["y"]), want)
