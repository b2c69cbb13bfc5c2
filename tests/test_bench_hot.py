"""``python -m torch_uqr bench --hot`` (one weight copy reused, as llama.cpp's test-backend-ops) and
the "read floor ms" column (the time to read the packed bytes once, same rotation as the calls)."""
from __future__ import annotations

import json

import pytest
import torch

from torch_uqr.cli import bench


def run(tmp_path, extra):
    out = tmp_path / "bench.json"
    rc = bench.main(["--device", "cpu", "--shapes", "40x256", "--M", "1,3", "--formats", "q4_0,q8_0",
                     "--reps", "2", "--no-baseline", "--json", str(out), *extra])
    assert rc == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("hot", [False, True])
def test_bench_hot_flag_and_read_floor(tmp_path, capsys, hot):
    doc = run(tmp_path, ["--hot"] if hot else [])
    rows = doc["rows"]
    assert doc["hot"] is hot
    assert {(r["fmt"], r["path"], r["M"]) for r in rows} == {
        ("q4_0", "auto", 1), ("q4_0", "int8", 1), ("q4_0", "auto", 3), ("q4_0", "int8", 3),
        ("q8_0", "auto", 1), ("q8_0", "int8", 1), ("q8_0", "auto", 3), ("q8_0", "int8", 3)}
    for r in rows:
        assert r["hot"] is hot
        # hot: one copy reused; otherwise enough copies to exceed 1.5x the LLC
        assert (r["weight_copies"] == 1) if hot else (r["weight_copies"] >= 2)
        assert r["read_floor_ms"] is not None and r["read_floor_ms"] > 0 and r["ms"] > 0
    # one floor per (shape, format): every row of a format shares it
    for fmt in ("q4_0", "q8_0"):
        assert len({r["read_floor_ms"] for r in rows if r["fmt"] == fmt}) == 1
    text = capsys.readouterr().out
    assert "| uqr ms | uqr cpu ms | read floor ms |" in text
    assert ("weights hot: one copy reused" in text) == hot
    assert ("rotated through" in text) != hot


def test_bench_hot_in_help():
    assert "--hot" in bench.build_parser().format_help()
    assert "--hot" in bench.__doc__ and "read floor ms" in bench.__doc__


def test_read_floor_views_the_bytes_widest():
    # q4_0 rows of 18 bytes: 40 rows = 720 bytes -> int64; an odd byte count stays uint8
    assert bench._widest_view(torch.zeros(40, 18, dtype=torch.uint8)).dtype == torch.int64
    assert bench._widest_view(torch.zeros(3, 6, dtype=torch.uint8)).dtype == torch.int16
    assert bench._widest_view(torch.zeros(1, 7, dtype=torch.uint8)).dtype == torch.uint8
    assert bench.read_floor_ms([torch.zeros(64, 18, dtype=torch.uint8)] * 2, 3, torch.device("cpu")) > 0


def test_bench_hot_is_not_passed_to_the_cuda_bench():
    with pytest.raises(SystemExit, match="--hot is a mode of the CPU/MPS bench"):
        bench.main(["--device", "cuda", "--hot"])
