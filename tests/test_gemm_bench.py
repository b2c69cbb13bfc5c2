"""Smoke test of ``python -m torch_uqr bench`` on tiny shapes: runs, reports sane rows and JSON."""
from __future__ import annotations

import json

from torch_uqr.cli import bench


def test_bench_tiny_run_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = bench.main(["--device", "cpu", "--shapes", "48x256", "--M", "1,9", "--formats", "q4_k,mlx4:32,ternary",
                     "--reps", "1", "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert {(r["fmt"], r["path"], r["M"]) for r in rows} == {
        (f, p, m) for f, p in [("q4_k", "auto"), ("mlx4", "auto"), ("ternary", "vec"), ("ternary", "mma")]
        for m in (1, 9)} | {("q4_k", "int8", 1), ("mlx4", "int8", 1)}  # int8 rows only at M <= bench.INT8_MAX_M
    for r in rows:
        # path int8 rounds x to int8: a few 1e-3 relative error by design, fp32 paths accumulation only
        assert r["max_rel_err"] < (2e-2 if r["path"] == "int8" else 1e-5)
        assert r["ms"] > 0 and r["deq_matmul_ms"] > 0
    text = capsys.readouterr().out
    assert "| q4_k | auto | 48x256 | 9 |" in text and "| q4_k | int8 | 48x256 | 1 |" in text
    assert "max rel err of a few 1e-3 is expected" in text


def test_bench_argument_errors():
    import pytest
    with pytest.raises(SystemExit, match="--formats: unknown format 'q9_9'"):
        bench.main(["--device", "cpu", "--formats", "q9_9"])
    with pytest.raises(SystemExit, match="--shapes: expected NxK"):
        bench.main(["--device", "cpu", "--shapes", "4096"])
