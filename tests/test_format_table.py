"""The format table is the one declaration of every format: the generated C header is current, the
modules and the C side agree with it, and a format's name appears only where a format must be
written (its module, its decoder, its kernel slots), not in hand-copied lists."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import torch

import torch_uqr as uqr
from torch_uqr import ops
from torch_uqr.formats import REGISTRY, table
from torch_uqr.formats import block_geometry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_c_header_is_generated_from_the_table() -> None:
    with open(os.path.join(ROOT, table.C_HEADER)) as f:
        assert f.read() == table.render_c_header(), \
            "format_table.h is stale: run python -m torch_uqr.formats.table --write"


def test_stale_header_is_reported(tmp_path, monkeypatch) -> None:
    """--check fails on a header that differs from the table (the test above can fail)."""
    fake_root = tmp_path / "repo"
    (fake_root / "csrc" / "include" / "uqr").mkdir(parents=True)
    (fake_root / table.C_HEADER).write_text(table.render_c_header().replace("UQR_Q4_1 = 1", "UQR_Q4_1 = 9"))
    monkeypatch.setattr(table, "_repo_root", lambda: str(fake_root))
    assert table.main(["--check"]) == 1
    (fake_root / table.C_HEADER).write_text(table.render_c_header())
    assert table.main(["--check"]) == 0


def test_modules_match_rows() -> None:
    assert tuple(REGISTRY) == table.NAMES == tuple(uqr.formats())
    for row in table.TABLE:
        module = REGISTRY[row.name]
        assert (module.NAME, module.BLOCK, module.BLOCK_BYTES) == (row.name, row.block, row.block_bytes)
        for g in row.group_sizes or (0,):
            assert block_geometry(row.name, g or None) == row.block_geometry(g)


def test_c_side_agrees_with_the_table() -> None:
    """Every name the operator accepts, with its block bytes: a row's bytes per row are checked by
    the C++ operator, so a wrong size in the generated header would be refused here."""
    for fmt, g in table.format_cases():
        qt = uqr.quantize(torch.randn(4, 256), fmt, group_size=g)
        elems, nbytes = table.spec(fmt).block_geometry(g or 0)
        assert qt.data.shape == (4, 256 // elems * nbytes)
        y = torch.ops.uqr.gemm(torch.randn(2, 256), qt.data, fmt, 4, 256, g or 0, 0, False, "auto")
        assert y.shape == (2, 4) and torch.isfinite(y).all()
    with pytest.raises(ValueError, match="expected one of " + re.escape(table.quoted_names(table.NAMES))):
        torch.ops.uqr.gemm(torch.randn(2, 256), qt.data, "q9_9", 4, 256, 0, 0, False, "auto")


def test_paths_follow_the_table() -> None:
    for row in table.TABLE:
        qt = uqr.quantize(torch.randn(8, 256), row.name)
        for path in table.PATHS:
            if path in row.paths("cpu"):
                uqr.gemm(torch.randn(2, 256), qt, path=path)
            else:
                with pytest.raises(ValueError, match=f"path={path!r}"):
                    uqr.gemm(torch.randn(2, 256), qt, path=path)
    assert ops.FORMATS == table.NAMES


# Files where adding a format must write something: its module, its table row, its decoder, the
# generated header, its spec, and one kernel slot per backend. Everything else derives from the table.
ALLOWED_BASE = {"torch_uqr/formats/table.py", "csrc/include/uqr/format_table.h", "csrc/include/uqr/formats.h"}


def _files_naming(name: str) -> set[str]:
    res = subprocess.run(["git", "grep", "-l", "-i", "-w", "-e", name, "-e", f"UQR_{name.upper()}", "--",
                          "torch_uqr", "csrc", "shaders", "setup.py"],
                         cwd=ROOT, capture_output=True, text=True)
    if res.returncode not in (0, 1):
        pytest.skip(f"git grep unavailable: {res.stderr.strip()[:200]}")
    return set(res.stdout.split())


@pytest.mark.skipif(shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")),
                    reason="needs the git checkout")
@pytest.mark.parametrize("name", ["q4_1", "q8_0"])
def test_a_plain_format_is_named_in_few_files(name: str) -> None:
    """q4_1 / q8_0 have one optional path, int8 on the CPU, whose kernels are a slot like the
    decoders: the files naming them are what adding such a format touches (the default model, a GGUF Q4_1 file with a Q8_0 output layer, is named in its loader
    and CLI as data, not as a list of formats; llama.cpp's mixes in recipes.py name the ggml types
    its rule picks, a rule a new format does not change)."""
    files = _files_naming(name) - {f"torch_uqr/formats/{name}.py"}
    model_data = {"torch_uqr/cli/generate.py", "torch_uqr/models/llama.py", "torch_uqr/loaders/__init__.py",
                  "torch_uqr/loaders/gguf.py", "torch_uqr/nn/swap.py", "torch_uqr/__init__.py",
                  "torch_uqr/models/llama.py", "torch_uqr/cli/generate.py", "torch_uqr/recipes.py"}
    rest = files - ALLOWED_BASE - model_data
    # The kernel slots: the CPU SIMD decoder (optional), the CPU int8 path's kernel (optional), the
    # CUDA traits, the Triton decoder and the format's CUDA tuning rows (optional: a format without
    # one takes the defaults).
    slots = {"csrc/cpu/block_decode.h", "csrc/cpu/gemm_int8.cpp", "csrc/cuda/qmma_traits.cuh",
             "torch_uqr/backends/cuda/decode.py", "torch_uqr/backends/cuda/configs.py"}
    assert rest <= slots, f"{name} is named beyond the table/module/decoder/kernel slots: {sorted(rest - slots)}"