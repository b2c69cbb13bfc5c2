"""Worker functions of tests/test_parallel.py, run in N gloo processes (``torch.multiprocessing.spawn``
pickles them by module name, so they live outside the test module).

Every rank draws the same random weights and inputs from one seed, computes the unsharded result
itself, runs its shard through the parallel modules, and writes what it saw to ``out/rank{r}.json``
for the parent test to check.
"""
from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

import torch_uqr as uqr
from torch_uqr import parallel
from torch_uqr.formats import get as format_module
from torch_uqr.formats import table
from torch_uqr.nn import QuantEmbedding, QuantLinear


def _init(rank: int, world: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| in float64 (0 for exactly equal tensors)."""
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _packed(fmt: str, g, N: int, K: int, gen: torch.Generator) -> uqr.QTensor:
    data = format_module(fmt).random_blocks(N, K, gen, g or 0)
    return uqr.QTensor.from_bytes(data, fmt, (N, K), g)


def layers(rank: int, world: int, port: int, out: str) -> None:
    """Every format of the table: column-parallel with direct heads, row-parallel reading heads
    (even split at heads) and plain (uneven split at blocks), vocabulary-parallel embedding and
    gathered head, each against the unsharded layer."""
    _init(rank, world, port)
    group = dist.group.WORLD
    gen = torch.Generator().manual_seed(1234)
    results = {}
    for fmt, g in table.format_cases():
        block = table.spec(fmt).block_geometry(g or 0)[0]
        key = fmt + (f"/g{g}" if g else "")
        r = {}
        # Column-parallel q/k/v-like: out_heads layout, each rank writes its own heads.
        H, D, K = 2 * world, 16, 2 * block
        qt = _packed(fmt, g, H * D, K, gen)
        bias = torch.randn(H * D, generator=gen)
        x = torch.randn(2, 3, K, generator=gen)
        full = QuantLinear(qt, bias, out_heads=H)(x)                       # [2, H, 3, D]
        h0, h1 = rank * 2, rank * 2 + 2
        local = QuantLinear(parallel.shard_rows(qt, h0 * D, h1 * D), bias[h0 * D:h1 * D], out_heads=h1 - h0)
        r["col_heads"] = _rel(local(x), full[:, h0:h1])
        # Row-parallel o_proj-like: reads [B, H, M, D] heads, split K at head boundaries.
        Dk = block
        qt = _packed(fmt, g, 24, H * Dk, gen)
        bias = torch.randn(24, generator=gen)
        xh = torch.randn(2, H, 3, Dk, generator=gen)
        full = QuantLinear(qt, bias, in_heads=True)(xh)
        rp = parallel.RowParallel(QuantLinear(parallel.shard_cols(qt, h0 * Dk, h1 * Dk), in_heads=True), bias, group)
        r["row_heads"] = _rel(rp(xh[:, h0:h1]), full)
        # Row-parallel, uneven split on block boundaries (2*world + 1 blocks).
        K = (2 * world + 1) * block
        bounds = parallel.balanced_split(K, world, block)
        k0, k1 = bounds[rank], bounds[rank + 1]
        qt = _packed(fmt, g, 40, K, gen)
        x = torch.randn(5, K, generator=gen)
        full = QuantLinear(qt)(x)
        rp = parallel.RowParallel(QuantLinear(parallel.shard_cols(qt, k0, k1)), None, group)
        r["row_uneven"] = _rel(rp(x[:, k0:k1]), full)
        r["row_uneven_bytes"] = rp.local.weight.numel()
        # Vocabulary-parallel embedding and gathered head over an uneven vocabulary.
        V = 4 * world + 3
        qt = _packed(fmt, g, V, block, gen)
        vb = parallel.balanced_split(V, world)
        v0, v1 = vb[rank], vb[rank + 1]
        shard = parallel.shard_rows(qt, v0, v1)
        ids = torch.randint(0, V, (2, 7), generator=gen)
        emb = parallel.VocabParallelEmbedding(QuantEmbedding(shard), v0, v1, group)
        r["embedding"] = _rel(emb(ids), QuantEmbedding(qt)(ids))
        x = torch.randn(3, block, generator=gen)
        head = parallel.GatheredHead(QuantLinear(shard), [b - a for a, b in zip(vb, vb[1:])], group)
        r["head"] = _rel(head(x), QuantLinear(qt)(x))
        results[key] = r
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


def _greedy(model, ids: torch.Tensor, n: int) -> tuple[list[int], torch.Tensor]:
    """n greedy tokens with a KV cache, and the prompt's last logits."""
    from transformers import DynamicCache

    from torch_uqr.cli.generate import _forward

    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        logits = _forward(model, ids, cache)
        first = logits.clone()
        out = []
        for _ in range(n):
            nxt = logits.argmax(-1, keepdim=True)
            out.append(int(nxt))
            logits = _forward(model, nxt, cache)
    return out, first


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


PROMPT = [5, 70, 101, 33, 200, 12, 9, 140]


def model(rank: int, world: int, port: int, path: str, n_tokens: int, out: str) -> None:
    """A GGUF model read straight into shards (``load_sharded``) and the same model sharded in memory
    (``shard_model``): greedy tokens, first logits and the packed bytes this rank holds."""
    from torch_uqr.models.auto import load_gguf_model

    _init(rank, world, port)
    ids = torch.tensor([PROMPT])
    rss0 = _rss_kib()
    m, plan = parallel.load_sharded(path)
    rss1 = _rss_kib()
    tokens, logits = _greedy(m, ids, n_tokens)
    res = {"tokens": tokens, "logits": logits[0].tolist(), "packed_bytes": parallel.packed_weight_bytes(m),
           "rss_load_kib": rss1 - rss0, "kv_heads": plan.kv_heads, "ffn": plan.ffn}
    del m
    full, _ = load_gguf_model(path)
    parallel.shard_model(full)
    res["tokens_shard_model"], logits = _greedy(full, ids, n_tokens)
    res["logits_shard_model"] = logits[0].tolist()
    res["packed_bytes_shard_model"] = parallel.packed_weight_bytes(full)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


def safetensors_model(rank: int, world: int, port: int, folder: str, out: str) -> None:
    """A ``save_quantized`` file read into shards of a meta-device skeleton: first logits and bytes."""
    from transformers import AutoConfig, AutoModelForCausalLM

    _init(rank, world, port)
    cfg = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg)
    plan = parallel.load_quantized_sharded(m, os.path.join(folder, "model.safetensors"))
    tokens, logits = _greedy(m, torch.tensor([PROMPT]), 6)
    res = {"tokens": tokens, "logits": logits[0].tolist(), "packed_bytes": parallel.packed_weight_bytes(m),
           "ffn": plan.ffn}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()
