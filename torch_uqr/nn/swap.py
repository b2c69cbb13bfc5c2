"""``quantize_model``: replace every ``nn.Linear`` of a model by a ``QuantLinear``, in place."""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Union

from torch import nn

from ..formats import table as format_table
from ..qtensor import quantize
from ..recipes import FLOAT, get_recipe, ggml_format, tensor_type
from .embedding import QuantEmbedding
from .linear import QuantLinear, block_size_of

__all__ = ["quantize_model", "SwapSummary", "layer_format"]

Skip = Union[None, str, Iterable[str], Callable[[str, nn.Module], bool]]


@dataclass
class SwapSummary:
    """What ``quantize_model`` did: per-layer formats, fallbacks and bytes before/after."""

    fmt: str
    swapped: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    formats: dict[str, str] = field(default_factory=dict)
    fallbacks: dict[str, str] = field(default_factory=dict)   # layer -> why it is not in `fmt`
    bytes_before: int = 0
    bytes_after: int = 0
    weights: int = 0
    weights_in_fmt: int = 0
    kept: dict[str, str] = field(default_factory=dict)        # layer left as it was -> its format
    recipe: Optional[str] = None                              # the llama.cpp mix, if one was asked for

    @property
    def share_in_fmt(self) -> float:
        """Fraction of swapped weights stored in the requested format (the rest fell back)."""
        return self.weights_in_fmt / self.weights if self.weights else 0.0

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.bytes_after / self.weights if self.weights else 0.0

    def __str__(self) -> str:
        what = f"the {self.recipe} mix's own types" if self.recipe else self.fmt
        lines = [f"quantize_model({self.fmt}): {len(self.swapped)} linear layers swapped, "
                 f"{len(self.skipped)} skipped; {self.bytes_before / 2**20:.1f} MiB -> "
                 f"{self.bytes_after / 2**20:.1f} MiB ({self.bits_per_weight:.2f} bits/weight), "
                 f"{100 * self.share_in_fmt:.1f}% of weights in {what}"]
        if self.recipe:
            counts: dict[str, int] = {}
            for f in self.formats.values():
                counts[f] = counts.get(f, 0) + 1
            lines.append("  formats: " + ", ".join(f"{f} x {n}" for f, n in sorted(counts.items())))
        if self.kept:
            lines.append("  kept as they were: " + ", ".join(f"{n} ({f})" for n, f in self.kept.items()))
        if self.fallbacks:
            reasons: dict[str, int] = {}
            for why in self.fallbacks.values():
                reasons[why] = reasons.get(why, 0) + 1
            for why, n in sorted(reasons.items()):
                lines.append(f"  {n} layers: {why}")
        return "\n".join(lines)


def _skipper(skip: Skip) -> Callable[[str, nn.Module], bool]:
    if skip is None:
        return lambda name, mod: False
    if callable(skip):
        return skip
    patterns = [skip] if isinstance(skip, str) else list(skip)
    return lambda name, mod: any(fnmatch.fnmatchcase(name, p) or name == p for p in patterns)


def layer_format(in_features: int, fmt: str, fallback: str, **opts) -> tuple[str, dict, bool, Optional[str]]:
    """Pick the format for a layer of width ``in_features``: ``(fmt, opts, pad, reason)``.

    ``reason`` is None when the requested format fits as asked. Otherwise (K not a multiple of the
    block): a grouped (MLX-family) format first tries a smaller group size that divides K; then ``fallback`` decides:
    ``"pad"`` zero-pads K up to the block, ``"error"`` raises, any format name is used instead.
    """
    block = block_size_of(fmt, **opts)
    if in_features % block == 0:
        return fmt, opts, False, None
    if fmt in format_table.BY_NAME and format_table.BY_NAME[fmt].grouped:
        for g in sorted(format_table.BY_NAME[fmt].group_sizes, reverse=True):
            if g < block and in_features % g == 0:
                return fmt, {**opts, "group_size": g}, False, f"{fmt} group_size {block} -> {g} (K % {block} != 0)"
    if fallback == "pad":
        return fmt, opts, True, f"{fmt} zero-padded to a multiple of {block} (K % {block} != 0)"
    if fallback == "error":
        raise ValueError(f"in_features={in_features} is not a multiple of {fmt}'s block size {block}")
    if in_features % block_size_of(fallback) != 0:
        raise ValueError(f"fallback {fallback!r} does not fit in_features={in_features} either")
    return fallback, {}, False, f"{fallback} instead of {fmt} (K % {block} != 0)"


def _record(summary: SwapSummary, name: str, weight, new_bytes: int, layer_fmt: str, in_fmt: bool,
            why: Optional[str]) -> None:
    n_w = weight.numel()
    summary.formats[name] = layer_fmt
    summary.bytes_before += n_w * weight.element_size()
    summary.bytes_after += new_bytes
    summary.weights += n_w
    if in_fmt:
        summary.weights_in_fmt += n_w
    if why is not None:
        summary.fallbacks[name] = why


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def quantize_model(model: nn.Module, fmt: Optional[str] = None, skip: Skip = None, *, recipe: Optional[str] = None,
                   fallback: Optional[str] = None, progress: bool = True, verbose: bool = True,
                   **opts) -> SwapSummary:
    """Replace every ``nn.Linear`` in ``model`` (in place) by a QuantLinear holding ``fmt`` blocks,
    or the blocks llama.cpp's mix ``recipe`` picks for each layer.

    Args:
        model: any module; tied weights are quantized once per Linear (each gets its own bytes).
            With ``recipe``: a transformers model (its config names the layers).
        fmt: one of ``torch_uqr.formats()``. Exactly one of ``fmt`` and ``recipe`` is given.
        skip: layer names or fnmatch patterns (``"lm_head"``, ``"*.mlp.*"``), or a predicate
            ``(name, module) -> bool``, for layers to keep in float.
        recipe: ``"q4_k_m"``, ``"q5_k_m"``, ``"q6_k"`` or ``"q8_0"``: each linear weight gets the
            ggml type ``llama-quantize`` gives it (see :mod:`torch_uqr.recipes`), fallbacks for
            row lengths that are not a multiple of 256 included; the token embedding becomes a
            ``QuantEmbedding`` of its type, and a head tied to it a QuantLinear over the same
            bytes. ``torch_uqr.save_gguf`` then writes the model as llama.cpp's file of that mix.
        fallback: with ``fmt``, what to do when a layer's in_features is not a multiple of the
            format's block (see ``layer_format``): ``"pad"`` (the default: zero-pad K, so every
            weight really is in ``fmt``; the padding shows in the bits per weight), a format name
            such as ``"q8_0"``, or ``"error"``. A recipe has its own fallbacks.
            Every fallback is listed in the returned summary; none is silent.
        progress: show a tqdm bar over layers.
        verbose: print the summary.
        **opts: passed to ``torch_uqr.quantize`` (e.g. ``group_size=32`` for mlx4); not with a recipe.
    """
    if (fmt is None) == (recipe is None):
        raise ValueError("quantize_model: give exactly one of fmt= and recipe=")
    if recipe is not None:
        if fallback is not None or opts:
            raise ValueError(f"recipe={recipe!r} chooses its own formats and fallbacks; fallback= and "
                             f"format options ({sorted(opts)}) apply to fmt= only")
        summary = _quantize_recipe(model, recipe, _skipper(skip), progress)
    else:
        summary = _quantize_fmt(model, fmt, _skipper(skip), fallback or "pad", progress, opts)
    if verbose:
        print(summary)
    return summary


def _quantize_fmt(model: nn.Module, fmt: str, should_skip, fallback: str, progress: bool, opts: dict) -> SwapSummary:
    from tqdm.auto import tqdm

    summary = SwapSummary(fmt)
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    for name, lin in tqdm(linears, desc=f"quantize {fmt}", disable=not progress, leave=False):
        if should_skip(name, lin):
            summary.skipped.append(name)
            continue
        layer_fmt, layer_opts, pad, why = layer_format(lin.in_features, fmt, fallback, **opts)
        q = QuantLinear.from_linear(lin, layer_fmt, pad=pad, **layer_opts)
        _set_module(model, name, q)
        summary.swapped.append(name)
        # padded or regrouped layers still use the requested format
        _record(summary, name, lin.weight, q.weight.numel(), layer_fmt, layer_fmt == fmt, why)
    return summary


def _quantize_recipe(model: nn.Module, recipe: str, should_skip, progress: bool) -> SwapSummary:
    from tqdm.auto import tqdm

    from ..models.auto import _module_name, gguf_architecture, gguf_names, tie_packed_head

    r = get_recipe(recipe)
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "get_input_embeddings"):
        raise ValueError(f"recipe={recipe!r} needs a transformers model (a PreTrainedModel with a config): "
                         f"the mix picks each weight's type by its llama.cpp tensor name")
    mapping, _ = gguf_names(model, gguf_architecture(config))
    role = {hf[: -len(".weight")]: g for g, hf in mapping.items() if hf.endswith(".weight")}
    n_layers = (config.get_text_config() if hasattr(config, "get_text_config") else config).num_hidden_layers
    summary = SwapSummary(r.name, recipe=r.name)

    def choose(name: str, K: int, tied: bool = False) -> tuple[str, Optional[str]]:
        if name not in role:
            raise ValueError(f"recipe={recipe!r}: layer {name!r} has no llama.cpp tensor name, so the mix has no "
                             "type for it; keep it in float with skip=")
        return tensor_type(r.name, role[name], K, n_layers, tied)

    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = isinstance(emb, nn.Embedding) and isinstance(head, nn.Linear) and head.weight is emb.weight
    head_name = _module_name(model, head) if isinstance(head, nn.Linear) else None
    if isinstance(emb, nn.Embedding):
        emb_name = _module_name(model, emb)
        ggml, why = choose(emb_name, emb.embedding_dim, tied)
        if should_skip(emb_name, emb) or ggml == FLOAT:
            summary.kept[emb_name] = str(emb.weight.dtype).replace("torch.", "")
            if why is not None:
                summary.fallbacks[emb_name] = why
            if tied:  # the head stays tied to the float table
                summary.kept[head_name] = summary.kept[emb_name]
        else:
            fmt = ggml_format(ggml)
            qemb = QuantEmbedding.from_embedding(emb, quantize(emb.weight.detach().float(), fmt))
            _set_module(model, emb_name, qemb)
            _record(summary, emb_name, emb.weight, qemb.weight.numel(), fmt, why is None, why)
            if tied:  # the head reads the embedding's blocks, as in llama.cpp's file without output.weight
                tie_packed_head(model)
                summary.swapped.append(head_name)
                summary.formats[head_name] = fmt
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and not (tied and n == head_name)]
    for name, lin in tqdm(linears, desc=f"quantize {r.name}", disable=not progress, leave=False):
        if should_skip(name, lin):
            summary.skipped.append(name)
            continue
        ggml, why = choose(name, lin.in_features)
        if ggml == FLOAT:
            summary.kept[name] = str(lin.weight.dtype).replace("torch.", "")
            summary.fallbacks[name] = why
            continue
        q = QuantLinear.from_linear(lin, ggml_format(ggml))
        _set_module(model, name, q)
        summary.swapped.append(name)
        _record(summary, name, lin.weight, q.weight.numel(), q.fmt, why is None, why)
    model.uqr_recipe = r.name
    return summary


def set_path(model: nn.Module, path: Optional[str], max_rows: Optional[int] = None) -> dict[str, int]:
    """Set the router ``path`` of every ``QuantLinear`` in ``model`` whose format has it on the
    backend that serves its weights' device; the others keep theirs. With ``max_rows``, the path
    serves calls of at most that many activation rows and larger ones take ``"auto"``
    (``QuantLinear.path_max_rows``).

    ``set_path(model, "int8", max_rows=8)`` gives a loaded GGUF model's decode steps llama.cpp's
    CPU arithmetic: activations rounded to int8 per weight block and integer dot products, for
    every layer whose format has an int8 kernel there (a few 1e-3 relative error per layer; see
    ``torch_uqr.gemm``), while prefill keeps the exact path, which is faster there at hundreds of
    rows. ``None`` or ``"auto"`` puts every layer back on the exact default.

    Returns:
        ``{"set": layers now on path, "kept": layers whose format has no such path}``.
    """
    from ..ops import PATHS, backend_of_device

    if path not in (None,) + tuple(PATHS):
        raise ValueError(f"path: expected None or one of {PATHS}, got {path!r}")
    if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1):
        raise ValueError(f"max_rows: expected None or a positive int, got {max_rows!r}")
    counts = {"set": 0, "kept": 0}
    for module in model.modules():
        if not isinstance(module, QuantLinear):
            continue
        backend = backend_of_device(module.weight.device)
        if path in (None, "auto") or (backend is not None and path in format_table.spec(module.fmt).paths(backend)):
            module.path = None if path == "auto" else path
            module.path_max_rows = None if module.path is None else max_rows
            counts["set"] += 1
        else:
            counts["kept"] += 1
    return counts
