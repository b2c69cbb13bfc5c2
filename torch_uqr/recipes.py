"""llama.cpp's quantization mixes: which ggml type each weight of a model gets.

``llama-quantize model.gguf out.gguf Q4_K_M`` does not put every weight in Q4_K: it starts from
the mix's base type and raises a few tensors (llama.cpp's ``llama_tensor_get_type``). This module
states that rule for the mixes ``q4_k_m``, ``q5_k_m``, ``q6_k`` and ``q8_0`` on llama-family
models, by GGUF tensor name (``blk.3.attn_v.weight``, ``output.weight``, ...):

* the output head (and the token embedding of a model whose head is tied to it) gets Q6_K,
  or Q8_0 in the ``q8_0`` mix, or Q8_0 when its row length K is not a multiple of the base type's
  block;
* in the "_M" mixes, ``attn_v`` and ``ffn_down`` get Q6_K in the layers :func:`more_bits_layer`
  picks, and a fused ``attn_qkv`` gets one k-quant step more (Q4_K -> Q5_K, Q5_K -> Q6_K);
* every other 2-D weight, the untied token embedding included, gets the base type;
* last, a k-quant needs K to be a multiple of 256: where it is not, the weight falls back to a
  32-weight type of at least as many bits (:data:`K_QUANT_FALLBACK`), and where even 32 does not
  divide K, to F16 (the weight is left in float here).

Left out: llama.cpp's MoE (8 experts), Falcon and 70B special cases, and the importance-matrix
variants. llama.cpp counts attn_v / ffn_down tensors in file order; for a llama model that count
is the layer index, which is what is used here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from .formats import table as _table

__all__ = ["Recipe", "RECIPES", "K_QUANT_FALLBACK", "get_recipe", "more_bits_layer", "tensor_type",
           "ggml_format", "FLOAT"]

#: The type name :func:`tensor_type` returns for a weight no quantized type fits (kept in float).
FLOAT = "F16"


@dataclass(frozen=True)
class Recipe:
    """One llama.cpp mix.

    Attributes:
        name: the ``recipe=`` string (``"q4_k_m"``).
        base: ggml type of the weights the mix does not raise.
        more_bits: whether attn_v / ffn_down (and attn_qkv) get more bits (the "_M" mixes).
        file_type: the ``gguf.LlamaFileType`` member a file of this mix declares.
    """
    name: str
    base: str
    more_bits: bool
    file_type: str


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("q4_k_m", "Q4_K", True, "MOSTLY_Q4_K_M"),
    Recipe("q5_k_m", "Q5_K", True, "MOSTLY_Q5_K_M"),
    Recipe("q6_k", "Q6_K", False, "MOSTLY_Q6_K"),
    Recipe("q8_0", "Q8_0", False, "MOSTLY_Q8_0"),
)}

#: Type chosen when K is not a multiple of a k-quant's 256-weight super-block: a 32-weight type.
#: (Recent llama.cpp sends Q2_K and Q3_K to Q4_0 rather than IQ4_NL; none of the mixes here asks
#: for either.)
K_QUANT_FALLBACK: dict[str, str] = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0",
                                    "Q2_K": "IQ4_NL", "Q3_K": "IQ4_NL", "IQ4_XS": "IQ4_NL"}
_ONE_STEP_MORE = {"Q4_K": "Q5_K", "Q5_K": "Q6_K"}
_GGML_TO_FMT = {f.gguf_type: f.name for f in _table.TABLE if f.gguf_type}
_LAYER = re.compile(r"blk\.(\d+)\.")


def get_recipe(recipe: str) -> Recipe:
    """The :class:`Recipe` named ``recipe``; a ValueError lists the known ones otherwise."""
    try:
        return RECIPES[recipe]
    except (KeyError, TypeError):
        raise ValueError(f"recipe: unknown recipe {recipe!r}; expected one of {', '.join(RECIPES)}") from None


def ggml_format(ggml_type: str) -> str:
    """torch_uqr's format name for a ggml type name (``"Q4_K"`` -> ``"q4_k"``), from the format table."""
    try:
        return _GGML_TO_FMT[ggml_type]
    except KeyError:
        raise ValueError(f"ggml type {ggml_type!r} has no packed format in torch_uqr") from None


def _block(ggml_type: str) -> int:
    return _table.spec(ggml_format(ggml_type)).block


def more_bits_layer(layer: int, n_layers: int) -> bool:
    """Whether llama.cpp's "_M" mixes give ``layer`` more bits: the first and the last eighth of
    the layers (by integer division), and every third layer in between, counting from the end of
    the first eighth (its layers 2, 5, 8, ...)."""
    eighth = n_layers // 8
    return layer < eighth or layer >= 7 * n_layers // 8 or (layer - eighth) % 3 == 2


def tensor_type(recipe: str, gguf_name: str, K: int, n_layers: int,
                tied: bool = False) -> tuple[str, Optional[str]]:
    """``(ggml type, reason)`` for the 2-D weight ``gguf_name`` (row length ``K``) under ``recipe``.

    ``reason`` is None when the mix's own choice fits K, else says which fallback was taken;
    the type :data:`FLOAT` means no quantized type fits K (llama.cpp writes F16 there). ``tied``:
    the model has no separate output head, so the token embedding doubles as it.
    """
    r = get_recipe(recipe)
    head_type = "Q8_0" if r.base == "Q8_0" else "Q6_K"
    layer = _LAYER.match(gguf_name)
    if gguf_name == "output.weight" or (tied and gguf_name == "token_embd.weight"):
        # llama.cpp checks the head's K against the base type's block and writes Q8_0 at once.
        want = head_type
        if K % _block(r.base) and K % _block("Q8_0") == 0:
            return "Q8_0", f"Q8_0 instead of {head_type} (K % {_block(r.base)} != 0)"
    elif r.more_bits and layer and gguf_name.endswith(("attn_v.weight", "ffn_down.weight")) \
            and more_bits_layer(int(layer.group(1)), n_layers):
        want = "Q6_K"
    elif r.more_bits and gguf_name.endswith("attn_qkv.weight"):
        want = _ONE_STEP_MORE.get(r.base, r.base)
    else:
        want = r.base
    if K % _block(want) == 0:
        return want, None
    got = K_QUANT_FALLBACK.get(want, FLOAT)
    if got != FLOAT and K % _block(got):
        got = FLOAT
    why = "kept in float" if got == FLOAT else got
    return got, f"{why} instead of {want} (K % {_block(want)} != 0)"
