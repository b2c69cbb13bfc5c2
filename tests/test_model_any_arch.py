"""GGUF files of every common architecture on the router, against transformers' own GGUF import.

Each architecture is a tiny random transformers model written as GGUF the way llama.cpp writes
it (tests/tiny_gguf_models.py: mixed packed types, llama.cpp's q/k row order, Gemma's 1 + w
norms, a tiny tokenizer with a chat template). transformers' ``from_pretrained(gguf_file=...)``
dequantizes every tensor with the gguf package; ``torch_uqr.from_pretrained`` keeps the blocks
and decodes them in the kernels, so the two differ by float rounding only.
"""
import io
import os

import numpy as np
import pytest
import torch

import torch_uqr
from torch_uqr.models import auto
from torch_uqr.nn import QuantEmbedding, QuantLinear

from tiny_gguf_models import ARCHS, NON_NATIVE, VOCAB, reference_model, write_tiny_gguf

# whole-model runs: minutes on the 2-core CI machine (.ci/run runs them once, not for the newest torch too)
pytestmark = pytest.mark.slow

NATIVE_GGML = {f.upper() for f in torch_uqr.formats()}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_gguf")
    old = os.environ.get("UQR_CACHE")
    os.environ["UQR_CACHE"] = str(folder / "cache")
    out = {}
    for i, name in enumerate(ARCHS):
        path = str(folder / f"{name}.gguf")
        out[name] = (path, write_tiny_gguf(name, path, seed=i))
    yield out
    if old is None:
        os.environ.pop("UQR_CACHE")
    else:
        os.environ["UQR_CACHE"] = old


@pytest.fixture(scope="module", params=list(ARCHS))
def loaded(request, files):
    name = request.param
    path, types = files[name]
    model = torch_uqr.from_pretrained(path)
    return name, path, types, model, reference_model(path)


def _ids(seed=0, n=12):
    return torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


def test_packed_where_the_file_is_packed(loaded):
    name, path, types, model, _ = loaded
    report = model.uqr_report
    packed_in_file = {g for g, t in types.items() if t in NATIVE_GGML}
    non_native = set(NON_NATIVE.get(name, {}))
    assert set(report.dequantized) == non_native  # zero tensors dequantized where the types are native
    assert not report.float_fallback and not report.unused
    # every packed tensor of the file sits in a QuantLinear / QuantEmbedding (+1: a tied head shares the embedding)
    n_quant = sum(isinstance(m, (QuantLinear, QuantEmbedding)) for m in model.modules())
    assert len(report.packed) == n_quant == len(packed_in_file) + report.tied_head
    assert report.tied_head == ARCHS[name][4]
    assert isinstance(model.get_input_embeddings(), QuantEmbedding)
    assert isinstance(model.get_output_embeddings(), QuantLinear)
    if report.tied_head:  # the head reads the embedding's bytes, no copy
        assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    if ARCHS[name][2] == "llama":  # q and k rows moved back from llama.cpp's rotary order, on the blocks
        assert sorted(report.row_permuted) == sorted(f"model.layers.{i}.self_attn.{p}_proj"
                                                    for i in range(2) for p in "qk")
    else:
        assert report.row_permuted == []
    float_linears = [n for n, m in model.named_modules() if type(m) is torch.nn.Linear]
    assert len(float_linears) == len(non_native)


def test_logits_equal_transformers_dequantized_import(loaded):
    name, _, _, model, ref = loaded
    ids = _ids()
    with torch.no_grad():
        got, want = model(ids).logits, ref(ids).logits
    rel = ((got - want).abs().max() / want.abs().max()).item()
    assert rel < 1e-3, f"{name}: max |diff| / max |logit| = {rel:.2e}"
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_greedy_generate_is_identical(loaded):
    name, _, _, model, ref = loaded
    ids = _ids(1, 6)
    kw = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False)
    got = model.generate(ids, **kw)
    want = ref.generate(ids, **kw)
    assert got.shape[1] == ids.shape[1] + 16
    assert torch.equal(got, want), f"{name}: greedy tokens differ"


def test_chat_template_and_streamer(files):
    from transformers import TextStreamer

    path, _ = files["gemma3"]
    model = torch_uqr.from_pretrained(path)
    tok = torch_uqr.gguf_tokenizer(path)
    ids = tok.apply_chat_template([{"role": "user", "content": "the sun"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    assert tok.decode(ids[0]).endswith("<|im_start|>assistant\n")

    class Capture(TextStreamer):
        def on_finalized_text(self, text, stream_end=False):
            chunks.append(text)

    chunks = []
    out = model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                         streamer=Capture(tok, skip_prompt=True))
    assert "".join(chunks) == tok.decode(out[0, ids.shape[1]:])


@pytest.mark.parametrize("name", list(ARCHS))
def test_command_line_generates_for_every_architecture(files, name, capsys):
    from torch_uqr.cli.generate import main

    path, _ = files[name]
    assert main(["--gguf", path, "--max-new-tokens", "4", "--prompt", "the cat"]) == 0
    out = capsys.readouterr().out
    assert "modules packed" in out and "prefill" in out and "decode" in out and "peak memory" in out


def test_command_line_threads(files, capsys):
    from torch_uqr.cli.generate import main

    path, _ = files["qwen2"]
    before = torch.get_num_threads()
    try:
        assert main(["--gguf", path, "--max-new-tokens", "2", "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
        assert "; 1 CPU threads" in capsys.readouterr().out
    finally:
        torch.set_num_threads(before)
    with pytest.raises(SystemExit):
        main(["--gguf", path, "--threads", "-1"])


def test_command_line_fmt_keeps_the_output_head(files, capsys):
    from torch_uqr.cli.generate import main

    path, types = files["llama"]
    assert main(["--gguf", path, "--max-new-tokens", "2", "--fmt", "q4_0"]) == 0
    out = capsys.readouterr().out
    assert f"kept as they were: lm_head ({types['output.weight'].lower()})" in out
    assert main(["--gguf", path, "--max-new-tokens", "2", "--fmt", "q4_0", "--keep", "none"]) == 0
    assert "kept as they were" not in capsys.readouterr().out


def test_requantize_keep_patterns(files):
    from torch_uqr.models.llama import parse_keep, requantize

    path, types = files["qwen2"]  # tied head: lm_head reads the Q8_0 embedding's blocks
    model = torch_uqr.from_pretrained(path)
    head_bytes = model.lm_head.weight.clone()
    s = requantize(model, "q4_0", keep=parse_keep("lm_head,*.mlp.down_proj"))
    assert s.kept == {"lm_head": "q8_0", "model.layers.0.mlp.down_proj": types["blk.0.ffn_down.weight"].lower(),
                      "model.layers.1.mlp.down_proj": types["blk.1.ffn_down.weight"].lower()}
    assert torch.equal(model.lm_head.weight, head_bytes) and model.lm_head.fmt == "q8_0"
    assert isinstance(model.model.embed_tokens, QuantEmbedding) and model.model.embed_tokens.fmt == "q8_0"
    assert all(m.fmt == "q4_0" for n, m in model.named_modules()
               if isinstance(m, QuantLinear) and n not in s.kept)
    assert parse_keep("none") == parse_keep("") == ()


@pytest.mark.parametrize("fmt", torch_uqr.formats())
def test_quant_embedding_decodes_the_looked_up_rows(fmt):
    from torch_uqr.nn import block_size_of

    K = block_size_of(fmt) * 2
    qt = torch_uqr.quantize(torch.randn(37, K), fmt)
    ids = torch.tensor([[3, 0, 36], [3, 5, 7]])
    emb = QuantEmbedding(qt, scale=1.5)
    want = torch_uqr.dequantize(qt)[ids] * 1.5
    assert torch.equal(emb(ids), want)
    half = QuantEmbedding(qt, dtype=torch.bfloat16)(ids)
    assert half.dtype == torch.bfloat16 and torch.equal(half, torch_uqr.dequantize(qt)[ids].bfloat16())


class _Processor:
    def __init__(self, fn):
        self.fn = fn

    def process(self, weights, name, **kwargs):
        from transformers.modeling_gguf_pytorch_utils import GGUFTensor

        return GGUFTensor(self.fn(weights), name, {})


def test_row_order_probe_accepts_permutations_only():
    perm = np.array([2, 0, 3, 1])
    assert auto._row_order(_Processor(lambda w: w), "t", 4, {}) is None
    assert torch.equal(auto._row_order(_Processor(lambda w: w[perm]), "t", 4, {}), torch.from_numpy(perm))
    for fn in (lambda w: w - 1, lambda w: w[:, ::-1], lambda w: w[[0, 0, 1, 2]], lambda w: w.T):
        with pytest.raises(auto._NotRowOnly):
            auto._row_order(_Processor(fn), "t", 4, {})


def test_from_pretrained_errors(tmp_path):
    with pytest.raises(ValueError, match="exactly one .gguf"):
        torch_uqr.from_pretrained(str(tmp_path))
    (tmp_path / "x.bin").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="path_or_gguf"):
        torch_uqr.from_pretrained(str(tmp_path / "x.bin"))
