"""llama.cpp's quantization mixes (``quantize_model(model, recipe=...)``) and ``save_gguf``.

The type counts below are written out by hand from llama.cpp's rule (``llama_tensor_get_type``),
not computed by the code under test. The round trip reads the written file back with the gguf
package's own reader (types and bytes, q/k rows put in llama.cpp's rotary order by the tests'
helper) and with ``from_pretrained`` (logits equal to the model before saving).
"""
from collections import Counter

import gguf
import numpy as np
import pytest
import torch

import torch_uqr
from torch_uqr.formats import block_geometry
from torch_uqr.nn import QuantEmbedding, QuantLinear
from torch_uqr.qtensor import QTensor
from torch_uqr.recipes import FLOAT, tensor_type

from tiny_gguf_models import VOCAB, Dims, _rotary_interleaved, tiny_model, write_tiny_gguf

# hidden 640 is not a multiple of 256 (every k-quant of rows 640 long falls back; so does o_proj,
# K = 2 heads * 64 = 128), FFN 256 is; 8 layers: attn_v / ffn_down get more bits in layers 0, 3, 6
# and 7. Few heads keep the quantizing time down.
ODD = Dims(hidden=640, ffn=256, layers=8, heads=2, kv_heads=1, head_dim=64)
EVEN = Dims(hidden=256, ffn=256, layers=8, heads=4, kv_heads=2, head_dim=64)

# recipe -> (ggml type counts over the 58 quantized weights, number of fallbacks); per layer
# q, k, v, o, gate, up have K = hidden, down K = ffn; plus token_embd (K = hidden) and output.
EXPECTED = {
    ("q4_k_m", "odd"): ({"Q5_0": 45, "Q8_0": 5, "Q6_K": 4, "Q4_K": 4}, 50),
    ("q5_k_m", "odd"): ({"Q5_1": 45, "Q8_0": 5, "Q6_K": 4, "Q5_K": 4}, 50),
    ("q6_k", "odd"): ({"Q8_0": 50, "Q6_K": 8}, 50),
    ("q8_0", "odd"): ({"Q8_0": 58}, 0),
    ("q4_k_m", "even"): ({"Q4_K": 49, "Q6_K": 9}, 0),
    ("q5_k_m", "even"): ({"Q5_K": 49, "Q6_K": 9}, 0),
    ("q6_k", "even"): ({"Q6_K": 58}, 0),
    ("q8_0", "even"): ({"Q8_0": 58}, 0),
}
IDS = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))


def _zero_blocks(w: torch.Tensor, fmt: str, **_) -> QTensor:
    """All-zero blocks of ``fmt`` for ``w``'s shape (valid blocks, and no quantizer time)."""
    N, K = w.shape
    block, nbytes = block_geometry(fmt)
    return QTensor.from_bytes(torch.zeros(N, K // block * nbytes, dtype=torch.uint8), fmt, (N, K))


def _quantized(recipe: str, dims: Dims, tied: bool = False):
    model = tiny_model("llama", dims=dims)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
        model.config.tie_word_embeddings = True
    summary = torch_uqr.quantize_model(model, recipe=recipe, progress=False, verbose=False)
    return model, summary


def test_rule_by_name():
    assert tensor_type("q5_k_m", "blk.0.attn_v.weight", 4096, 32) == ("Q6_K", None)
    assert tensor_type("q5_k_m", "blk.4.attn_v.weight", 4096, 32) == ("Q5_K", None)
    assert tensor_type("q5_k_m", "blk.4.attn_q.weight", 640, 32)[0] == "Q5_1"
    assert tensor_type("q4_k_m", "blk.4.attn_qkv.weight", 4096, 32) == ("Q5_K", None)
    assert tensor_type("q6_k", "blk.0.ffn_down.weight", 4096, 32) == ("Q6_K", None)
    assert tensor_type("q6_k", "output.weight", 640, 32)[0] == "Q8_0"
    assert tensor_type("q8_0", "output.weight", 4096, 32) == ("Q8_0", None)
    assert tensor_type("q8_0", "token_embd.weight", 4096, 32, tied=True) == ("Q8_0", None)
    assert tensor_type("q6_k", "token_embd.weight", 4096, 32, tied=True) == ("Q6_K", None)
    for recipe in ("q4_k_m", "q5_k_m", "q6_k", "q8_0"):  # no quantized type fits: llama.cpp's F16
        for name in ("output.weight", "blk.0.attn_v.weight", "blk.1.ffn_up.weight"):
            ggml, why = tensor_type(recipe, name, 100, 32)
            assert ggml == FLOAT and "kept in float" in why


@pytest.mark.parametrize("recipe", ["q4_k_m", "q5_k_m", "q6_k", "q8_0"])
@pytest.mark.parametrize("width", ["odd", "even"])
def test_recipe_types(recipe, width, monkeypatch):
    # The choice of types is under test here, not the quantizers (the round trips below run them).
    monkeypatch.setattr(torch_uqr.nn.swap, "quantize", _zero_blocks)
    monkeypatch.setattr(torch_uqr.nn.linear, "quantize", _zero_blocks)
    dims = ODD if width == "odd" else EVEN
    model, summary = _quantized(recipe, dims)
    want_counts, want_fallbacks = EXPECTED[recipe, width]
    assert Counter(f.upper() for f in summary.formats.values()) == want_counts
    assert len(summary.fallbacks) == want_fallbacks
    assert summary.recipe == recipe and len(summary.swapped) == 57 and not summary.skipped
    assert isinstance(model.model.embed_tokens, QuantEmbedding)
    assert summary.formats["model.embed_tokens"] == model.model.embed_tokens.fmt
    assert not [n for n, m in model.named_modules() if type(m) is torch.nn.Linear]
    # the layers llama.cpp gives more bits, by name
    bumped = {"q4_k_m": "q6_k", "q5_k_m": "q6_k"}.get(recipe)
    if bumped and width == "even":
        more = [i for i in range(8) if summary.formats[f"model.layers.{i}.self_attn.v_proj"] == bumped]
        assert more == [0, 3, 6, 7]
        assert summary.formats["lm_head"] == "q6_k"
    text = str(summary)
    assert "formats:" in text and all(f.lower() in text for f in want_counts)


def _check_file(path: str, model, types: dict, dims: Dims) -> None:
    """Every tensor of the file in the model's own type and bytes (q/k rows in llama.cpp's order)."""
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, dims.layers)
    module_of = {names.get_name(n) + ".weight": m for n, m in model.named_modules() if n and names.get_name(n)}
    reader = gguf.GGUFReader(path)
    assert {t.name: t.tensor_type.name for t in reader.tensors} == types
    for t in reader.tensors:
        module = module_of[t.name]
        got = np.asarray(t.data)
        if isinstance(module, (QuantLinear, QuantEmbedding)):
            qt = module.qtensor
            assert t.tensor_type.name == qt.fmt.upper(), t.name
            want = qt.data
        else:
            want = module.weight.detach()
        if t.name.endswith(("attn_q.weight", "attn_k.weight")):
            want = _rotary_interleaved(want, dims.heads if ".attn_q." in t.name else dims.kv_heads)
        assert np.array_equal(got.reshape(want.shape), want.numpy()), t.name


def test_save_gguf_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("UQR_CACHE", str(tmp_path / "cache"))
    model, _ = _quantized("q4_k_m", ODD)
    path = str(tmp_path / "out.gguf")
    types = torch_uqr.save_gguf(model, path)
    assert Counter(types.values()) == {**EXPECTED["q4_k_m", "odd"][0], "F32": 17}
    _check_file(path, model, types, ODD)
    md = torch_uqr.load_gguf(path).metadata
    assert md["general.architecture"] == "llama" and md["llama.embedding_length"] == 640
    assert md["llama.block_count"] == 8 and md["llama.attention.head_count_kv"] == ODD.kv_heads
    assert md["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q4_K_M

    loaded = torch_uqr.from_pretrained(path)
    assert loaded.uqr_report.dequantized == [] and not loaded.uqr_report.float_fallback
    assert len(loaded.uqr_report.packed) == 58
    for name, fmt in loaded.uqr_report.packed.items():  # the loader undoes the row order: same bytes
        assert torch.equal(loaded.get_submodule(name).weight, model.get_submodule(name).weight), name
    with torch.no_grad():
        want, got = model(IDS).logits, loaded(IDS).logits
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5

    # a model loaded from a GGUF file (direct-head attention) is written back to the same tensors
    again = str(tmp_path / "again.gguf")
    assert torch_uqr.save_gguf(loaded, again) == types
    first = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(path).tensors}
    for t in gguf.GGUFReader(again).tensors:
        assert np.array_equal(np.asarray(t.data), first[t.name]), t.name


def test_save_gguf_tied_with_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setenv("UQR_CACHE", str(tmp_path / "cache"))
    write_tiny_gguf("llama", str(tmp_path / "src.gguf"))
    tok = torch_uqr.gguf_tokenizer(str(tmp_path / "src.gguf"))
    dims = Dims(hidden=128, ffn=256, layers=2, heads=4, kv_heads=2, head_dim=32)
    model, summary = _quantized("q6_k", dims, tied=True)
    # the tied head reads the embedding's blocks, in the head's type
    assert summary.formats["model.embed_tokens"] == summary.formats["lm_head"] == "q8_0"
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    path = str(tmp_path / "tied.gguf")
    types = torch_uqr.save_gguf(model, path, tok)
    assert "output.weight" not in types and types["token_embd.weight"] == "Q8_0"
    _check_file(path, model, types, dims)

    loaded = torch_uqr.from_pretrained(path)
    assert loaded.uqr_report.tied_head
    with torch.no_grad():
        want, got = model(IDS).logits, loaded(IDS).logits
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5
    tok2 = torch_uqr.gguf_tokenizer(path)
    text = "<|im_start|>user\nthe cat sat in the hat<|im_end|>"
    assert tok2(text)["input_ids"] == tok(text)["input_ids"]
    assert (torch_uqr.load_gguf(path).tokenizer_metadata()
            == torch_uqr.load_gguf(str(tmp_path / "src.gguf")).tokenizer_metadata())


def test_errors(tmp_path):
    small = Dims(hidden=128, ffn=256, layers=1, heads=4, kv_heads=2, head_dim=32)
    model = tiny_model("llama", dims=small)
    with pytest.raises(ValueError, match=r"recipe: unknown recipe 'q4_k_s'.*q4_k_m"):
        torch_uqr.quantize_model(model, recipe="q4_k_s")
    with pytest.raises(ValueError, match="exactly one of fmt= and recipe="):
        torch_uqr.quantize_model(model, "q4_0", recipe="q4_k_m")
    with pytest.raises(ValueError, match="exactly one of fmt= and recipe="):
        torch_uqr.quantize_model(model)
    with pytest.raises(ValueError, match="fallback="):
        torch_uqr.quantize_model(model, recipe="q8_0", fallback="q8_0")
    with pytest.raises(ValueError, match="needs a transformers model"):
        torch_uqr.quantize_model(torch.nn.Sequential(torch.nn.Linear(256, 256)), recipe="q8_0")
    assert all(type(m) is not QuantLinear for m in model.modules())  # refused before anything changed

    torch_uqr.quantize_model(model, "q8_0", progress=False, verbose=False)
    model.model.layers[0].mlp.up_proj = QuantLinear.from_linear(torch.nn.Linear(128, 256), "mlx4")
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.up_proj: format 'mlx4' has no GGUF type"):
        torch_uqr.save_gguf(model, str(tmp_path / "x.gguf"))
    model.model.layers[0].mlp.up_proj = QuantLinear.from_linear(torch.nn.Linear(128, 256), "q4_k", pad=True)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.up_proj: format 'q4_k' zero-padded"):
        torch_uqr.save_gguf(model, str(tmp_path / "x.gguf"))
    with pytest.raises(ValueError, match="llama-architecture"):
        torch_uqr.save_gguf(tiny_model("qwen2", dims=small), str(tmp_path / "x.gguf"))
