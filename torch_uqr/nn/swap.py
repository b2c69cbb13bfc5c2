"""``quantize_model``: replace every ``nn.Linear`` of a model by a ``QuantLinear``, in place."""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Union

from torch import nn

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

    @property
    def share_in_fmt(self) -> float:
        """Fraction of swapped weights stored in the requested format (the rest fell back)."""
        return self.weights_in_fmt / self.weights if self.weights else 0.0

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.bytes_after / self.weights if self.weights else 0.0

    def __str__(self) -> str:
        lines = [f"quantize_model({self.fmt}): {len(self.swapped)} linear layers swapped, "
                 f"{len(self.skipped)} skipped; {self.bytes_before / 2**20:.1f} MiB -> "
                 f"{self.bytes_after / 2**20:.1f} MiB ({self.bits_per_weight:.2f} bits/weight), "
                 f"{100 * self.share_in_fmt:.1f}% of weights in {self.fmt}"]
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
    block): mlx4 first tries a smaller group size that divides K; then ``fallback`` decides:
    ``"pad"`` zero-pads K up to the block, ``"error"`` raises, any format name is used instead.
    """
    block = block_size_of(fmt, **opts)
    if in_features % block == 0:
        return fmt, opts, False, None
    if fmt == "mlx4":
        for g in (128, 64, 32):
            if g < block and in_features % g == 0:
                return fmt, {**opts, "group_size": g}, False, f"mlx4 group_size {block} -> {g} (K % {block} != 0)"
    if fallback == "pad":
        return fmt, opts, True, f"{fmt} zero-padded to a multiple of {block} (K % {block} != 0)"
    if fallback == "error":
        raise ValueError(f"in_features={in_features} is not a multiple of {fmt}'s block size {block}")
    if in_features % block_size_of(fallback) != 0:
        raise ValueError(f"fallback {fallback!r} does not fit in_features={in_features} either")
    return fallback, {}, False, f"{fallback} instead of {fmt} (K % {block} != 0)"


def quantize_model(model: nn.Module, fmt: str, skip: Skip = None, *, fallback: str = "pad",
                   progress: bool = True, verbose: bool = True, **opts) -> SwapSummary:
    """Replace every ``nn.Linear`` in ``model`` (in place) by a QuantLinear holding ``fmt`` blocks.

    Args:
        model: any module; tied weights are quantized once per Linear (each gets its own bytes).
        fmt: one of ``torch_uqr.formats()``.
        skip: layer names or fnmatch patterns (``"lm_head"``, ``"*.mlp.*"``), or a predicate
            ``(name, module) -> bool``, for layers to keep in float.
        fallback: what to do when a layer's in_features is not a multiple of the format's block
            (see ``layer_format``): ``"pad"`` (default: zero-pad K, so every weight really is in
            ``fmt``; the padding shows in the bits per weight), a format name such as ``"q8_0"``,
            or ``"error"``.
            Every fallback is listed in the returned summary; none is silent.
        progress: show a tqdm bar over layers.
        verbose: print the summary.
        **opts: passed to ``torch_uqr.quantize`` (e.g. ``group_size=32`` for mlx4).
    """
    from tqdm.auto import tqdm

    should_skip = _skipper(skip)
    summary = SwapSummary(fmt)
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    for name, lin in tqdm(linears, desc=f"quantize {fmt}", disable=not progress, leave=False):
        if should_skip(name, lin):
            summary.skipped.append(name)
            continue
        layer_fmt, layer_opts, pad, why = layer_format(lin.in_features, fmt, fallback, **opts)
        q = QuantLinear.from_linear(lin, layer_fmt, pad=pad, **layer_opts)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, q)
        n_w = lin.out_features * lin.in_features
        summary.swapped.append(name)
        summary.formats[name] = layer_fmt
        summary.bytes_before += lin.weight.numel() * lin.weight.element_size()
        summary.bytes_after += q.weight.numel()
        summary.weights += n_w
        if layer_fmt == fmt:  # padded or regrouped layers still use the requested format
            summary.weights_in_fmt += n_w
        if why is not None:
            summary.fallbacks[name] = why
    if verbose:
        print(summary)
    return summary
