"""Tensor-parallel commands, launched one process per rank by ``torchrun``.

* ``torchrun --nproc-per-node N -m torch_uqr generate --tp N [generate options]``: the model read
  straight into N shards (``torch_uqr.parallel.load_sharded``); rank 0 prints the answer.
* ``torchrun --nproc-per-node N -m torch_uqr bench --tp N [--gguf F] [--fmt q4_0] [--shape N,K]``:
  times a sharded MLP-shaped layer pair (column-parallel ``[F/N, K]`` then row-parallel
  ``[K, F/N]``, one all-reduce) and the whole model's decode step, each with the share of the time
  spent in collectives; prints each rank's packed weight bytes and resident memory.

``--tp 1`` runs the same code in one process without ``torch.distributed`` (the baseline). With
CUDA devices each rank takes ``cuda:LOCAL_RANK`` and NCCL; on the CPU the backend is gloo.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist


def init(tp: int, device: str) -> tuple[int, torch.device]:
    """Join the torchrun group of ``tp`` ranks (nothing for tp == 1): (rank, this rank's device)."""
    if tp < 1:
        raise SystemExit("--tp must be >= 1")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if tp == 1 and world == 1:
        return 0, torch.device(device)
    if world != tp:
        raise SystemExit(f"--tp {tp} needs {tp} processes: launch with torchrun --nproc-per-node {tp} -m torch_uqr "
                         f"... --tp {tp} (this process sees WORLD_SIZE={world})")
    dev = torch.device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return dist.get_rank(), dev


def _finish() -> None:
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _gather(obj) -> list:
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def rss_mib() -> float:
    """Resident set of this process now (Linux /proc), MiB."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
    except (OSError, StopIteration):
        return float("nan")


def generate_main(args) -> int:
    """``generate --tp N``: the arguments of ``torch_uqr.cli.generate``."""
    from .. import parallel
    from ..models.auto import gguf_tokenizer
    from ..models.llama import default_gguf_path
    from .generate import encode_prompt, generate, peak_memory_mib

    if args.fmt is not None:
        raise SystemExit("--fmt (re-quantizing) is not available with --tp: the shards are read from the file's blocks")
    rank, device = init(args.tp, args.device)
    torch.manual_seed(args.seed)
    path = args.gguf or default_gguf_path()
    t = time.perf_counter()
    model, plan = parallel.load_sharded(path, device=device, dtype=getattr(torch, args.dtype),
                                        direct_heads=not args.no_direct_heads)
    tokenizer = gguf_tokenizer(path)
    loaded = time.perf_counter() - t
    held = _gather(parallel.packed_weight_bytes(model) / 2**20)
    if rank == 0:
        print(f"# loaded into {args.tp} shards in {loaded:.1f} s on {device} ({args.dtype}): "
              + str(model.uqr_report).replace("\n", "\n# "))
        print(f"# packed weights per rank (MiB): {', '.join(f'{m:.1f}' for m in held)}; key/value heads split "
              f"{plan.kv_heads}, MLP {plan.ffn}")
    ids = encode_prompt(tokenizer, args.prompt, args.raw)
    if rank == 0:
        print(f"# prompt: {args.prompt!r}\n")
    r = generate(model, tokenizer, ids, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                 seed=args.seed, stream=sys.stdout if rank == 0 else None)
    peaks = _gather(peak_memory_mib(device))
    if rank == 0:
        print(f"\n\n# prefill {r['prompt_tokens']} tokens in {r['prefill_s']:.2f} s ({r['prefill_tok_s']:.1f} tok/s); "
              f"decode {len(r['tokens'])} tokens at {r['decode_tok_s']:.1f} tok/s; "
              f"peak memory per rank {', '.join(f'{p:.0f}' for p in peaks)} MiB")
    _finish()
    return 0


# ---- benchmark -----------------------------------------------------------------------------

def _median_ms(fn, repeat: int, device: torch.device) -> float:
    times = []
    for _ in range(repeat):
        if dist.is_initialized():
            dist.barrier()  # every rank starts together, so a wait inside measures imbalance only
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def bench_layer(fmt: str, N: int, K: int, M: int, repeat: int, device: torch.device) -> dict:
    """An MLP-shaped pair: column-parallel up ``[N/tp, K]``, row-parallel down ``[K, N/tp]``."""
    from .. import parallel
    from ..formats import get as format_module
    from ..formats import table
    from ..nn import QuantLinear
    from ..qtensor import QTensor

    group, rank, world = parallel.process_group()
    spec = table.spec(fmt)
    g = spec.default_group_size
    block = spec.block_geometry(g)[0]
    bounds = parallel.balanced_split(N, world, block, f"--shape N={N} (split on {fmt}'s {block}-weight blocks)")
    n0, n1 = bounds[rank], bounds[rank + 1]
    gen = torch.Generator().manual_seed(rank)
    mod = format_module(fmt)
    # Only the local shards are made: the values do not matter for timing.
    up = QuantLinear(QTensor(mod.random_blocks(n1 - n0, K, gen, g), fmt, (n1 - n0, K), g).to(device))
    down_local = QuantLinear(QTensor(mod.random_blocks(K, n1 - n0, gen, g), fmt, (K, n1 - n0), g).to(device))
    down = parallel.RowParallel(down_local, None, group)
    x = torch.randn(M, K, generator=gen).to(device)
    pair = lambda: down(up(x))  # noqa: E731
    local = lambda: down_local(up(x))  # noqa: E731
    for _ in range(3):
        pair()
    parallel.comm_timer.enabled = True
    parallel.comm_timer.reset()
    total = _median_ms(pair, repeat, device)
    comm = parallel.comm_timer.seconds / repeat * 1e3
    parallel.comm_timer.enabled = False
    compute = _median_ms(local, repeat, device)
    return {"rank": rank, "ms": total, "comm_ms": comm, "compute_ms": compute,
            "bytes": up.weight.numel() + down_local.weight.numel()}


def bench_model(path: str, steps: int, device: torch.device) -> dict:
    """Decode steps of the sharded model after a short prefill: ms per step and the comm share."""
    from transformers import DynamicCache

    from .. import parallel
    from .generate import _forward

    from transformers import AutoModelForCausalLM

    from ..models.auto import gguf_config

    with torch.device("meta"):  # transformers' modeling code is imported before the RSS baseline
        AutoModelForCausalLM.from_config(gguf_config(path))
    rss0 = rss_mib()
    t = time.perf_counter()
    model, plan = parallel.load_sharded(path, device=device)
    load_s = time.perf_counter() - t
    rss1 = rss_mib()
    ids = torch.arange(3, 19).view(1, -1).to(device)
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        nxt = _forward(model, ids, cache).argmax(-1, keepdim=True)
        for _ in range(2):  # warm-up steps
            nxt = _forward(model, nxt, cache).argmax(-1, keepdim=True)
        parallel.comm_timer.enabled = True
        parallel.comm_timer.reset()
        times = []
        for _ in range(steps):
            if dist.is_initialized():
                dist.barrier()
            t = time.perf_counter()
            nxt = _forward(model, nxt, cache).argmax(-1, keepdim=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t)
        parallel.comm_timer.enabled = False
    total = sum(times)
    return {"step_ms": statistics.median(times) * 1e3, "comm_share": parallel.comm_timer.seconds / total,
            "collectives_per_step": parallel.comm_timer.calls / steps, "packed_mib":
            parallel.packed_weight_bytes(model) / 2**20, "load_s": load_s, "rss_mib": rss1,
            "rss_load_mib": rss1 - rss0}


def bench_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="torchrun --nproc-per-node N -m torch_uqr bench --tp N",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=int, required=True, help="ranks (the torchrun process count; 1: no torchrun)")
    p.add_argument("--gguf", default=None, help="model of the decode-step timing (default: the generate command's default model)")
    p.add_argument("--fmt", default="q4_0", help="format of the layer pair (default: %(default)s)")
    p.add_argument("--shape", default="5632,2048", help="F,K of the layer pair: up [F, K], down [K, F]")
    p.add_argument("--m", type=int, default=1, help="rows of x (1: a decode step)")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--steps", type=int, default=16, help="timed decode steps of the model")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-model", action="store_true", help="time the layer pair only")
    args = p.parse_args(argv)
    from ..models.llama import default_gguf_path

    rank, device = init(args.tp, args.device)
    F, K = (int(v) for v in args.shape.split(","))
    layer = _gather(bench_layer(args.fmt, F, K, args.m, args.repeat, device))
    model = None if args.no_model else _gather(bench_model(args.gguf or default_gguf_path(), args.steps, device))
    if rank == 0:
        print(f"# tp={args.tp} on {device}, {torch.get_num_threads()} threads per rank")
        print(f"layer pair {args.fmt} up [{F}/{args.tp}, {K}] + down [{K}, {F}/{args.tp}], M={args.m}:")
        print("rank      ms   compute ms   comm ms   comm share   packed MiB")
        for r in layer:
            print(f"{r['rank']:>4} {r['ms']:>7.3f} {r['compute_ms']:>12.3f} {r['comm_ms']:>9.3f} "
                  f"{r['comm_ms'] / r['ms']:>11.1%} {r['bytes'] / 2**20:>12.2f}")
        if model:
            print(f"model {os.path.basename(args.gguf or default_gguf_path())}, decode step after 16 prompt tokens:")
            print("rank  step ms   tok/s   comm share  collectives/step  packed MiB  RSS MiB  RSS of load MiB  load s")
            for i, r in enumerate(model):
                print(f"{i:>4} {r['step_ms']:>8.2f} {1e3 / r['step_ms']:>7.1f} {r['comm_share']:>12.1%} "
                      f"{r['collectives_per_step']:>17.0f} {r['packed_mib']:>11.1f} {r['rss_mib']:>8.0f} "
                      f"{r['rss_load_mib']:>16.0f} {r['load_s']:>7.1f}")
    _finish()
    return 0
