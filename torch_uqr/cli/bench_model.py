"""``python -m torch_uqr bench --model FILE.gguf``: whole-model prefill and decode speed on the CPU.

For every thread count of ``--threads`` (default ``1,all``) it times, in one run:

* **router**: the file loaded by torch_uqr's GGUF loader as ``generate`` loads it (every packed
  weight stays in the file's blocks and runs through ``torch.ops.uqr.gemm``);
* **router-int8**: the same model with ``nn.set_path(model, "int8", max_rows=DECODE_ROWS)``:
  decode steps in llama.cpp's CPU arithmetic (activations rounded to int8 per weight block, integer
  dot products) in every layer whose format has path int8; prefill as **router**;
* **transformers**: ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`` of the same file,
  which decodes every tensor to float32 on load (torch's dense matmuls);
* **router (compiled)** and **router-int8 (compiled)**, with ``--compile``: the router models' decode through
  ``models.decode.CompiledDecoder`` (q/k/v and gate/up fused, static KV cache, one
  ``torch.compile``'d single-token step, compiled afresh per thread count; the compile seconds are
  printed and in the JSON's ``compile_s``, not in tok/s); its prefill runs eagerly into a static cache;
* **llama.cpp**, when ``--llama-bench`` names a ``llama-bench`` binary: ``llama-bench -m FILE -p PP
  -n TG -t THREADS -r REPS -o json`` (``llama_peer.llama_bench_tok_s``).

Prefill (``pp``): one forward over ``--pp`` tokens on an empty KV cache; tok/s = pp / seconds.
Decode (``tg``): ``--tg`` single-token forwards with the KV cache, after an untimed prompt of
``DECODE_PROMPT`` tokens; tok/s = tg / seconds of the whole run. The token ids are random (no text
or tokenizer is needed, as with llama-bench), and the torch engines compute the logits of the last
position only (``logits_to_keep=1``), as llama-bench does. Each figure is the median over ``--reps``
repetitions after an untimed warm-up at that thread count; llama.cpp's is the median of its own
per-repetition samples. Threads: ``torch.set_num_threads`` for the torch engines, ``-t`` for
llama-bench. Times are wall time, so the load average (printed, and in ``--json``) matters.
"""
from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Optional

import torch

ENGINES = ("router", "router-int8", "transformers")
ROUTER_ENGINES = ("router", "router-int8")
DECODE_PROMPT = 8  # untimed prompt before the timed decode steps
WARMUP_TOKENS = 16


@dataclass
class ModelRow:
    """One engine at one thread count (the --json records)."""

    engine: str
    threads: int
    pp: int
    tg: int
    pp_tok_s: float
    tg_tok_s: float
    pp_vs_llama_cpp: Optional[float] = None  # this engine's tok/s / llama.cpp's, same thread count
    tg_vs_llama_cpp: Optional[float] = None
    compile_s: Optional[float] = None  # router (compiled): seconds of torch.compile, not in tg_tok_s


def usable_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def parse_threads(text: str, cores: int) -> list[int]:
    """``1,all`` -> [1, cores] (duplicates dropped, order kept); SystemExit naming --threads otherwise."""
    out: list[int] = []
    for item in text.split(","):
        item = item.strip().lower()
        n = cores if item == "all" else int(item) if item.isdigit() else None
        if n is None or n < 1:
            raise SystemExit(f"--threads: expected a comma list of thread counts >= 1 or 'all', got {item!r}")
        if n > cores:
            raise SystemExit(f"--threads: {n} threads asked for, but this machine has {cores} cores "
                             f"(use 'all' for {cores})")
        if n not in out:
            out.append(n)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torch_uqr bench", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, metavar="GGUF", help="the GGUF file to benchmark")
    p.add_argument("--llama-bench", metavar="BIN", help="llama.cpp's llama-bench binary: adds llama.cpp rows "
                   "and each row's ratio to them")
    p.add_argument("--threads", default="1,all", help="comma list of thread counts; 'all' = every usable core "
                   "(default: %(default)s)")
    p.add_argument("--pp", type=int, default=512, help="prefill tokens (default: %(default)s)")
    p.add_argument("--tg", type=int, default=128, help="decode tokens (default: %(default)s)")
    p.add_argument("--reps", type=int, default=3, help="repetitions; each figure is their median (default: %(default)s)")
    p.add_argument("--engines", default=",".join(ENGINES), help="comma list of torch engines (default: %(default)s)")
    p.add_argument("--compile", action="store_true", help="also time the router's compiled decode step "
                   "(static KV cache, torch.compile; a 'router (compiled)' row, compile time excluded)")
    p.add_argument("--json", metavar="PATH", help="also write the rows and the machine's description as JSON")
    p.add_argument("--seed", type=int, default=0)
    return p


# ---- machine --------------------------------------------------------------------------------

def machine_info() -> dict:
    """CPU model name (lscpu), its vector ISA flags, core count, torch version, load average."""
    name = None
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        name = next((line.split(":", 1)[1].strip() for line in out.splitlines()
                     if line.startswith("Model name:")), None)
    except (OSError, subprocess.SubprocessError):
        pass
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    isa = {"avx2": "avx2" in flags, "avx512f": "avx512f" in flags,
           "neon": "asimd" in flags or "neon" in flags or platform.machine() in ("arm64", "aarch64")}
    return {"cpu": name or platform.processor() or platform.machine(), "isa": isa, "cores": usable_cores(),
            "torch": torch.__version__, "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


# ---- torch engines --------------------------------------------------------------------------

def load_engine(engine: str, path: str):
    """The model of ``engine`` for the GGUF ``path``, in eval mode, float32."""
    if engine in ROUTER_ENGINES:
        from ..models.auto import load_gguf_model

        model = load_gguf_model(path)[0].eval()
        if engine == "router-int8":
            from ..models.decode import DECODE_ROWS
            from ..nn import set_path

            set_path(model, "int8", max_rows=DECODE_ROWS)
        return model
    if engine == "transformers":
        from transformers import AutoModelForCausalLM

        folder, name = os.path.split(os.path.abspath(path))
        return AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    raise SystemExit(f"--engines: unknown engine {engine!r}; expected some of {', '.join(ENGINES)}")


@functools.lru_cache(maxsize=None)
def _last_logits_only(model_type: type) -> bool:
    return "logits_to_keep" in inspect.signature(model_type.forward).parameters


def _step(model, ids: torch.Tensor, cache) -> None:
    """One forward of ``ids`` into ``cache``, as ``generate`` runs it (logits of the last position only)."""
    from .generate import _cache_kwarg

    kw = {_cache_kwarg(type(model.model)): cache}
    if _last_logits_only(type(model)):
        kw["logits_to_keep"] = 1
    model(input_ids=ids, use_cache=True, **kw)


def _new_cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


@torch.no_grad()
def prefill_s(model, ids: torch.Tensor) -> float:
    """Seconds of one forward over ``ids`` ([1, pp]) on an empty KV cache."""
    cache = _new_cache(model)
    t0 = time.perf_counter()
    _step(model, ids, cache)
    return time.perf_counter() - t0


@torch.no_grad()
def decode_s(model, prompt: torch.Tensor, tokens: torch.Tensor) -> float:
    """Seconds of the single-token forwards of ``tokens`` ([tg]) after an untimed ``prompt``."""
    cache = _new_cache(model)
    _step(model, prompt, cache)
    t0 = time.perf_counter()
    for t in tokens:
        _step(model, t.view(1, 1), cache)
    return time.perf_counter() - t0


def time_engine(model, threads: int, pp: int, tg: int, reps: int, seed: int) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) of ``model`` at ``threads``: medians over ``reps``."""
    torch.set_num_threads(threads)
    vocab = int(model.config.vocab_size)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, pp), generator=gen)
    prompt = torch.randint(0, vocab, (1, DECODE_PROMPT), generator=gen)
    tokens = torch.randint(0, vocab, (tg,), generator=gen)
    prefill_s(model, ids[:, :min(pp, WARMUP_TOKENS)])  # warm-up at this thread count
    decode_s(model, prompt, tokens[:2])
    pps = [pp / prefill_s(model, ids) for _ in range(reps)]
    tgs = [tg / decode_s(model, prompt, tokens) for _ in range(reps)]
    return statistics.median(pps), statistics.median(tgs)


def time_compiled(model, threads: int, pp: int, tg: int, reps: int, seed: int) -> tuple[float, float, float]:
    """(prefill tok/s, decode tok/s, compile seconds) of ``CompiledDecoder`` at ``threads``.

    Compiled afresh at each thread count (inductor's CPU code is generated for the thread count
    of the compiling process). The static cache holds ``DECODE_PROMPT + tg`` positions, as
    ``generate --compile`` sizes it; prefill runs eagerly into a static cache of ``pp`` positions.
    """
    from ..models.decode import CompiledDecoder

    torch.set_num_threads(threads)
    torch._dynamo.reset()
    vocab = int(model.config.vocab_size)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, pp), generator=gen)
    prompt = torch.randint(0, vocab, (1, DECODE_PROMPT), generator=gen)
    tokens = torch.randint(0, vocab, (tg,), generator=gen)
    dec = CompiledDecoder(model, DECODE_PROMPT + tg)
    compile_s = dec.warm_up()
    pre = CompiledDecoder(model, pp, compile=False)
    pre.prefill(ids[:, :min(pp, WARMUP_TOKENS)])

    def prefill_once() -> float:
        t0 = time.perf_counter()
        pre.prefill(ids)
        return time.perf_counter() - t0

    def decode_once() -> float:
        dec.prefill(prompt)
        t0 = time.perf_counter()
        for t in tokens:
            dec.step(t)
        return time.perf_counter() - t0

    pps = [pp / prefill_once() for _ in range(reps)]
    tgs = [tg / decode_once() for _ in range(reps)]
    return statistics.median(pps), statistics.median(tgs), compile_s


# ---- table ----------------------------------------------------------------------------------

def add_ratios(rows: list[ModelRow]) -> None:
    """Fill each row's ratio to the llama.cpp row of the same thread count (when there is one)."""
    peer = {r.threads: r for r in rows if r.engine == "llama.cpp"}
    for r in rows:
        ref = peer.get(r.threads)
        if ref is not None and r.engine != "llama.cpp":
            r.pp_vs_llama_cpp = r.pp_tok_s / ref.pp_tok_s if ref.pp_tok_s else None
            r.tg_vs_llama_cpp = r.tg_tok_s / ref.tg_tok_s if ref.tg_tok_s else None


def format_table(rows: list[ModelRow]) -> str:
    """Markdown table: engine x threads, prefill and decode tok/s, ratio to llama.cpp when present."""
    pp, tg = (rows[0].pp, rows[0].tg) if rows else (0, 0)
    peer = any(r.engine == "llama.cpp" for r in rows)
    head = f"| engine | threads | pp{pp} tok/s | tg{tg} tok/s |"
    if peer:
        head += " pp / llama.cpp | tg / llama.cpp |"
    lines = [head, "|---|---:|---:|---:|" + ("---:|---:|" if peer else "")]
    for r in rows:
        line = f"| {r.engine} | {r.threads} | {r.pp_tok_s:.1f} | {r.tg_tok_s:.1f} |"
        if peer:
            line += "".join(" - |" if v is None else f" {v:.2f} |" for v in (r.pp_vs_llama_cpp, r.tg_vs_llama_cpp))
        lines.append(line)
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    cores = usable_cores()
    threads = parse_threads(args.threads, cores)
    if args.pp < 1 or args.tg < 1 or args.reps < 1:
        raise SystemExit("--pp, --tg and --reps must be >= 1")
    if not os.path.isfile(args.model):
        raise SystemExit(f"--model: no such file: {args.model}")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    for e in engines:
        if e not in ENGINES:
            raise SystemExit(f"--engines: unknown engine {e!r}; expected some of {', '.join(ENGINES)}")
    if args.compile and not set(ROUTER_ENGINES) & set(engines):
        raise SystemExit("--compile times the router's compiled decode: keep 'router' or 'router-int8' in --engines")
    machine = machine_info()
    rows: list[ModelRow] = []
    for engine in engines:
        t = time.perf_counter()
        model = load_engine(engine, args.model)
        print(f"# {engine}: loaded in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
        for n in threads:
            pp_ts, tg_ts = time_engine(model, n, args.pp, args.tg, args.reps, args.seed)
            rows.append(ModelRow(engine, n, args.pp, args.tg, pp_ts, tg_ts))
            print(f"# {engine} threads={n}: pp {pp_ts:.1f} tok/s, tg {tg_ts:.1f} tok/s", file=sys.stderr, flush=True)
        for n in threads if engine in ROUTER_ENGINES and args.compile else ():  # after the eager rows: it fuses layers
            pp_ts, tg_ts, c_s = time_compiled(model, n, args.pp, args.tg, args.reps, args.seed)
            rows.append(ModelRow(f"{engine} (compiled)", n, args.pp, args.tg, pp_ts, tg_ts, compile_s=c_s))
            print(f"# {engine} (compiled) threads={n}: compiled in {c_s:.1f} s; pp {pp_ts:.1f} tok/s, "
                  f"tg {tg_ts:.1f} tok/s", file=sys.stderr, flush=True)
        del model
    if args.llama_bench:
        from . import llama_peer

        try:
            peer = llama_peer.llama_bench_tok_s(args.llama_bench, args.model, args.pp, args.tg, threads, args.reps)
        except (OSError, RuntimeError, ValueError) as e:
            raise SystemExit(str(e))
        rows.extend(ModelRow("llama.cpp", n, args.pp, args.tg, *peer[n]) for n in threads)
    add_ratios(rows)
    machine["load_avg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    isa = ",".join(k for k, v in machine["isa"].items() if v) or "none of avx2/avx512f/neon"
    load = machine["load_avg"]
    print(f"model={os.path.basename(args.model)} cpu={machine['cpu']} ({machine['cores']} cores; {isa}) "
          f"torch={machine['torch']} reps={args.reps}"
          + (f" load average {load[0]:.2f} at start, {machine['load_avg_end'][0]:.2f} at end" if load else ""))
    print(format_table(rows))
    for r in rows:
        if r.compile_s is not None:
            print(f"{r.engine} at {r.threads} threads: compiled in {r.compile_s:.1f} s (not in its tok/s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": os.path.abspath(args.model), "pp": args.pp, "tg": args.tg, "reps": args.reps,
                       "llama_bench": args.llama_bench, "machine": machine, "rows": [asdict(r) for r in rows]},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
