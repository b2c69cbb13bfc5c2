"""``python -m torch_uqr eval``: perplexity of the default model in every format.

Rows: the float reference (transformers' own GGUF import, every tensor decoded by the ``gguf``
package), the file's native blocks on the router, and each of our formats re-quantized from
those float weights. Columns: bits per weight of the linear layers as stored, perplexity, its
ratio to the float model, and top-1 next-token agreement with the float model.

The text is ``torch_uqr/data/julius_caesar_act1_sc1-2.txt`` (public domain, see data/README.md),
scored in non-overlapping windows.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Optional

import torch

DATA_FILE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "julius_caesar_act1_sc1-2.txt")


@dataclass
class EvalRow:
    name: str
    bits_per_weight: float      # linear layers only, as stored (padding included)
    share_in_fmt: float         # fraction of linear weights stored in the named format
    nll: float                  # mean negative log-likelihood per predicted token
    agreement: float            # top-1 agreement with the float model (1.0 for the float row)
    tokens: int
    seconds: float
    note: str = ""

    @property
    def ppl(self) -> float:
        return math.exp(self.nll)


def text_ids(tokenizer, max_tokens: Optional[int] = None) -> torch.Tensor:
    """Token ids of the evaluation text (optionally only the first ``max_tokens``)."""
    with open(DATA_FILE, encoding="utf-8") as f:
        ids = tokenizer(f.read(), return_tensors="pt", add_special_tokens=False)["input_ids"][0]
    return ids[:max_tokens] if max_tokens else ids


@torch.no_grad()
def score(model, ids: torch.Tensor, window: int, ref_top1: Optional[list] = None):
    """NLL sum, predicted-token count, per-window top-1 ids and agreement count with ``ref_top1``."""
    device = next(model.parameters()).device
    nll, count, agree, top1 = 0.0, 0, 0, []
    for w, start in enumerate(range(0, ids.numel() - 1, window)):
        chunk = ids[start:start + window + 1].to(device)
        if chunk.numel() < 2:
            break
        logits = model(input_ids=chunk[None, :-1], use_cache=False).logits[0].float()
        target = chunk[1:]
        nll += torch.nn.functional.cross_entropy(logits, target, reduction="sum").item()
        count += target.numel()
        pred = logits.argmax(-1).cpu()
        top1.append(pred)
        if ref_top1 is not None:
            agree += int((pred == ref_top1[w]).sum())
    return nll, count, top1, agree


def _linear_bits(model) -> tuple[float, int]:
    from ..nn import QuantLinear

    bits = weights = 0
    for m in model.modules():
        if isinstance(m, QuantLinear):
            bits += 8 * m.weight.numel()
            weights += m.out_features * m.in_features
        elif isinstance(m, torch.nn.Linear):
            bits += m.weight.numel() * m.weight.element_size() * 8
            weights += m.weight.numel()
    return bits / max(weights, 1), weights


def run_eval(formats: list[str], *, max_tokens: Optional[int] = None, window: int = 1024,
             device: str = "cpu", fallback: str = "pad", keep=None, include_float: bool = True,
             include_native: bool = True, log=print) -> list[EvalRow]:
    """Evaluate the default GGUF model: float, native blocks, then each format in ``formats``.

    ``keep``: layers each re-quantized row leaves as the file has them (default: the output head;
    see ``models.llama.requantize``).
    """
    from ..models.llama import KEEP_DEFAULT, default_gguf_path, load_gguf, load_llama, load_reference, load_tokenizer
    from ..nn import QuantLinear

    keep = KEEP_DEFAULT if keep is None else keep

    path = default_gguf_path()
    tokenizer = load_tokenizer(path)
    ids = text_ids(tokenizer, max_tokens)
    rows: list[EvalRow] = []
    t = time.perf_counter()
    ref = load_reference(path).to(device)
    nll, n, ref_top1, _ = score(ref, ids, window)
    bpw, _ = _linear_bits(ref)
    if include_float:
        rows.append(EvalRow("float (gguf-decoded)", bpw, 1.0, nll / n, 1.0, n, time.perf_counter() - t))
        log(_row_line(rows[-1], rows[0]))
    del ref
    ckpt = load_gguf(path)
    todo = (["native"] if include_native else []) + list(formats)
    for name in todo:
        t = time.perf_counter()
        lm = load_llama(path, ckpt=ckpt, device=device, fmt=None if name == "native" else name, keep=keep,
                        fallback=fallback)
        nll, n, _, agree = score(lm.model, ids, window, ref_top1)
        bpw, n_weights = _linear_bits(lm.model)
        if name == "native":
            kinds = sorted(set(lm.weight_formats.values()))
            row = EvalRow("native GGUF (" + "+".join(kinds) + ")", bpw, 1.0, nll / n, agree / n, n,
                          time.perf_counter() - t)
        else:
            s = lm.summary
            reasons = sorted(set(s.fallbacks.values()))
            notes = [f"{len(s.fallbacks)} layers: " + "; ".join(reasons)] if reasons else []
            if s.kept:
                notes.append("kept as in the file: " + ", ".join(f"{k} ({f})" for k, f in s.kept.items()))
            # share of all linear weights (kept layers included) stored in the named format
            in_fmt = sum(m.out_features * m.in_features for m in lm.model.modules()
                         if isinstance(m, QuantLinear) and m.fmt == name)
            row = EvalRow(name, bpw, in_fmt / n_weights, nll / n, agree / n, n, time.perf_counter() - t,
                          "; ".join(notes))
        rows.append(row)
        log(_row_line(row, rows[0] if include_float else None))
        del lm
    return rows


def _row_line(r: EvalRow, base: Optional[EvalRow]) -> str:
    ratio = f"{r.ppl / base.ppl:.4f}" if base else "-"
    return (f"| {r.name} | {r.bits_per_weight:.2f} | {100 * r.share_in_fmt:.0f}% | {r.ppl:.3f} | {ratio} | "
            f"{100 * r.agreement:.1f}% | {r.seconds:.0f} |")


def table(rows: list[EvalRow]) -> str:
    base = rows[0] if rows and rows[0].name.startswith("float") else None
    head = ("| weights | bits/weight (linears) | weights in format | perplexity | ratio to float | "
            "top-1 agreement | time (s) |\n|---|---|---|---|---|---|---|")
    lines = [head] + [_row_line(r, base) for r in rows]
    notes = [f"- `{r.name}`: {r.note}" for r in rows if r.note]
    return "\n".join(lines) + ("\n\n" + "\n".join(notes) if notes else "")


def parse_args(argv):
    from ..models.llama import KEEP_DEFAULT
    from ..qtensor import formats as all_formats

    p = argparse.ArgumentParser(prog="python -m torch_uqr eval", description=__doc__.split("\n")[0])
    p.add_argument("--formats", default=",".join(all_formats()),
                   help="comma-separated formats to re-quantize into (default: all)")
    p.add_argument("--max-tokens", type=int, default=None, help="only the first N tokens of the text")
    p.add_argument("--window", type=int, default=1024, help="tokens per scored window")
    p.add_argument("--device", default="cpu")
    p.add_argument("--keep", default=",".join(KEEP_DEFAULT),
                   help="for the re-quantized rows: comma-separated layer names or fnmatch patterns left exactly as the file "
                        "has them ('none': re-quantize every linear layer; default: %(default)s, the output "
                        "head; the token embedding is never re-quantized)")
    p.add_argument("--fallback", default="pad", help="for K not a multiple of a format's block: 'pad', a format or 'error'")
    p.add_argument("--out", default=None, help="also write the table (markdown) to this file")
    p.add_argument("--compare-layout", action="store_true",
                   help="instead: time direct-head attention against the transposing one (native model)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    from ..models.llama import parse_keep

    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.compare_layout:
        from .layout_bench import main as bench_main
        return bench_main(["--device", args.device] + (["--out", args.out] if args.out else []))
    fmts = [f for f in args.formats.split(",") if f]
    print(f"# perplexity on {os.path.basename(DATA_FILE)}, windows of {args.window} tokens, device {args.device}")
    keep = parse_keep(args.keep)
    print(f"# re-quantized rows keep as in the file: {', '.join(keep) if keep else 'nothing'}")
    rows = run_eval(fmts, max_tokens=args.max_tokens, window=args.window, device=args.device,
                    fallback=args.fallback, keep=keep)
    md = table(rows)
    print("\n" + md)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(f"Perplexity of SmolLM2-135M-Instruct on `{os.path.basename(DATA_FILE)}` "
                    f"({rows[0].tokens} predicted tokens, windows of {args.window}), "
                    f"device {args.device}, K-fallback policy `{args.fallback}`, kept as in the file: "
                    f"{', '.join(keep) or 'nothing'}.\n\n{md}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
