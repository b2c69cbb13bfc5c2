"""Tensor parallelism (torch_uqr.parallel) in 2 and 4 gloo processes on the CPU.

Every format of the table: a sharded layer gives the unsharded layer's output (column-parallel and
vocabulary shards bit for bit, row-parallel to fp32 rounding since the partial sums are added in
another order), both head layouts included. A tiny GGUF model of mixed formats, read straight into
2 shards, generates the greedy tokens of the one-process model, and each rank holds half the packed
bytes. Splits that cut a block are refused, naming the nearest valid split.
"""
import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

import torch_uqr as uqr
from torch_uqr import parallel
from torch_uqr.formats import table

import parallel_workers
import tiny_gguf_models

ROW_TOL = 1e-5  # max |sharded - full| / max |full| of a row-parallel sum (fp32 rounding)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(fn, world: int, out, *args) -> list[dict]:
    """Run ``fn(rank, world, port, *args, out)`` in ``world`` processes; the JSON each rank wrote."""
    mp.spawn(fn, args=(world, _port(), *args, str(out)), nprocs=world, join=True)
    return [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(world)]


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])  # 4 processes on 2 cores: ~90 s
def test_sharded_layers_equal_unsharded_for_every_format(world, tmp_path):
    ranks = _spawn(parallel_workers.layers, world, tmp_path)
    cases = [f + (f"/g{g}" if g else "") for f, g in table.format_cases()]
    for rank, res in enumerate(ranks):
        assert sorted(res) == sorted(cases)
        for key, r in res.items():
            where = f"{key} rank {rank}/{world}"
            # Column-parallel shards run the same rows through the same kernel: the same numbers.
            assert r["col_heads"] <= 1e-6, where
            assert r["embedding"] == 0.0, where
            assert r["head"] <= 1e-6, where
            assert r["row_heads"] <= ROW_TOL, where
            assert r["row_uneven"] <= ROW_TOL, where
    # The uneven row split holds complementary byte ranges of every row.
    for key in cases:
        fmt, _, g = key.partition("/g")
        spec = table.spec(fmt)
        block, nbytes = spec.block_geometry(int(g) if g else spec.default_group_size)
        assert sum(r[key]["row_uneven_bytes"] for r in ranks) == 40 * (2 * world + 1) * nbytes


def test_k_split_that_cuts_a_block_is_refused():
    for fmt, g in table.format_cases():
        block = table.spec(fmt).block_geometry(g or 0)[0]
        qt = uqr.QTensor.from_bytes(_blocks(fmt, g, 4, 4 * block), fmt, (4, 4 * block), g)
        cut = block + block // 2 - 1  # just below the middle of the second block: the nearest is `block`
        with pytest.raises(ValueError, match=rf"K split at {cut} cuts a block of {block} weights; "
                                             rf"the nearest valid split is {block}\b"):
            parallel.shard_cols(qt, 0, cut)
        with pytest.raises(ValueError, match=rf"nearest valid split is {2 * block}\b"):
            parallel.shard_cols(qt, cut + 2, 4 * block)
        assert parallel.shard_cols(qt, block, 3 * block).shape == (4, 2 * block)


def _blocks(fmt, g, N, K):
    from torch_uqr.formats import get

    return get(fmt).random_blocks(N, K, torch.Generator().manual_seed(0), g or 0)


def test_plan_refuses_a_rank_count_without_valid_splits():
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=32, vocab_size=100)
    plan = parallel.megatron_plan(cfg, 2, 1, o_blocks=[32], down_blocks=[32])
    assert plan.kv_heads == [0, 1, 2] and plan.ffn == [0, 128, 256] and plan.q_rows == (64, 128)
    with pytest.raises(ValueError, match=r"intermediate_size.*256 splits into at most 1 piece\(s\) on multiples of 256, fewer than the 2 ranks"):
        parallel.megatron_plan(cfg, 2, 0, o_blocks=[32], down_blocks=[32, 256])
    with pytest.raises(ValueError, match="key/value heads"):
        parallel.megatron_plan(cfg, 4, 0, o_blocks=[32], down_blocks=[32])
    # 3 kv heads over 2 ranks: 2 + 1, with their query heads (o_proj splits at 2*G*D).
    cfg3 = LlamaConfig(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                       vocab_size=49152)
    p = parallel.megatron_plan(cfg3, 2, 1, o_blocks=[32], down_blocks=[32])
    assert p.kv_heads == [0, 2, 3] and p.q_rows == (6 * 64, 9 * 64) and p.local_heads == (3, 1)
    assert p.ffn == [0, 768, 1536] and p.vocab == [0, 24576, 49152]
    # An inner boundary must be a unit multiple, the end need not be: 3 kv heads, unit 2 -> 2 + 1.
    assert parallel.balanced_split(3, 2, 2) == [0, 2, 3]
    assert parallel.balanced_split(1000, 3, 256) == [0, 512, 768, 1000]


# MLP width 512: q4_k's 256-weight super-blocks of down_proj split over 2 ranks.
WIDE_FFN = tiny_gguf_models.Dims(ffn=512)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A tiny llama GGUF (q4_0 / q8_0 / q4_1 / q4_k and the ggml type of ``NON_NATIVE``) whose MLP
    width lets q4_k's 256-weight super-blocks split over 2 ranks."""
    folder = tmp_path_factory.mktemp("tp_gguf")
    old_cache = os.environ.get("UQR_CACHE")
    os.environ["UQR_CACHE"] = str(folder / "cache")
    try:
        path = str(folder / "llama.gguf")
        types = tiny_gguf_models.write_tiny_gguf("llama", path, seed=3, dims=WIDE_FFN)
        yield path, types
    finally:
        if old_cache is None:
            os.environ.pop("UQR_CACHE")
        else:
            os.environ["UQR_CACHE"] = old_cache


@pytest.mark.slow  # whole-model runs in 2 processes: about a minute on the 2-core CI machine
def test_tiny_gguf_tp2_generates_the_tokens_of_one_process(tiny_llama, tmp_path):
    from torch_uqr.models.auto import load_gguf_model

    path, types = tiny_llama
    assert {"Q4_0", "Q8_0", "Q4_1", "Q4_K"} <= set(types.values())
    assert all(types[name] == t.name for name, t in tiny_gguf_models.NON_NATIVE["llama"].items())
    n = 12
    ranks = _spawn(parallel_workers.model, 2, tmp_path, path, n)
    full, _ = load_gguf_model(path)
    tokens, logits = parallel_workers._greedy(full, torch.tensor([parallel_workers.PROMPT]), n)
    full_bytes = parallel.packed_weight_bytes(full)
    for rank, r in enumerate(ranks):
        assert r["tokens"] == tokens, f"rank {rank}: load_sharded"
        assert r["tokens_shard_model"] == tokens, f"rank {rank}: shard_model"
        for key in ("logits", "logits_shard_model"):
            diff = (torch.tensor(r[key]) - logits[0]).abs().max() / logits.abs().max()
            assert diff < 1e-5, (rank, key, float(diff))
        # Every packed weight is split (nothing packed is replicated): half the bytes each.
        assert abs(r["packed_bytes"] / full_bytes - 0.5) < 0.05, (rank, r["packed_bytes"], full_bytes)
        assert r["packed_bytes_shard_model"] == r["packed_bytes"]
    assert sum(r["packed_bytes"] for r in ranks) == full_bytes
    assert ranks[0]["kv_heads"] == [0, 1, 2] and ranks[0]["ffn"] == [0, 256, 512]


def _answer(stdout: str) -> str:
    """The generated text: what the command prints between the prompt line and the timing line."""
    body = stdout.split("# prompt:", 1)[1].split("\n", 1)[1]
    return body.split("\n\n# prefill", 1)[0]


@pytest.mark.slow
def test_generate_cli_tp2_under_torchrun_prints_the_one_process_text(tiny_llama):
    import subprocess
    import sys

    path, _ = tiny_llama
    common = ["generate", "--gguf", path, "--raw", "--prompt", "the cat sat", "--max-new-tokens", "10"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    one = subprocess.run([sys.executable, "-m", "torch_uqr", *common], capture_output=True, text=True, env=env,
                         timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", str(_port()), "-m", "torch_uqr", *common, "--tp", "2"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "packed weights per rank" in two.stdout
    assert _answer(two.stdout) == _answer(one.stdout) and _answer(one.stdout).strip()


def test_generate_tp_without_torchrun_is_refused(monkeypatch):
    from torch_uqr.cli import generate

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit, match="--tp 2 needs 2 processes: launch with torchrun --nproc-per-node 2"):
        generate.main(["--tp", "2", "--gguf", "unused.gguf"])


@pytest.mark.slow
def test_safetensors_of_save_quantized_loads_into_shards(tmp_path):
    from torch_uqr.nn import quantize_model, save_quantized

    model = tiny_gguf_models.tiny_model("llama", seed=5, dims=WIDE_FFN)
    # q4_k where K allows (the MLP's down_proj), q8_0 for the 128-wide layers and the head.
    quantize_model(model, "q4_k", fallback="q8_0", progress=False, verbose=False)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    model.config.save_pretrained(folder)
    save_quantized(model, str(folder / "model.safetensors"))
    tokens, logits = parallel_workers._greedy(model, torch.tensor([parallel_workers.PROMPT]), 6)
    ranks = _spawn(parallel_workers.safetensors_model, 2, tmp_path, str(folder))
    full_bytes = parallel.packed_weight_bytes(model)
    for rank, r in enumerate(ranks):
        assert r["tokens"] == tokens, rank
        diff = (torch.tensor(r["logits"]) - logits[0]).abs().max() / logits.abs().max()
        assert diff < 1e-5, (rank, float(diff))
    assert sum(r["packed_bytes"] for r in ranks) == full_bytes
    assert ranks[0]["ffn"] == [0, 256, 512]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])  # q/k/v biases and a tied head; scaled embedding, q/k norms
def test_other_architectures_tp2(arch, tmp_path, monkeypatch):
    from torch_uqr.models.auto import load_gguf_model

    monkeypatch.setenv("UQR_CACHE", str(tmp_path / "cache"))
    path = str(tmp_path / f"{arch}.gguf")
    tiny_gguf_models.write_tiny_gguf(arch, path, seed=1, dims=WIDE_FFN)
    ranks = _spawn(parallel_workers.model, 2, tmp_path, path, 8)
    full, _ = load_gguf_model(path)
    tokens, logits = parallel_workers._greedy(full, torch.tensor([parallel_workers.PROMPT]), 8)
    for rank, r in enumerate(ranks):
        assert r["tokens"] == tokens and r["tokens_shard_model"] == tokens, rank
        assert (torch.tensor(r["logits"]) - logits[0]).abs().max() / logits.abs().max() < 1e-5
    assert sum(r["packed_bytes"] for r in ranks) == parallel.packed_weight_bytes(full)


def test_fused_projections_are_refused(tmp_path):
    import gguf
    import numpy as np

    path = str(tmp_path / "fused.gguf")
    w = gguf.GGUFWriter(path, "phi3")
    w.add_tensor("blk.0.attn_qkv.weight", np.zeros((6, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(NotImplementedError, match=r"fused projections \(blk\.0\.attn_qkv\.weight\)"):
        parallel.load_sharded(path)
