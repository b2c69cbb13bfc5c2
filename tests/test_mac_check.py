"""scripts/mac_check.sh and the --device mps additions of the benchmark, checked off a Mac.

The script is run for real (it must skip cleanly here) and, with a stand-in `uname` that claims
Apple Silicon, in its dry-run mode, which prints the commands a Mac would run: they must build the
extension, run the Apple GPU suite and benchmark on mps. The benchmark's MPS peer table is checked
on fabricated rows.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from torch_uqr.cli import bench
from torch_uqr.backends.metal.source import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "mac_check.sh"


def run_script(tmp_path: Path, *args: str, system: str | None = None, machine: str | None = None,
               script: Path = SCRIPT) -> subprocess.CompletedProcess:
    env = dict(os.environ, UQR_MAC_CHECK_DRY_RUN="1")
    if system is not None:
        fake = tmp_path / "bin"
        fake.mkdir(exist_ok=True)
        (fake / "uname").write_text(f'#!/bin/sh\ncase "$1" in -s) echo {system};; -m) echo {machine};; *) echo {system};; esac\n')
        (fake / "uname").chmod(0o755)
        env["PATH"] = f"{fake}:{env['PATH']}"
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env=env, timeout=60,
                          cwd=tmp_path)


def test_script_is_valid_bash() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    assert os.access(SCRIPT, os.X_OK), "scripts/mac_check.sh is not executable"


def test_script_skips_cleanly_off_a_mac(tmp_path: Path) -> None:
    proc = run_script(tmp_path, system="Linux", machine="x86_64")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("SKIP:") and "Apple Silicon" in proc.stdout
    assert "+ " not in proc.stdout  # nothing was run
    proc = run_script(tmp_path, system="Darwin", machine="x86_64")  # an Intel Mac has no Metal path here
    assert proc.stdout.startswith("SKIP:")


EXPECTED_STEPS = [
    "-m venv ",
    "-m pip install --no-build-isolation -e .",
    "-m pytest -q -rs tests/test_mps.py",
    "-m torch_uqr bench --device mps --dtype float16",
]


def test_dry_run_on_apple_silicon_builds_tests_and_benches(tmp_path: Path) -> None:
    proc = run_script(tmp_path, "--venv", str(tmp_path / "venv"), system="Darwin", machine="arm64")
    assert proc.returncode == 0, proc.stderr
    commands = [line for line in proc.stdout.splitlines() if line.startswith("+ ")]
    for step in EXPECTED_STEPS:
        assert any(step in c for c in commands), f"no {step!r} in:\n" + "\n".join(commands)
    # In that order: the suite needs the build, the report needs both.
    order = [next(i for i, c in enumerate(commands) if step in c) for step in EXPECTED_STEPS]
    assert order == sorted(order)
    quick = run_script(tmp_path, "--quick", "--no-bench", "--venv", str(tmp_path / "venv"),
                       system="Darwin", machine="arm64")
    assert "torch_uqr bench" not in quick.stdout
    assert run_script(tmp_path, "--bogus", system="Darwin", machine="arm64").returncode == 2


def test_dry_run_check_catches_a_script_that_skips_the_suite(tmp_path: Path) -> None:
    """The step check above fails on a script whose test step was dropped."""
    text = SCRIPT.read_text()
    line = 'run tests.log "$PY" -m pytest -q -rs tests/test_mps.py tests/test_metal_emu.py tests/test_shader_strict.py\n'
    assert line in text
    broken = tmp_path / "mac_check.sh"
    broken.write_text(text.replace(line, ""))
    # The copy resolves ROOT from its own location; point it at the repository instead.
    broken.write_text(broken.read_text().replace('ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"',
                                                 f'ROOT="{REPO_ROOT}"'))
    proc = run_script(tmp_path, "--venv", str(tmp_path / "venv"), system="Darwin", machine="arm64", script=broken)
    commands = [line for line in proc.stdout.splitlines() if line.startswith("+ ")]
    assert not any("tests/test_mps.py" in c for c in commands)


def make_row(**kw) -> bench.Row:
    base = dict(fmt="q4_0", group_size=0, path="auto", N=4096, K=4096, M=1, dtype="float16", device="mps",
                ms=0.5, gflops=67.0, max_rel_err=1e-3, deq_matmul_ms=2.0, dense_matmul_ms=0.3,
                speedup_vs_deq_matmul=4.0, llama_cpp_ms=None, weight_copies=1)
    base.update(kw)
    return bench.Row(**base)


def test_mps_peer_table() -> None:
    rows = [make_row(torch_f16_ms=0.30, mlx_ms=0.25, mlx_group_size=64),
            make_row(fmt="mlx4", group_size=32, M=16, ms=0.9, torch_f16_ms=0.4, mlx_ms=None)]
    lines = bench.format_mps_peers(rows).splitlines()
    assert lines[0].startswith("| format | path | N x K | M | uqr ms | torch fp16 matmul ms | mlx q4 ms")
    assert lines[2] == "| q4_0 | auto | 4096x4096 | 1 | 0.500 | 0.300 | 0.250 (g64) | 2.00 |"
    assert lines[3] == "| mlx4:32 | auto | 4096x4096 | 16 | 0.900 | 0.400 | - | - |"


def test_cpu_table_is_unchanged_by_the_mps_fields() -> None:
    """The MPS peers live in their own table: each CPU table (docs/perf/cpu-*.md) keeps its 14 columns."""
    table = bench.format_table([make_row(device="cpu", torch_f16_ms=1.0, mlx_ms=1.0)])
    assert table.splitlines()[0].count("|") == 15


def test_mlx_peer_is_timed_when_mlx_imports() -> None:
    """With mlx importable the peer is a time (MLX runs on the CPU off a Mac); without, None."""
    try:
        import mlx.core  # noqa: F401
        have_mlx = True
    except ImportError:
        have_mlx = False
    gen = torch.Generator().manual_seed(0)
    ms = bench.mlx_qmm_ms(torch.randn(64, 128, generator=gen, dtype=torch.float64),
                          torch.randn(3, 128, generator=gen), 64, 1)
    assert (ms is not None and ms > 0) if have_mlx else ms is None


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="this machine has MPS")
def test_bench_on_mps_without_mps_says_so() -> None:
    with pytest.raises(SystemExit, match="--device mps"):
        bench.main(["--device", "mps", "--quick"])
