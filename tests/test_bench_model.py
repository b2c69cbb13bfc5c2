"""``python -m torch_uqr bench --model``: the whole-model table on a tiny GGUF, llama-bench's JSON
parsed from a fake binary, and the --threads checks."""
import json
import os
import re
import stat
import sys

import pytest
import torch

from torch_uqr.__main__ import main as uqr_main
from torch_uqr.cli import bench_model, llama_peer

from tiny_gguf_models import write_tiny_gguf

PP, TG = 8, 4
# What the fake llama-bench prints: three repetitions per test (the parser takes their median, not
# llama-bench's mean avg_ts), plus a test at other sizes that must be ignored.
FAKE_TESTS = [
    {"n_prompt": PP, "n_gen": 0, "n_threads": 1, "avg_ts": 180.0, "samples_ts": [100.0, 150.0, 290.0]},
    {"n_prompt": 0, "n_gen": TG, "n_threads": 1, "avg_ts": 28.0, "samples_ts": [20.0, 25.0, 39.0]},
    {"n_prompt": 512, "n_gen": 0, "n_threads": 1, "avg_ts": 9.0, "samples_ts": [9.0]},
]


def _row(out: str, engine: str, threads: int) -> list[str]:
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()
            if re.match(rf"\|\s*{re.escape(engine)}\s*\|\s*{threads}\s*\|", line)]
    assert len(rows) == 1, f"no single {engine} row at {threads} threads in:\n{out}"
    return rows[0]


@pytest.fixture
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_bench_model_table_with_fake_llama_bench(tmp_path, monkeypatch, capsys, keep_threads):
    monkeypatch.setenv("UQR_CACHE", str(tmp_path / "cache"))
    path = str(tmp_path / "tiny.gguf")
    write_tiny_gguf("llama", path, non_native={})  # every type loadable by transformers too
    argv_file = tmp_path / "argv.json"
    fake = tmp_path / "llama-bench"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"json.dump(sys.argv[1:], open({str(argv_file)!r}, 'w'))\n"
                    f"print(json.dumps({FAKE_TESTS!r}))\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out_json = tmp_path / "rows.json"

    assert uqr_main(["bench", "--model", path, "--pp", str(PP), "--tg", str(TG), "--reps", "1",
                     "--threads", "1", "--llama-bench", str(fake), "--json", str(out_json)]) == 0
    out = capsys.readouterr().out

    assert json.loads(argv_file.read_text()) == ["-m", path, "-p", str(PP), "-n", str(TG), "-t", "1",
                                                  "-r", "1", "-o", "json"]
    assert f"| engine | threads | pp{PP} tok/s | tg{TG} tok/s | pp / llama.cpp | tg / llama.cpp |" in out
    assert _row(out, "llama.cpp", 1)[2:] == ["150.0", "25.0", "-", "-"]  # medians of the samples
    for engine in ("router", "router-int8", "transformers"):
        cells = _row(out, engine, 1)
        pp_ts, tg_ts, pp_ratio, tg_ratio = map(float, cells[2:])
        assert pp_ts > 0 and tg_ts > 0
        assert pp_ratio == pytest.approx(pp_ts / 150.0, abs=0.01)
        assert tg_ratio == pytest.approx(tg_ts / 25.0, abs=0.01)

    saved = json.loads(out_json.read_text())
    assert [(r["engine"], r["threads"]) for r in saved["rows"]] == [
        ("router", 1), ("router-int8", 1), ("transformers", 1), ("llama.cpp", 1)]
    assert saved["machine"]["torch"] == torch.__version__
    assert set(saved["machine"]["isa"]) == {"avx2", "avx512f", "neon"}


def test_parse_llama_bench_json():
    text = "build: 1 (abc)\n" + json.dumps(FAKE_TESTS + [
        {"n_prompt": PP, "n_gen": 0, "n_threads": 2, "avg_ts": 300.0, "samples_ts": [290.0, 300.0, 400.0]},
        {"n_prompt": 0, "n_gen": TG, "n_threads": 2, "avg_ts": 40.0},
    ])
    assert llama_peer.parse_llama_bench_json(text, PP, TG) == {1: (150.0, 25.0), 2: (300.0, 40.0)}
    with pytest.raises(ValueError, match="no pp8 and tg5"):
        llama_peer.parse_llama_bench_json(text, PP, TG + 1)
    with pytest.raises(ValueError, match="not JSON"):
        llama_peer.parse_llama_bench_json("[oops", PP, TG)


def test_llama_bench_failure_is_reported(tmp_path):
    fake = tmp_path / "llama-bench"
    fake.write_text("#!/bin/sh\necho 'error: failed to load model' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(RuntimeError, match="failed to load model"):
        llama_peer.llama_bench_tok_s(str(fake), "m.gguf", PP, TG, [1], 1)


def test_threads_parsing(monkeypatch, tmp_path):
    assert bench_model.parse_threads("1,all", 2) == [1, 2]
    assert bench_model.parse_threads("1,all", 1) == [1]
    assert bench_model.parse_threads("2,1", 4) == [2, 1]
    for bad in ("3", "0", "x", "1,,2"):
        with pytest.raises(SystemExit, match="--threads"):
            bench_model.parse_threads(bad, 2)
    # through the command: a count above the cores stops it before any model is read
    monkeypatch.setattr(bench_model, "usable_cores", lambda: 2)
    with pytest.raises(SystemExit, match=r"--threads: 3 threads .* 2 cores"):
        uqr_main(["bench", "--model", str(tmp_path / "absent.gguf"), "--threads", "1,3"])
    assert os.listdir(tmp_path) == []
