"""A compiled single-token decode step: static KV cache + ``torch.compile`` of the model forward.

Eager decoding of a small model is bound by Python: hundreds of small aten ops and transformers'
cache and mask bookkeeping per token. ``CompiledDecoder`` runs the prompt eagerly into a
transformers ``StaticCache`` (fixed-size key/value tensors, written at ``cache_position``) and
every later token through one ``torch.compile(fullgraph=True, dynamic=False)`` graph of the
forward for a ``[1, 1]`` input, whose shapes never change, so it compiles once. The packed
linear layers enter the graph as the opaque ``uqr::linear_gemm`` op.

Device-agnostic: on CUDA, ``mode="reduce-overhead"`` adds CUDA graphs (not tested here: this
code was only run on the CPU, where inductor generates C++ and needs a compiler).
"""
from __future__ import annotations

import time
from typing import Optional

import torch


#: Activation rows up to which a decode-only path (``nn.set_path(..., max_rows=DECODE_ROWS)``) serves
#: a layer: one sequence's step and small batches. On the 2-core AVX2 CPU of docs/perf/cpu-zen2.md
#: path int8 was 1.4-5x faster than the exact kernels at one row and 0.5x at 512 (prefill).
DECODE_ROWS = 8


class CompiledDecoder:
    """``prefill(ids)`` then ``step(token)`` calls, each returning the last position's logits [1, vocab].

    Args:
        model: a causal LM (transformers), e.g. from ``load_gguf_model``.
        max_cache_len: prompt + generated tokens the static cache holds.
        mode, backend: passed to ``torch.compile`` (``mode="reduce-overhead"``: CUDA graphs).
        compile: False runs the same static-cache step eagerly (a reference for tests).
        fuse: first ``fuse_projections(model)`` (in place; exact).
        skip_module_guards: let the compiled step skip dynamo's guards on the model's modules
            (they cost milliseconds per token); the model's modules must not be changed afterwards.
    """

    def __init__(self, model, max_cache_len: int, *, mode: Optional[str] = None, backend: str = "inductor",
                 compile: bool = True, fuse: bool = True, skip_module_guards: bool = True):
        from transformers import StaticCache

        self.model = model
        # q/k/v and gate/up as one packed gemm each: fewer op calls per token, same logits bit for bit
        self.fused = fuse_projections(model) if fuse else {}
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.max_cache_len = int(max_cache_len)
        from ..cli.generate import _cache_kwarg

        self._cache_key = _cache_kwarg(type(model.model))  # past_key_values or (transformers 5) cache
        self.cache = StaticCache(config=model.config, max_cache_len=self.max_cache_len)
        self.pos = 0
        self.compile_s = 0.0  # seconds of the first step call (tracing and code generation)
        self._compiled = False
        opts: dict = {"mode": mode}
        if skip_module_guards:
            # Checking dynamo's guards on every submodule's attributes costs milliseconds per
            # token on a 30-layer model; this step belongs to one model whose modules don't change
            # (the packed weights are still validated at run time inside uqr::linear_gemm).
            # torch.compile takes mode or options, not both: spell the mode out as its options.
            from torch._inductor import list_mode_options

            options = dict(list_mode_options(mode)) if mode not in (None, "default") else {}
            options["guard_filter_fn"] = torch.compiler.skip_guard_on_all_nn_modules_unsafe
            opts = {"options": options}
        self._step = (torch.compile(self._forward, fullgraph=True, dynamic=False, backend=backend, **opts)
                      if compile else self._forward)
        self._is_compiled = compile

    def _forward(self, ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        kw = {self._cache_key: self.cache}
        out = self.model(input_ids=ids, cache_position=cache_position, use_cache=True, logits_to_keep=1, **kw)
        return out.logits[:, -1, :]

    def reset(self) -> None:
        """Empty the cache (its tensors are kept, so the compiled step is reused)."""
        self.cache.reset()
        self.pos = 0

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """Run the prompt ``ids`` [1, n] eagerly into the cache (after ``reset``); last logits."""
        self.reset()
        n = ids.shape[-1]
        self._check_room(n)
        pos = torch.arange(n, device=self.device)
        logits = self._forward(ids.to(self.device), pos)
        self.pos = n
        return logits

    @torch.no_grad()
    def step(self, token: torch.Tensor) -> torch.Tensor:
        """One token (any tensor of one element) at the next position; its logits [1, vocab]."""
        self._check_room(1)
        ids = token.reshape(1, 1).to(self.device)
        pos = torch.tensor([self.pos], device=self.device)
        if self._is_compiled and not self._compiled:
            t0 = time.perf_counter()
            logits = self._step(ids, pos)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.compile_s = time.perf_counter() - t0
            self._compiled = True
        else:
            logits = self._step(ids, pos)
        self.pos += 1
        # reduce-overhead (CUDA graphs) reuses its output buffer on the next replay: hand out a copy
        return logits.clone() if self._is_compiled else logits

    def warm_up(self, prompt_len: int = 2) -> float:
        """Compile now (a throw-away prefill and two steps); returns the compile seconds."""
        ids = torch.zeros(1, prompt_len, dtype=torch.long)
        self.prefill(ids)
        self.step(ids[:, :1])
        self.step(ids[:, :1])
        self.reset()
        return self.compile_s

    def _check_room(self, n: int) -> None:
        if self.pos + n > self.max_cache_len:
            raise ValueError(f"static cache full: {self.pos} + {n} tokens > max_cache_len {self.max_cache_len}")


# ---- fused projections --------------------------------------------------------------------

def concat_quant_linears(layers, *, out_heads: int = 0) -> Optional["QuantLinear"]:
    """One QuantLinear whose packed rows are ``layers``' rows one after the other, or None when
    they cannot share one (format, packed K, group size, real in_features, path and its row limit, row layout or
    bias presence differ). Exact: every output row is computed from its own packed row only."""
    from ..nn.linear import QuantLinear
    from ..qtensor import QTensor

    first = layers[0]
    if not all(isinstance(m, QuantLinear) for m in layers):
        return None
    same = lambda m: (m.fmt, m.packed_in_features, m.group_size, m.in_features, m.path, m.path_max_rows, m.in_heads,  # noqa: E731
                      m.weight.dtype, m.weight.device, m.weight.dim(), m.weight.shape[1:], m.bias is None)
    if any(same(m) != same(first) for m in layers) or first.weight.dim() != 2 or first.in_heads:
        return None
    if any(m.weight.shape[0] != m.out_features for m in layers):
        return None
    data = torch.cat([m.weight for m in layers], dim=0)
    N = sum(m.out_features for m in layers)
    bias = None if first.bias is None else torch.cat([m.bias for m in layers])
    qt = QTensor._validated(data, first.fmt, (N, first.packed_in_features),
                            first.group_size or None)
    return QuantLinear(qt, bias, out_heads=out_heads, path=first.path, in_features=first.in_features,
                       path_max_rows=first.path_max_rows)


class FusedGateUpMLP(torch.nn.Module):
    """``down(act(gate(x)) * up(x))`` with gate and up as one packed projection (llama-style MLPs)."""

    def __init__(self, mlp: torch.nn.Module, gate_up):
        super().__init__()
        self.gate_up_proj, self.down_proj, self.act_fn = gate_up, mlp.down_proj, mlp.act_fn
        self.intermediate_size = mlp.gate_proj.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)


def fuse_projections(model: torch.nn.Module) -> dict:
    """Fuse each layer's q/k/v (direct-head attention) and gate/up (llama-style MLP) QuantLinears
    into one QuantLinear each, where their packed formats and K agree; returns the counts.

    For inference: the fused modules replace the originals, so the state dict's names change.
    """
    from transformers.models.llama.modeling_llama import LlamaMLP

    from .llama import DirectHeadAttention

    n = {"qkv": 0, "gate_up": 0}
    for layer in getattr(getattr(model, "model", None), "layers", ()):
        attn = getattr(layer, "self_attn", None)
        if isinstance(attn, DirectHeadAttention) and attn.qkv_proj is None:
            fused = concat_quant_linears([attn.q_proj, attn.k_proj, attn.v_proj],
                                         out_heads=attn.num_heads + 2 * attn.num_kv_heads)
            if fused is not None:
                attn.qkv_proj = fused
                del attn.q_proj, attn.k_proj, attn.v_proj
                n["qkv"] += 1
        mlp = getattr(layer, "mlp", None)
        if type(mlp) is LlamaMLP and not getattr(mlp.config, "mlp_bias", False) \
                and getattr(mlp.config, "hidden_act", "silu") == "silu":
            fused = concat_quant_linears([mlp.gate_proj, mlp.up_proj])
            if fused is not None:
                layer.mlp = FusedGateUpMLP(mlp, fused)
                n["gate_up"] += 1
    return n
