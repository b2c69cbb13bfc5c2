"""A GGUF with llama.cpp's Q4_K_M type mix, for a model whose hidden size is not a multiple of 256.

Such a model is what the mix looks like in practice on odd widths: every weight whose rows are
640 long falls back from Q4_K / Q6_K to Q5_0 / Q8_0, while ffn_down (rows of 1792 = 7 * 256)
stays in k-quants (Q4_K, and Q6_K in the layers llama.cpp gives more bits). Every one of these
types has a packed format, so the whole file loads packed, nothing decoded to float, and the
logits match transformers' own import of the file (dequantized by the gguf package).
"""
import gguf
import pytest
import torch

import torch_uqr
from torch_uqr.nn import QuantEmbedding, QuantLinear

from tiny_gguf_models import (Q4_K_M_DIMS, VOCAB, more_bits_layer, q4_k_m_type, reference_model,
                              write_q4_k_m_gguf)


def test_q4_k_m_rule():
    # a 32-layer model: layers 0-3 and 28-31 (first and last eighth), and 6, 9, ..., 27 in between
    want = set(range(4)) | set(range(6, 28, 3)) | set(range(28, 32))
    assert {i for i in range(32) if more_bits_layer(i, 32)} == want
    assert [i for i in range(8) if more_bits_layer(i, 8)] == [0, 3, 6, 7]
    assert [i for i in range(4) if more_bits_layer(i, 4)] == [2, 3]
    for i in range(32):
        bump = "Q6_K" if i in want else "Q4_K"
        assert q4_k_m_type(f"blk.{i}.attn_v.weight", 4096, i, 32) == bump
        assert q4_k_m_type(f"blk.{i}.ffn_down.weight", 1120, i, 32) == ("Q8_0" if i in want else "Q5_0")
        assert q4_k_m_type(f"blk.{i}.ffn_down.weight", 14336, i, 32) == bump
        for p in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
            assert q4_k_m_type(f"blk.{i}.{p}.weight", 4096, i, 32) == "Q4_K"
            assert q4_k_m_type(f"blk.{i}.{p}.weight", 640, i, 32) == "Q5_0"
    assert q4_k_m_type("output.weight", 4096, None, 32) == "Q6_K"
    assert q4_k_m_type("output.weight", 640, None, 32) == "Q8_0"
    assert q4_k_m_type("token_embd.weight", 4096, None, 32) == "Q4_K"
    assert q4_k_m_type("token_embd.weight", 4096, None, 32, tied=True) == "Q6_K"
    assert q4_k_m_type("token_embd.weight", 640, None, 32) == "Q5_0"
    with pytest.raises(ValueError, match="multiple of 32"):
        q4_k_m_type("blk.0.attn_q.weight", 100, 0, 32)


@pytest.mark.slow  # 16-45 s on the 2-core machine (load-dependent), most of it quantizing 8 layers
def test_q4_k_m_file_loads_fully_packed_and_matches_transformers(tmp_path, monkeypatch):
    monkeypatch.setenv("UQR_CACHE", str(tmp_path / "cache"))
    path = str(tmp_path / "q4_k_m.gguf")
    types = write_q4_k_m_gguf(path)
    assert Q4_K_M_DIMS.hidden % 256 and not Q4_K_M_DIMS.ffn % 256
    assert {"Q4_K", "Q5_0", "Q6_K", "Q8_0"} <= set(types.values())  # the fallbacks and the k-quants both

    model = torch_uqr.from_pretrained(path)
    report = model.uqr_report
    assert report.dequantized == []
    assert not report.float_fallback and not report.unused and not report.tied_head
    # every 2-D weight of the file sits packed in its module, in the file's own type
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, Q4_K_M_DIMS.layers)
    packed = {names.get_name(m + ".weight", try_suffixes=(".weight",)): f.upper() for m, f in report.packed.items()}
    assert packed == {g: t for g, t in types.items() if t != "F32"}
    assert sum(isinstance(m, (QuantLinear, QuantEmbedding)) for m in model.modules()) == len(packed)
    assert not [n for n, m in model.named_modules() if type(m) is torch.nn.Linear]

    ref = reference_model(path)
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = model(ids).logits, ref(ids).logits
    rel = ((got - want).abs().max() / want.abs().max()).item()
    assert rel < 1e-3, f"max |diff| / max |logit| = {rel:.2e}"
    assert torch.equal(got.argmax(-1), want.argmax(-1))
