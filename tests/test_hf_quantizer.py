"""Hugging Face checkpoints quantized while transformers loads them: ``quantization_config=UqrConfig(...)``."""
import pytest
import torch

import torch_uqr
from torch_uqr.nn import QuantLinear


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                                   initializer_range=0.1)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("hf_ckpt")
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    return str(folder)


def _float(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.mark.parametrize("fmt", ["q4_0", "mlx4"])
def test_quantized_on_load_equals_quantize_model(checkpoint, fmt):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32,
                                                 quantization_config=torch_uqr.UqrConfig(fmt=fmt)).eval()
    ref = _float(checkpoint)
    summary = torch_uqr.quantize_model(ref, fmt, progress=False, verbose=False)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, (QuantLinear, torch.nn.Linear))}
    assert len(linears) == len(summary.swapped) == 2 * 7 + 1
    assert all(isinstance(m, QuantLinear) and m.fmt == fmt for m in linears.values())
    for name, m in linears.items():  # the same bytes as quantizing the float model afterwards
        assert torch.equal(m.weight, ref.get_submodule(name).weight)
    ids = torch.randint(0, 300, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)


def test_skip_and_from_pretrained_folder(checkpoint):
    config = torch_uqr.UqrConfig("q8_0", skip=["lm_head", "*.down_proj"])
    model = torch_uqr.from_pretrained(checkpoint, quantization_config=config)
    assert type(model.lm_head) is torch.nn.Linear and type(model.model.layers[1].mlp.down_proj) is torch.nn.Linear
    assert isinstance(model.model.layers[1].mlp.up_proj, QuantLinear)
    ids = torch.randint(0, 300, (1, 5), generator=torch.Generator().manual_seed(1))
    out = model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape == (1, 9)


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="unknown format"):
        torch_uqr.UqrConfig(fmt="q3_z")
