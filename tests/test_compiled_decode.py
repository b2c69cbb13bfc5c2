"""The compiled decode step (``torch_uqr.models.decode``): fused q/k/v and gate/up projections give
bit-identical logits, the static-cache step compiles to one graph and decodes the eager path's
greedy tokens, and ``generate --compile`` / ``bench --model --compile`` run it."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import DynamicCache

from tiny_gguf_models import VOCAB, write_tiny_gguf
from torch_uqr.cli.generate import _forward
from torch_uqr.models.auto import load_gguf_model
from torch_uqr.models.decode import CompiledDecoder, fuse_projections

STEPS = 6


def _types(gname: str, K: int, layer, n_layers: int) -> str:
    """Layer 0: q/k/v and gate/up all q4_1 (both fuse); layer 1: q4_0 q against q8_0 k/v (no q/k/v
    fusion) and q4_0 gate/up (fuse); the rest q8_0."""
    if layer == 1 and gname.endswith("attn_q.weight"):
        return "q4_0"
    if layer == 1 and gname.endswith(("ffn_gate.weight", "ffn_up.weight")):
        return "q4_0"
    if layer == 0 and any(s in gname for s in ("attn_q.", "attn_k.", "attn_v.", "ffn_gate.", "ffn_up.")):
        return "q4_1"
    return "q8_0"


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("cdec") / "llama.gguf")
    write_tiny_gguf("llama", path, choose_type=_types, non_native={})
    return path


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.setenv("UQR_CACHE", str(tmp_path / "cache"))
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _ids():
    return torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def _eager_greedy(model, ids, steps=STEPS):
    """Greedy tokens and every step's logits of the eager DynamicCache path (as ``generate``)."""
    cache = DynamicCache(config=model.config)
    logits = [_forward(model, ids, cache)]
    tokens = []
    for _ in range(steps):
        tok = logits[-1].argmax(-1, keepdim=True)
        tokens.append(int(tok))
        logits.append(_forward(model, tok.view(1, 1), cache))
    return tokens, logits


def test_fused_projections_are_bit_identical(gguf_path):
    plain = load_gguf_model(gguf_path)[0].eval()
    fused = load_gguf_model(gguf_path)[0].eval()
    assert fuse_projections(fused) == {"qkv": 1, "gate_up": 2}
    attn0, attn1 = fused.model.layers[0].self_attn, fused.model.layers[1].self_attn
    assert attn0.qkv_proj.fmt == "q4_1" and not hasattr(attn0, "q_proj")
    assert attn1.qkv_proj is None and attn1.q_proj.fmt == "q4_0"
    assert fused.model.layers[1].mlp.gate_up_proj.fmt == "q4_0"
    assert fuse_projections(fused) == {"qkv": 0, "gate_up": 0}  # already fused
    ids = _ids()
    tok_a, log_a = _eager_greedy(plain, ids)
    tok_b, log_b = _eager_greedy(fused, ids)
    assert tok_a == tok_b
    for a, b in zip(log_a, log_b):
        assert torch.equal(a, b)


def test_compiled_step_matches_eager_in_one_graph(gguf_path):
    from torch._dynamo.utils import counters

    model = load_gguf_model(gguf_path)[0].eval()
    ids = _ids()
    tokens, logits = _eager_greedy(model, ids)
    torch._dynamo.reset()
    counters.clear()
    dec = CompiledDecoder(model, ids.shape[-1] + STEPS)  # fuses, then compiles with inductor
    assert dec.fused == {"qkv": 1, "gate_up": 2}
    for _ in range(2):  # a second prompt on the reset cache reuses the graph
        got = [dec.prefill(ids)]
        got_tokens = []
        for _ in range(STEPS):
            tok = got[-1].argmax(-1, keepdim=True)
            got_tokens.append(int(tok))
            got.append(dec.step(tok))
        assert got_tokens == tokens
        for a, b in zip(got, logits):
            assert ((a - b).abs().max() / b.abs().max()).item() < 1e-4
    assert dec.compile_s > 0
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"]
    with pytest.raises(ValueError, match="static cache full"):
        dec.step(tok)


def test_generate_and_bench_compile_flags(gguf_path, tmp_path, capsys):
    from torch_uqr.__main__ import main as uqr_main

    torch._dynamo.reset()
    common = ["generate", "--gguf", gguf_path, "--raw", "--prompt", "hello", "--max-new-tokens", "5",
              "--threads", "1"]
    assert uqr_main(common) == 0
    eager = capsys.readouterr().out
    assert uqr_main(common + ["--compile"]) == 0
    compiled = capsys.readouterr().out
    assert "compiled in" in compiled and "compiled in" not in eager
    text = lambda out: out.split("# prompt:")[1].split("\n\n# prefill")[0]  # noqa: E731
    assert text(compiled) == text(eager)

    torch._dynamo.reset()
    out_json = tmp_path / "rows.json"
    assert uqr_main(["bench", "--model", gguf_path, "--pp", "8", "--tg", "4", "--reps", "1", "--threads", "1",
                     "--engines", "router", "--compile", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "| router (compiled) | 1 |" in out and "router (compiled) at 1 threads: compiled in" in out
    rows = json.loads(out_json.read_text())["rows"]
    assert [r["engine"] for r in rows] == ["router", "router (compiled)"]
    assert rows[0]["compile_s"] is None and rows[1]["compile_s"] > 0 and rows[1]["tg_tok_s"] > 0
    with pytest.raises(SystemExit, match="keep 'router'"):
        uqr_main(["bench", "--model", gguf_path, "--engines", "transformers", "--compile"])


def test_int8_decode_path_fuses_and_stays_close(gguf_path):
    # set_path(..., "int8", max_rows=DECODE_ROWS): decode steps round activations to int8, the
    # prompt's prefill stays exact, fused projections keep the path, and the logits stay near the
    # exact ones (a few 1e-3 per layer, far more than fp32 accumulation: the path really runs).
    from torch_uqr.models.decode import DECODE_ROWS
    from torch_uqr.nn import QuantLinear, set_path

    model = load_gguf_model(gguf_path)[0].eval()
    ids = torch.randint(0, VOCAB, (1, DECODE_ROWS + 4), generator=torch.Generator().manual_seed(1))
    tokens, exact = _eager_greedy(model, ids, steps=3)
    counts = set_path(model, "int8", max_rows=DECODE_ROWS)
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert counts == {"set": len(layers), "kept": 0} and all(m.path == "int8" for m in layers)
    _, rounded = _eager_greedy(model, ids, steps=3)
    torch.testing.assert_close(rounded[0], exact[0], rtol=0, atol=0)  # prefill (12 rows): exact path
    fused = fuse_projections(model)
    assert sum(fused.values()) > 0
    assert all(m.path == "int8" and m.path_max_rows == DECODE_ROWS
               for m in model.modules() if isinstance(m, QuantLinear))
    _, fused_logits = _eager_greedy(model, ids, steps=3)
    for a, b, e in zip(rounded[1:], fused_logits[1:], exact[1:]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # fusion is exact on the int8 path too
        err = ((a - e).abs().max() / e.abs().max()).item()
        assert 1e-6 < err < 5e-2, err


def test_generate_and_bench_int8_path(gguf_path, tmp_path, capsys):
    from torch_uqr.__main__ import main as uqr_main

    assert uqr_main(["generate", "--gguf", gguf_path, "--raw", "--prompt", "hello", "--max-new-tokens", "3",
                     "--threads", "1", "--path", "int8"]) == 0
    assert "# path int8 for decode steps:" in capsys.readouterr().out
    out_json = tmp_path / "rows.json"
    assert uqr_main(["bench", "--model", gguf_path, "--pp", "8", "--tg", "4", "--reps", "1", "--threads", "1",
                     "--engines", "router-int8", "--json", str(out_json)]) == 0
    rows = json.loads(out_json.read_text())["rows"]
    assert [r["engine"] for r in rows] == ["router-int8"] and rows[0]["tg_tok_s"] > 0
