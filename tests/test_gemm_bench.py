"""Smoke test of ``python -m torch_uqr bench`` on tiny shapes: runs, reports sane rows and JSON."""
from __future__ import annotations

import json

from torch_uqr import bench


def test_bench_tiny_run_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = bench.main(["--device", "cpu", "--shapes", "48x256", "--M", "1,9", "--formats", "q4_k,mlx4:32,ternary",
                     "--reps", "1", "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert {(r["fmt"], r["path"], r["M"]) for r in rows} == {
        (f, p, m) for f, p in [("q4_k", "auto"), ("mlx4", "auto"), ("ternary", "vec"), ("ternary", "mma")]
        for m in (1, 9)}
    for r in rows:
        assert r["max_rel_err"] < 1e-5 and r["ms"] > 0 and r["deq_matmul_ms"] > 0
    assert "| q4_k | auto | 48x256 | 9 |" in capsys.readouterr().out


def test_bench_argument_errors():
    import pytest
    with pytest.raises(SystemExit, match="--formats: unknown format 'q5_0'"):
        bench.main(["--device", "cpu", "--formats", "q5_0"])
    with pytest.raises(SystemExit, match="--shapes: expected NxK"):
        bench.main(["--device", "cpu", "--shapes", "4096"])
