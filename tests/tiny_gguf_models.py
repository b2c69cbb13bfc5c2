"""Tiny random transformers models of several architectures, written as GGUF files the way
llama.cpp's converter writes them: gguf's tensor names, q/k rows in llama.cpp's rotary order for
llama-architecture files, Gemma norms stored as 1 + w, fused Phi-3 projections kept fused, and
the linear weights in a mix of packed ggml types made by torch_uqr's quantizers (or, for
``write_q4_k_m_gguf``, in the types llama.cpp's Q4_K_M recipe picks: ``q4_k_m_type``).

Every file carries a small byte-level BPE tokenizer (the 256 byte symbols, a few merges, ChatML
special tokens and a chat template), so transformers' GGUF tokenizer loading, ``apply_chat_template``
and the command line work on it.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable

import gguf
import numpy as np
import torch

import torch_uqr
from torch_uqr.models.export import add_hparams
from torch_uqr.nn import block_size_of
from torch_uqr.recipes import FLOAT, K_QUANT_FALLBACK, more_bits_layer, tensor_type  # noqa: F401 (re-exported)

T = gguf.GGMLQuantizationType
HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, CTX = 128, 256, 2, 4, 2, 32, 512
ROPE_THETA = 10000.0


@dataclass(frozen=True)
class Dims:
    """A tiny model's sizes; head_dim None keeps the architecture's own (``ARCHS`` overrides)."""
    hidden: int = HIDDEN
    ffn: int = FFN
    layers: int = LAYERS
    heads: int = HEADS
    kv_heads: int = KV_HEADS
    head_dim: int | None = None


DIMS = Dims()

# name -> (transformers config class, config overrides, GGUF architecture, general.name, tied head)
ARCHS = {
    "llama": ("LlamaConfig", {"head_dim": HEAD_DIM}, "llama", "tiny-llama", False),
    "mistral": ("MistralConfig", {"head_dim": HEAD_DIM, "sliding_window": None}, "llama", "mistral", False),
    "qwen2": ("Qwen2Config", {}, "qwen2", "tiny-qwen2", True),
    "qwen3": ("Qwen3Config", {"head_dim": 128}, "qwen3", "tiny-qwen3", False),
    "gemma2": ("Gemma2Config", {"head_dim": HEAD_DIM, "sliding_window": 16}, "gemma2", "tiny-gemma2", True),
    "gemma3": ("Gemma3TextConfig", {"head_dim": HEAD_DIM, "sliding_window": 16}, "gemma3", "tiny-gemma3", True),
    "phi3": ("Phi3Config", {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}, "phi3", "tiny-phi3", False),
}
PACKED = ("q4_0", "q8_0", "q4_1", "q4_k")  # cycled over the linear weights, where the block fits K
# Tensors written in a ggml type torch_uqr has no packed format for (decoded to float on load).
NON_NATIVE = {"llama": {"blk.1.ffn_gate.weight": T.NVFP4}}



def nvfp4_blocks(shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    """Random NVFP4 blocks (gguf has no NVFP4 quantizer): 4-bit codes under one small E4M3 scale
    per 16 weights (0x08: 2^-7), so the weights have the tiny models' magnitude."""
    rows, k = shape
    raw = np.random.default_rng(seed).integers(0, 256, size=(rows, k // 64, 36), dtype=np.uint8)
    raw[..., :4] = 0x08
    return raw.reshape(rows, -1)


CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
                 "+ '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                 "{% endif %}")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _byte_symbols() -> list[str]:
    """The byte-level BPE alphabet: printable bytes stand for themselves, the rest for code points >= 256."""
    keep = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def _tokenizer() -> tuple[list[str], list[str], list[int]]:
    """(tokens, merges, token types) of the tiny tokenizer."""
    merges = ["\u0120 t", "h e", "\u0120t he", "\u0120 a", "i n", "\u0120 s"]
    tokens = list(SPECIALS) + _byte_symbols() + [m.replace(" ", "") for m in merges]
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))  # 3: control token
    return tokens, merges, types


VOCAB = len(_tokenizer()[0])


def _add_tokenizer(w: "gguf.GGUFWriter") -> None:
    tokens, merges, types = _tokenizer()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(SPECIALS.index("<|im_start|>"))
    w.add_eos_token_id(SPECIALS.index("<|im_end|>"))
    w.add_unk_token_id(SPECIALS.index("<|endoftext|>"))
    w.add_pad_token_id(SPECIALS.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


def tiny_model(name: str, seed: int = 0, dims: Dims = DIMS):
    """A random transformers causal LM of architecture ``name`` (weights large enough for clear argmaxes)."""
    import transformers

    cls, extra, _, _, tied = ARCHS[name]
    if dims.head_dim is not None:
        extra = {**extra, "head_dim": dims.head_dim}
    cfg = getattr(transformers, cls)(vocab_size=VOCAB, hidden_size=dims.hidden, intermediate_size=dims.ffn,
                                     num_hidden_layers=dims.layers, num_attention_heads=dims.heads,
                                     num_key_value_heads=dims.kv_heads, max_position_embeddings=CTX,
                                     rms_norm_eps=1e-6, tie_word_embeddings=tied, initializer_range=0.1, **extra)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # norms away from 1, so that a missed "1 + w" or scale shows
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(torch.rand_like(p) * 0.5 + 0.75 if "gemma" not in name else torch.rand_like(p) * 0.5 - 0.25)
            elif n.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.1)
    return model.eval()


def _rotary_interleaved(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """transformers keeps a head's two rotary halves as two row blocks; llama.cpp pairs them row by row."""
    d = w.shape[0] // n_heads
    return w.reshape(n_heads, 2, d // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


# (gguf tensor name, row length K, layer or None, number of layers) -> ggml type name
TypeChooser = Callable[[str, int, "int | None", int], str]


def write_tiny_gguf(name: str, path: str, seed: int = 0, *, dims: Dims = DIMS,
                    choose_type: TypeChooser | None = None, non_native: dict | None = None) -> dict:
    """Write architecture ``name`` to ``path``; returns {gguf tensor name: ggml type name}.

    Without ``choose_type`` the linear weights cycle through ``PACKED`` (the token embedding
    Q8_0); with it, each 2-D tensor gets the type it names. ``non_native`` ({gguf name: ggml
    type}) defaults to ``NON_NATIVE[name]``; those tensors are written as random NVFP4 blocks.
    """
    model = tiny_model(name, seed, dims)
    cfg = model.config
    _, _, arch, general_name, tied = ARCHS[name]
    if non_native is None:
        non_native = NON_NATIVE.get(name, {})
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_id, dims.layers)
    w = gguf.GGUFWriter(path, arch)
    add_hparams(w, cfg, general_name)  # CTX, the dims, eps 1e-6 and VOCAB, from tiny_model's config
    w.add_rope_freq_base(ROPE_THETA)
    if arch == "llama":
        w.add_rope_dimension_count(cfg.head_dim)
    if name.startswith("gemma"):
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
        w.add_sliding_window(cfg.sliding_window)
    _add_tokenizer(w)

    types: dict[str, str] = {}
    linear_i = 0
    for hf_name, p in model.state_dict().items():
        if tied and hf_name == "lm_head.weight":
            continue
        gname = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert gname is not None, f"{name}: no GGUF name for {hf_name}"
        t = p.detach().float()
        if arch == "llama" and gname.endswith(("attn_q.weight", "attn_k.weight")):
            t = _rotary_interleaved(t, dims.heads if ".attn_q." in gname else dims.kv_heads)
        if name.startswith("gemma") and gname.endswith("norm.weight"):
            t = t + 1  # llama.cpp stores Gemma's (1 + w) RMSNorm weight as the full factor
        special = non_native.get(gname)
        if special is not None:
            w.add_tensor(gname, nvfp4_blocks(t.shape, seed=linear_i), raw_dtype=special)
            types[gname] = special.name
        elif t.dim() == 2:
            if choose_type is not None:
                layer = re.match(r"blk\.(\d+)\.", gname)
                fmt = choose_type(gname, t.shape[1], layer and int(layer.group(1)), dims.layers).lower()
            else:
                fmts = [f for f in PACKED if t.shape[1] % block_size_of(f) == 0]
                fmt = "q8_0" if gname == "token_embd.weight" else fmts[linear_i % len(fmts)]
            linear_i += 1
            qt = torch_uqr.quantize(t, fmt)
            w.add_tensor(gname, qt.data.numpy(), raw_dtype=T[fmt.upper()])
            types[gname] = fmt.upper()
        else:
            w.add_tensor(gname, t.numpy())
            types[gname] = "F32"
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return types


def q4_k_m_type(gguf_name: str, K: int, layer: int | None, n_layers: int, tied: bool = False) -> str:
    """The ggml type llama.cpp's ``llama-quantize ... Q4_K_M`` gives a 2-D weight of a llama model
    (``torch_uqr.recipes.tensor_type``; ``layer`` is read from the name there). Raises where no
    quantized type fits K (llama.cpp writes F16 there; the tiny models never need it)."""
    ggml, _ = tensor_type("q4_k_m", gguf_name, K, n_layers, tied)
    if ggml == FLOAT:
        raise ValueError(f"{gguf_name}: K={K} is not a multiple of 32")
    return ggml


# A llama model whose hidden size (640) is not a multiple of 256, so most Q4_K_M weights fall back
# to 32-weight types; FFN 1792 = 7 * 256 keeps ffn_down in k-quants; 8 layers give every branch of
# the more-bits rule (layer 0: first eighth, 3 and 6: every third, 7: last eighth).
Q4_K_M_DIMS = Dims(hidden=640, ffn=1792, layers=8, heads=10, kv_heads=2, head_dim=64)


def write_q4_k_m_gguf(path: str, seed: int = 0, non_native: dict | None = None) -> dict:
    """The llama model of ``Q4_K_M_DIMS`` with llama.cpp's Q4_K_M type mix; {gguf name: ggml type}."""
    return write_tiny_gguf("llama", path, seed, dims=Q4_K_M_DIMS, choose_type=q4_k_m_type,
                           non_native=non_native or {})


def reference_model(path: str):
    """transformers' own GGUF import of ``path`` (every tensor dequantized by gguf), float32.

    A mistral file (llama architecture, general.name "mistral") is loaded by the same code with
    the tensor names looked up for llama: transformers' ``from_pretrained`` asks gguf for a
    "mistral" name table, which gguf does not have.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, fname = os.path.split(os.path.abspath(path))
    config = AutoConfig.from_pretrained(folder, gguf_file=fname)
    if config.model_type != "mistral":
        return AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32).eval()
    with torch.device("meta"):
        names_from = AutoModelForCausalLM.from_config(
            LlamaConfig(**{k: v for k, v in config.to_dict().items() if k != "model_type"}))
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=names_from)["tensors"]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(tensors, strict=True)
    return model.eval()
