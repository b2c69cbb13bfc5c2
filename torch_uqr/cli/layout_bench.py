"""Direct-head attention vs transformers' transposing attention, both on the router.

``compare_layout(lm)`` times one attention block of a loaded model (q/k/v/o projections + RoPE +
SDPA) in two layouts over the same packed weights:
- direct: q/k/v written ``[B, H, M, D]`` by the router, o_proj reading that layout in place;
- transposing: transformers' LlamaAttention (``[B, M, N]`` outputs, ``view``+``transpose`` into
  heads, SDPA on strided inputs, ``transpose``+``reshape`` copy back before o_proj).
It also times a whole-model prefill both ways. Run: ``python -m torch_uqr eval --compare-layout``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def _paired_ms(fa, fb, reps: int) -> tuple[float, float]:
    """Median milliseconds of fa and fb, called alternately so load changes hit both alike."""
    fa(), fb()  # warm-up (first calls build caches)
    ta, tb = [], []
    for _ in range(reps):
        for fn, acc in ((fa, ta), (fb, tb)):
            t = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t)
    return 1e3 * statistics.median(ta), 1e3 * statistics.median(tb)


def _transposing_twin(attn, config):
    """transformers' LlamaAttention over the same packed weights (plain-layout QuantLinears)."""
    from transformers.models.llama.modeling_llama import LlamaAttention

    from ..nn import QuantLinear

    with torch.device("meta"):
        twin = LlamaAttention(config, attn.layer_idx)
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        src = getattr(attn, name)
        setattr(twin, name, QuantLinear.from_qtensor(src.qtensor, src.bias, in_features=src.in_features))
    return twin


@torch.no_grad()
def compare_layout(lm, Ms=(1, 32, 256), reps: int = 9, layer: int = 0, prefill: int = 128) -> list[dict]:
    """Milliseconds per attention block (and per whole-model prefill) in both layouts."""
    model = lm.model
    config = model.config
    direct = model.model.layers[layer].self_attn
    twin = _transposing_twin(direct, config)
    device = next(model.parameters()).device
    dtype = model.model.embed_tokens.weight.dtype
    rows = []
    for M in Ms:
        h = torch.randn(1, M, config.hidden_size, device=device, dtype=dtype)
        pos = torch.arange(M, device=device)[None]
        pe = model.model.rotary_emb(h, pos)
        d, t = _paired_ms(lambda: direct(h, position_embeddings=pe, attention_mask=None),
                          lambda: twin(h, position_embeddings=pe, attention_mask=None), reps)
        rows.append({"what": f"attention block, M={M}", "direct_ms": d, "transposing_ms": t})
    ids = torch.randint(0, config.vocab_size, (1, prefill), device=device)
    directs = [blk.self_attn for blk in model.model.layers]
    twins = [_transposing_twin(a, config) for a in directs]

    def run(attns):
        for layer_mod, attn in zip(model.model.layers, attns):
            layer_mod.self_attn = attn
        return model(input_ids=ids, use_cache=False)

    try:
        d, t = _paired_ms(lambda: run(directs), lambda: run(twins), max(1, reps // 2))
    finally:
        for layer_mod, attn in zip(model.model.layers, directs):
            layer_mod.self_attn = attn
    rows.append({"what": f"whole model prefill, M={prefill}", "direct_ms": d, "transposing_ms": t})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| what | direct-head (ms) | transposing (ms) | saved |", "|---|---|---|---|"]
    for r in rows:
        saved = 100 * (1 - r["direct_ms"] / r["transposing_ms"])
        lines.append(f"| {r['what']} | {r['direct_ms']:.2f} | {r['transposing_ms']:.2f} | {saved:.1f}% |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch_uqr eval --compare-layout")
    p.add_argument("--device", default="cpu")
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--out", default=None)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    from ..models.llama import load_llama

    lm = load_llama(device=args.device)
    md = table(compare_layout(lm, reps=args.reps))
    print(f"# {lm.describe()}, device {args.device}\n{md}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(md + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
