"""``save_gguf``: write a llama model on the router as a GGUF file llama.cpp reads.

The packed weights are written as they are, block for block (torch_uqr's GGUF formats are ggml's
byte layouts), under the tensor names and in the q/k row order the loader reads back: both come
from the loader's own mapping (``gguf_names``) and its probe of transformers' tensor processor
(the rotary row order), inverted. Float tensors (norms, layers left in float) are written F32.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from ..formats import table as format_table
from ..nn import QuantEmbedding, QuantLinear
from ..qtensor import QTensor
from .auto import _NotRowOnly, _row_order, gguf_architecture, gguf_names, take_rows

__all__ = ["save_gguf", "add_hparams"]


def _file_type(model: nn.Module, packed: list[str]) -> Any:
    """The ``general.file_type`` llama.cpp would write: the recipe's, else the most common type's."""
    import gguf

    recipe = getattr(model, "uqr_recipe", None)
    if recipe is not None:
        from ..recipes import get_recipe

        return gguf.LlamaFileType[get_recipe(recipe).file_type]
    if not packed:
        return gguf.LlamaFileType.ALL_F32
    top = max(set(packed), key=packed.count)
    for name in (f"MOSTLY_{top}", f"MOSTLY_{top}_M"):
        if name in gguf.LlamaFileType.__members__:
            return gguf.LlamaFileType[name]
    return gguf.LlamaFileType.GUESSED


def _rope_theta(config) -> float:
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ValueError(f"rope type {kind!r}: save_gguf writes only the default rotary embedding")
    theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise ValueError("the config has no rope_theta")
    return float(theta)


def add_hparams(w, config, name: str) -> None:
    """The sizes every decoder's GGUF declares, from a transformers config, into GGUFWriter ``w``:
    name, context length, widths, layer and head counts, RMS epsilon, vocabulary size."""
    w.add_name(name)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_block_count(config.num_hidden_layers)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_vocab_size(config.vocab_size)


def _add_metadata(w, config, name: str) -> None:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    add_hparams(w, config, name)
    w.add_rope_freq_base(_rope_theta(config))
    w.add_rope_dimension_count(head_dim)
    if head_dim * config.num_attention_heads != config.hidden_size:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)


def _add_tokenizer(w, tokenizer) -> None:
    """A byte-level BPE tokenizer of transformers (``tokenizer.ggml.model = gpt2``), as llama.cpp's
    converter writes one: tokens by id, their types, the merges, special ids, chat template."""
    import json

    backend = getattr(tokenizer, "backend_tokenizer", None)
    model = json.loads(backend.to_str())["model"] if backend is not None else {}
    if model.get("type") != "BPE":
        raise ValueError("tokenizer: save_gguf writes byte-level BPE tokenizers (gpt2 style) only; "
                         "leave tokenizer=None to write the model without one")
    vocab = tokenizer.get_vocab()
    n = max(vocab.values()) + 1
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [5] * n  # unused slots
    for tok, i in vocab.items():
        tokens[i], types[i] = tok, 1
    for i, added in tokenizer.added_tokens_decoder.items():
        tokens[i], types[i] = added.content, 3 if added.special else 4  # control / user-defined
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for attr, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id),
                      ("unk_token_id", w.add_unk_token_id), ("pad_token_id", w.add_pad_token_id)):
        tid = getattr(tokenizer, attr, None)
        if tid is not None:
            add(tid)
    w.add_add_bos_token(bool(getattr(tokenizer, "add_bos_token", False)))
    if getattr(tokenizer, "chat_template", None):
        w.add_chat_template(tokenizer.chat_template)


def save_gguf(model: nn.Module, path: str | os.PathLike, tokenizer: Optional[Any] = None, *,
              name: Optional[str] = None) -> dict[str, str]:
    """Write a llama-architecture transformers model as a GGUF file; returns {tensor name: ggml type}.

    ``QuantLinear`` and ``QuantEmbedding`` weights are written with their own blocks, byte for
    byte (nothing is quantized again), in the ggml type of their format; a head that reads the
    embedding's blocks (a tied model) is not written, as in llama.cpp's files. Float tensors
    are written F32. Rows of attn_q / attn_k are put in llama.cpp's rotary order, whole rows of
    blocks at a time (exact). ``general.file_type`` is the recipe's when the model went through
    ``quantize_model(model, recipe=...)``.

    Args:
        model: a transformers llama (or mistral) causal LM, quantized or not.
        path: the file to write.
        tokenizer: optional transformers tokenizer (byte-level BPE) whose vocabulary, merges,
            special tokens and chat template are written too.
        name: ``general.name`` (default: the config's ``name_or_path``, else ``"llama"``).

    Raises:
        ValueError: a layer in a format GGUF has no type for (the MLX family, exl3, var_affine, ternary,
            ...), or zero-padded to a whole block, naming the layer and the format; a model that
            is not llama-family; a rotary scaling llama.cpp needs extra tensors for.
    """
    import gguf

    config = getattr(model, "config", None)
    if config is None or gguf_architecture(config) != "llama":
        raise ValueError(f"save_gguf writes llama-architecture files; got a "
                         f"{getattr(config, 'model_type', type(model).__name__)!r} model")
    mapping, processor = gguf_names(model, "llama")
    by_param = {hf: g for g, hf in mapping.items()}
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    params = dict(model.named_parameters(remove_duplicate=False))
    params.update(model.named_buffers(remove_duplicate=False))

    tensors: list[tuple[str, np.ndarray, Optional[Any]]] = []
    types: dict[str, str] = {}
    packed_types: list[str] = []
    for hf in model.state_dict(keep_vars=True):
        gname = by_param.get(hf)
        if gname is None:
            if hf.endswith((".weight", ".bias")):
                raise ValueError(f"{hf}: no llama.cpp tensor name for this parameter")
            continue  # QuantLinear's weight_format / weight_shape buffers
        module_name, _, leaf = hf.rpartition(".")
        module = model.get_submodule(module_name)
        if module is head and _reads_embedding(head, emb):
            continue  # tied: llama.cpp reads the head from token_embd
        if isinstance(module, (QuantLinear, QuantEmbedding)) and leaf == "weight":
            qt = module.qtensor
            ggml = format_table.spec(qt.fmt).gguf_type
            if ggml is None:
                raise ValueError(f"{module_name}: format {qt.fmt!r} has no GGUF type; "
                                 "quantize this layer into a GGUF format to save it as GGUF")
            if isinstance(module, QuantLinear) and module.packed_in_features != module.in_features:
                raise ValueError(f"{module_name}: format {qt.fmt!r} zero-padded from K={module.in_features} to "
                                 f"{module.packed_in_features}; GGUF has no padded tensors")
            qt = _to_file_rows(processor, gname, qt, mapping)
            tensors.append((gname, qt.data.cpu().contiguous().numpy(), gguf.GGMLQuantizationType[ggml]))
            types[gname] = ggml
            packed_types.append(ggml)
        else:
            t = params[hf].detach().float().cpu()
            if t.dim() == 2:
                t = _to_file_rows(processor, gname, t, mapping)
            tensors.append((gname, t.contiguous().numpy(), None))
            types[gname] = "F32"

    w = gguf.GGUFWriter(os.fspath(path), "llama")
    _add_metadata(w, config, name or os.path.basename(str(getattr(config, "name_or_path", "") or "")) or "llama")
    w.add_file_type(_file_type(model, packed_types))
    if packed_types:
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if tokenizer is not None:
        _add_tokenizer(w, tokenizer)
    for gname, data, raw_dtype in tensors:
        w.add_tensor(gname, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return types


def _reads_embedding(head: Optional[nn.Module], emb: Optional[nn.Module]) -> bool:
    """Whether the output head uses the token embedding's own storage (a tied model)."""
    if head is None or emb is None:
        return False
    hw, ew = getattr(head, "weight", None), getattr(emb, "weight", None)
    return hw is not None and ew is not None and hw.data_ptr() == ew.data_ptr() and hw.shape == ew.shape


def _to_file_rows(processor, gname: str, w, mapping: dict):
    """``w`` with its rows in the file's order: the inverse of the order the loader applies."""
    try:
        rows = _row_order(processor, gname, w.shape[0], mapping)
    except _NotRowOnly as e:
        raise ValueError(f"{gname}: {e}; save_gguf cannot invert it") from None
    if rows is None:
        return w
    return take_rows(w, torch.argsort(rows))
