"""Tensor parallelism for packed weights on ``torch.distributed`` (Megatron-style).

Each of N processes (one per GPU with NCCL, or CPU processes with gloo) holds 1/N of every large
weight and runs the same model; the only communication is one all-reduce after each row-parallel
layer, one after the vocabulary-parallel embedding and one all-gather of the logits.

* Column-parallel (split N, the output features): whole rows of blocks move, so any row split is
  valid. q/k/v are split at key/value-head groups, so each shard writes its own heads directly
  (``out_heads``) and attention runs on local heads only.
* Row-parallel (split K, the input features): a split must fall on a block boundary of the
  weight's format (a super-block for q4_k, a group for the MLX family: ``table.spec(fmt).block_geometry``);
  a split that cuts a block is refused, naming the nearest valid split. The partial outputs are
  summed with an all-reduce, then the bias is added once.
* The token embedding is split over the vocabulary (each rank looks up the ids it holds, the
  rest are zeros, then an all-reduce) and the output head likewise (its logits are gathered), a
  tied head sharing the embedding shard's bytes.

``shard_model(model, mesh)`` applies this plan to a model already in memory; ``load_sharded(path)``
builds it straight from a GGUF file and ``load_quantized_sharded(skeleton, path)`` from a
safetensors file of ``save_quantized``, each rank reading only the byte ranges of its shards.
Splits need not be equal: N (heads, intermediate features, vocabulary) is divided as evenly as
its unit allows, so e.g. 3 key/value heads run on 2 ranks as 2 + 1.
"""
from __future__ import annotations

import copy
import math
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .formats import table as format_table
from .nn import QuantEmbedding, QuantLinear
from .qtensor import QTensor

__all__ = ["balanced_split", "check_k_split", "shard_rows", "shard_cols", "RowParallel", "VocabParallelEmbedding",
           "GatheredHead", "TPPlan", "megatron_plan", "shard_model", "load_sharded", "load_quantized_sharded",
           "packed_weight_bytes",
           "comm_timer", "process_group"]

Group = Optional["dist.ProcessGroup"]


# ---- process group -----------------------------------------------------------------------------

def process_group(mesh=None) -> tuple[Group, int, int]:
    """(group, rank, world size) of a 1-D ``DeviceMesh``, a ``ProcessGroup`` or None (the default
    group; world size 1 when ``torch.distributed`` is not initialized)."""
    if mesh is None:
        if not (dist.is_available() and dist.is_initialized()):
            return None, 0, 1
        group = dist.group.WORLD
    elif hasattr(mesh, "get_group"):
        if mesh.ndim != 1:
            raise ValueError(f"mesh must be 1-D (one tensor-parallel dimension), got {mesh.ndim} dims")
        group = mesh.get_group()
    else:
        group = mesh
    return group, dist.get_rank(group), dist.get_world_size(group)


class _CommTimer:
    """Seconds spent inside this module's collectives (waiting for slower ranks included)."""

    def __init__(self):
        self.enabled, self.seconds, self.calls = False, 0.0, 0

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0


comm_timer = _CommTimer()


@contextmanager
def _timed(device: torch.device) -> Iterator[None]:
    if not comm_timer.enabled:
        yield
        return
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    yield
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    comm_timer.seconds += time.perf_counter() - t
    comm_timer.calls += 1


def _all_reduce(y: torch.Tensor, group: Group) -> torch.Tensor:
    if group is None:
        return y
    y = y.contiguous()
    with _timed(y.device):
        dist.all_reduce(y, group=group)
    return y


def _all_gather_last(y: torch.Tensor, sizes: Sequence[int], group: Group) -> torch.Tensor:
    """Concatenate every rank's ``y`` along the last dim (sizes may differ by rank)."""
    if group is None:
        return y
    width = max(sizes)
    padded = F.pad(y, (0, width - y.shape[-1])).contiguous()
    parts = [torch.empty_like(padded) for _ in sizes]
    with _timed(y.device):
        dist.all_gather(parts, padded, group=group)
    return torch.cat([p[..., :n] for p, n in zip(parts, sizes)], dim=-1)


# ---- split rules -------------------------------------------------------------------------------

def balanced_split(total: int, parts: int, unit: int = 1, what: str = "dimension") -> list[int]:
    """Boundaries ``[0, b1, ..., total]`` of ``parts`` pieces whose inner boundaries are multiples of
    ``unit``, as even as that allows (the end, ``total``, is always a valid boundary). ValueError
    when some piece would be empty."""
    n = -(-total // unit)  # slots of `unit`, the last one possibly partial
    if n < parts:
        raise ValueError(f"{what}: {total} splits into at most {n} piece(s) on multiples of {unit}, fewer than "
                         f"the {parts} ranks; valid rank counts: 1..{max(n, 1)}")
    q, r = divmod(n, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(min(total, bounds[-1] + (q + (i < r)) * unit))
    return bounds


def _block(fmt: str, group_size: int = 0) -> int:
    s = format_table.spec(fmt)
    return s.block_geometry(group_size or s.default_group_size)[0]


def check_k_split(K: int, points: Sequence[int], block: int, what: str = "weight") -> None:
    """Refuse K split points that cut a block, naming the nearest valid split of each.

    ``block`` is the weights per block along K (``table.spec(fmt).block_geometry(g)[0]``).
    """
    for p in points:
        if not 0 <= p <= K:
            raise ValueError(f"{what}: K split at {p} lies outside 0..{K}")
        if p % block:
            lo, hi = p - p % block, p - p % block + block
            near = [v for v in (lo, hi) if v <= K]
            best = min(near, key=lambda v: (abs(v - p), v))
            raise ValueError(f"{what}: a K split at {p} cuts a block of {block} weights; the nearest valid "
                             f"split is {best} (splits must be multiples of {block})")


def shard_rows(qt: QTensor, start: int, stop: int) -> QTensor:
    """Rows ``[start, stop)`` of ``qt`` (a column-parallel shard): whole rows of blocks, bytes copied."""
    if not 0 <= start < stop <= qt.N:
        raise ValueError(f"rows [{start}, {stop}) must be a non-empty range inside 0..{qt.N}")
    return QTensor(qt.data[start:stop].clone(), qt.fmt, (stop - start, qt.K), qt.group_size)


def shard_cols(qt: QTensor, start: int, stop: int) -> QTensor:
    """Columns ``[start, stop)`` of ``qt`` (a row-parallel shard); both must be block boundaries."""
    if not 0 <= start < stop <= qt.K:
        raise ValueError(f"columns [{start}, {stop}) must be a non-empty range inside 0..{qt.K}")
    block, nbytes = qt.block_size, qt.block_bytes
    check_k_split(qt.K, (start, stop), block, f"{qt.fmt} [{qt.N}, {qt.K}]")
    data = qt.data[:, start // block * nbytes: stop // block * nbytes].clone()
    return QTensor(data, qt.fmt, (qt.N, stop - start), qt.group_size)


# ---- parallel modules --------------------------------------------------------------------------

class RowParallel(nn.Module):
    """A row-parallel layer: ``local`` (the K shard, without bias) on this rank's slice of the
    input, the partial outputs summed over the group, then the bias added once."""

    def __init__(self, local: nn.Module, bias: Optional[torch.Tensor], group: Group):
        super().__init__()
        self.local = local
        self.register_buffer("bias", None if bias is None else bias.detach())
        self.group = group

    # DirectHeadAttention reads its o_proj's input layout through these.
    @property
    def in_heads(self) -> bool:
        return bool(getattr(self.local, "in_heads", False))

    @in_heads.setter
    def in_heads(self, value: bool) -> None:
        self.local.in_heads = value

    @property
    def in_features(self) -> int:
        return self.local.in_features

    @property
    def packed_in_features(self) -> int:
        return getattr(self.local, "packed_in_features", self.local.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _all_reduce(self.local(x), self.group)
        return y if self.bias is None else y + self.bias.to(y.dtype)


class VocabParallelEmbedding(nn.Module):
    """An embedding whose rows ``[start, stop)`` live here: ids outside give zeros, then an all-reduce."""

    def __init__(self, local: nn.Module, start: int, stop: int, group: Group):
        super().__init__()
        self.local, self.start, self.stop, self.group = local, int(start), int(stop), group

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        mine = (input_ids >= self.start) & (input_ids < self.stop)
        out = self.local(torch.where(mine, input_ids - self.start, 0))
        out = out * mine.unsqueeze(-1).to(out.dtype)
        return _all_reduce(out, self.group)


class GatheredHead(nn.Module):
    """A column-parallel layer whose outputs (e.g. logits over a vocabulary shard) are gathered."""

    def __init__(self, local: nn.Module, sizes: Sequence[int], group: Group):
        super().__init__()
        self.local, self.sizes, self.group = local, [int(s) for s in sizes], group

    @property
    def weight(self):  # transformers looks at the output head's weight (dtype, device)
        return self.local.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _all_gather_last(self.local(x), self.sizes, self.group)


# ---- the plan ----------------------------------------------------------------------------------

@dataclass
class TPPlan:
    """Where every split dimension is cut, for each rank (boundaries, ``len == world + 1``)."""

    world: int
    rank: int
    head_dim: int
    q_per_kv: int                 # query heads per key/value head (kept together on one rank)
    kv_heads: list[int]           # boundaries over key/value heads
    ffn: list[int]                # boundaries over the MLP's intermediate features
    vocab: list[int]              # boundaries over the vocabulary

    def span(self, bounds: list[int], scale: int = 1) -> tuple[int, int]:
        return bounds[self.rank] * scale, bounds[self.rank + 1] * scale

    @property
    def q_rows(self) -> tuple[int, int]:
        return self.span(self.kv_heads, self.q_per_kv * self.head_dim)

    @property
    def kv_rows(self) -> tuple[int, int]:
        return self.span(self.kv_heads, self.head_dim)

    @property
    def local_heads(self) -> tuple[int, int]:
        lo, hi = self.span(self.kv_heads)
        return (hi - lo) * self.q_per_kv, hi - lo

    def sizes(self, bounds: list[int]) -> list[int]:
        return [b - a for a, b in zip(bounds, bounds[1:])]


def _lcm(values) -> int:
    return math.lcm(*values) if values else 1


def megatron_plan(config, world: int, rank: int, *, o_blocks: Sequence[int] = (),
                  down_blocks: Sequence[int] = ()) -> TPPlan:
    """The split of a decoder for ``world`` ranks.

    ``o_blocks`` / ``down_blocks``: the block sizes along K of every o_proj / down_proj; the
    key/value-head and intermediate splits are chosen on boundaries valid for all of them
    (ValueError, naming the unit, when there is none for this many ranks).
    """
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    H = cfg.num_attention_heads
    Hkv = getattr(cfg, "num_key_value_heads", None) or H
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    if H % Hkv:
        raise ValueError(f"num_attention_heads={H} is not a multiple of num_key_value_heads={Hkv}")
    G = H // Hkv
    # o_proj's K runs over query heads: a rank's span is kv heads x G x D and must be block aligned.
    kv_unit = _lcm([b // math.gcd(b, G * D) for b in o_blocks])
    kv = balanced_split(Hkv, world, kv_unit, "key/value heads (o_proj splits on their boundaries and on "
                        f"its blocks of {sorted(set(o_blocks))} weights)")
    ffn = balanced_split(cfg.intermediate_size, world, _lcm(list(down_blocks)),
                         f"intermediate_size (down_proj splits on its blocks of {sorted(set(down_blocks))} weights)")
    vocab = balanced_split(cfg.vocab_size, world, 1, "vocab_size")
    return TPPlan(world, rank, D, G, kv, ffn, vocab)


# ---- sharding a model in memory ---------------------------------------------------------------

def _col_shard(m: nn.Module, start: int, stop: int, out_heads: int = 0) -> nn.Module:
    """Rows ``[start, stop)`` of a QuantLinear / nn.Linear as a module of the same kind."""
    bias = None if m.bias is None else m.bias.detach()[start:stop].clone()
    if isinstance(m, QuantLinear):
        return QuantLinear(shard_rows(m.qtensor, start, stop), bias, out_heads=out_heads, path=m.path,
                           in_features=m.in_features)
    if isinstance(m, nn.Linear):
        new = nn.Linear(m.in_features, stop - start, bias=bias is not None, device=m.weight.device,
                        dtype=m.weight.dtype)
        with torch.no_grad():
            new.weight.copy_(m.weight[start:stop])
            if bias is not None:
                new.bias.copy_(bias)
        return new.requires_grad_(False)
    raise TypeError(f"column-parallel needs a QuantLinear or nn.Linear, got {type(m).__name__}")


def _row_shard(m: nn.Module, start: int, stop: int, group: Group, name: str) -> RowParallel:
    """Columns ``[start, stop)`` of a QuantLinear / nn.Linear wrapped in a RowParallel."""
    bias = None if m.bias is None else m.bias.detach().clone()
    if isinstance(m, QuantLinear):
        if m.in_features != m.packed_in_features:
            raise ValueError(f"{name}: a zero-padded weight (in_features {m.in_features} < packed K "
                             f"{m.packed_in_features}) cannot be split row-parallel")
        try:
            qt = shard_cols(m.qtensor, start, stop)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
        local = QuantLinear(qt, None, in_heads=m.in_heads, path=m.path)
    elif isinstance(m, nn.Linear):
        local = nn.Linear(stop - start, m.out_features, bias=False, device=m.weight.device, dtype=m.weight.dtype)
        with torch.no_grad():
            local.weight.copy_(m.weight[:, start:stop])
        local.requires_grad_(False)
    else:
        raise TypeError(f"{name}: row-parallel needs a QuantLinear or nn.Linear, got {type(m).__name__}")
    return RowParallel(local, bias, group)


def _k_block(m: nn.Module) -> int:
    return _block(m.fmt, m.group_size) if isinstance(m, QuantLinear) else 1


def _layers(model: nn.Module, names: tuple[str, ...]) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if all(isinstance(getattr(m, c, None), nn.Module) for c in names)]


_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


def _set_local_heads(attn: nn.Module, plan: TPPlan) -> None:
    """Attention modules that keep head counts (the direct-head layout) count local heads."""
    h, hkv = plan.local_heads
    if hasattr(attn, "num_heads"):
        attn.num_heads, attn.num_kv_heads = h, hkv
    if isinstance(attn.q_proj, QuantLinear) and attn.q_proj.out_heads:
        attn.q_proj.out_heads = h
    for p in (attn.k_proj, attn.v_proj):
        if isinstance(p, QuantLinear) and p.out_heads:
            p.out_heads = hkv


def _fused_check(model: nn.Module) -> None:
    fused = [n for n, m in model.named_modules()
             if getattr(m, "qkv_proj", None) is not None or getattr(m, "gate_up_proj", None) is not None]
    if fused:
        raise NotImplementedError(f"fused projections ({fused[0]}) are not split by the tensor-parallel plan yet")


def shard_model(model: nn.Module, mesh=None) -> TPPlan:
    """Split ``model`` in place over the ranks of ``mesh`` (Megatron's plan); returns the plan.

    q/k/v/gate/up become column-parallel shards (q/k/v at key/value-head groups, writing their own
    heads), o/down row-parallel (``RowParallel``: an all-reduce, then the bias), the input
    embedding vocabulary-parallel and the output head a gathered vocabulary shard (a tied head
    keeps sharing the embedding's bytes). Every rank must call it with the same model. Works on
    ``QuantLinear`` / ``QuantEmbedding`` and their float counterparts; the full weights are
    released as the shards replace them.
    """
    group, rank, world = process_group(mesh)
    _fused_check(model)
    attns, mlps = _layers(model, _ATTN), _layers(model, _MLP)
    plan = megatron_plan(model.config, world, rank, o_blocks=[_k_block(a.o_proj) for _, a in attns],
                         down_blocks=[_k_block(m.down_proj) for _, m in mlps])
    q0, q1 = plan.q_rows
    k0, k1 = plan.kv_rows
    h, hkv = plan.local_heads
    for name, a in attns:
        a.q_proj = _col_shard(a.q_proj, q0, q1, h if getattr(a.q_proj, "out_heads", 0) else 0)
        a.k_proj = _col_shard(a.k_proj, k0, k1, hkv if getattr(a.k_proj, "out_heads", 0) else 0)
        a.v_proj = _col_shard(a.v_proj, k0, k1, hkv if getattr(a.v_proj, "out_heads", 0) else 0)
        a.o_proj = _row_shard(a.o_proj, q0, q1, group, f"{name}.o_proj")
        _set_local_heads(a, plan)
    f0, f1 = plan.span(plan.ffn)
    for name, m in mlps:
        m.gate_proj = _col_shard(m.gate_proj, f0, f1)
        m.up_proj = _col_shard(m.up_proj, f0, f1)
        m.down_proj = _row_shard(m.down_proj, f0, f1, group, f"{name}.down_proj")
    _shard_vocab(model, plan, group)
    return plan


def _shard_vocab(model: nn.Module, plan: TPPlan, group: Group, already_local: bool = False) -> None:
    """Vocabulary-parallel input embedding and gathered output head (shared bytes when tied)."""
    v0, v1 = plan.span(plan.vocab)
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = isinstance(emb, QuantEmbedding) and isinstance(head, QuantLinear) and \
        head.weight.data_ptr() == emb.weight.data_ptr()
    if not already_local:
        if isinstance(emb, QuantEmbedding):
            emb = QuantEmbedding(shard_rows(emb.qtensor, v0, v1), dtype=emb.dtype, scale=emb.scale)
        elif isinstance(emb, nn.Embedding):
            emb = _float_embedding_rows(emb, v0, v1)
        if head is not None:
            head = QuantLinear(emb.qtensor, path=head.path) if tied else _col_shard(head, v0, v1)
    model.set_input_embeddings(VocabParallelEmbedding(emb, v0, v1, group))
    if head is not None:
        model.set_output_embeddings(GatheredHead(head, plan.sizes(plan.vocab), group))


def _float_embedding_rows(emb: nn.Embedding, start: int, stop: int) -> nn.Module:
    scale = getattr(emb, "embed_scale", None)
    new = nn.Embedding(stop - start, emb.embedding_dim, device=emb.weight.device, dtype=emb.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(emb.weight[start:stop])
    new.requires_grad_(False)
    if scale is not None:  # scaled embeddings (Gemma) multiply the looked-up rows
        return _Scaled(new, scale)
    return new


class _Scaled(nn.Module):
    def __init__(self, emb: nn.Module, scale):
        super().__init__()
        self.emb, self.scale = emb, scale

    def forward(self, ids):
        out = self.emb(ids)
        return out * torch.as_tensor(self.scale, dtype=out.dtype, device=out.device)


def packed_weight_bytes(model: nn.Module) -> int:
    """Bytes of the packed weights this process holds (shared storages counted once)."""
    seen, total = set(), 0
    for m in model.modules():
        if isinstance(m, (QuantLinear, QuantEmbedding)):
            key = (m.weight.untyped_storage().data_ptr(), m.weight.device)
            if key not in seen:
                seen.add(key)
                total += m.weight.untyped_storage().nbytes()
    return total


# ---- loading straight into shards --------------------------------------------------------------

# GGUF tensor names of the layers the plan splits (llama.cpp's names, shared by every architecture).
_ROLE = re.compile(r"^blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.(weight|bias)$")
_FUSED = re.compile(r"^blk\.\d+\.(attn_qkv|ffn_gate_up)\.")


def _gguf_row_bytes(info: dict, types: dict) -> tuple[int, int, int, int]:
    """(N, K, weights per block, bytes per block) of a stored tensor."""
    tname = info["type"]
    block, type_bytes = next((b, tb) for name, b, tb in types.values() if name == tname)
    dims = info["dims"]
    N = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
    return N, dims[0], block, type_bytes


def _read_ranges(fd: int, start: int, n_rows: int, row_bytes: int, rows: Optional[tuple[int, int]],
                 byte_cols: Optional[tuple[int, int]], what: str) -> bytearray:
    """Rows ``rows`` and, of each, bytes ``byte_cols`` of a ``[n_rows, row_bytes]`` tensor stored at
    ``start``, read with ``pread``: nothing else of the file enters this process."""
    r0, r1 = rows or (0, n_rows)
    b0, b1 = byte_cols or (0, row_bytes)
    width = b1 - b0
    buf = bytearray((r1 - r0) * width)
    view = memoryview(buf)
    if width == row_bytes:  # whole rows: one contiguous range
        _pread_into(fd, view, start + r0 * row_bytes, what)
    else:
        for i, r in enumerate(range(r0, r1)):
            _pread_into(fd, view[i * width:(i + 1) * width], start + r * row_bytes + b0, what)
    return buf


def _byte_cols(K: int, cols: Optional[tuple[int, int]], block: int, block_bytes: int,
               what: str) -> Optional[tuple[int, int]]:
    """The byte range of weight columns ``cols`` in a row of blocks; a split inside a block is refused."""
    if cols is None:
        return None
    check_k_split(K, cols, block, what)
    return cols[0] // block * block_bytes, cols[1] // block * block_bytes


def _read_shard(fd: int, start: int, info: dict, types: dict, rows: Optional[tuple[int, int]],
                cols: Optional[tuple[int, int]], what: str) -> tuple[bytearray, dict]:
    """The bytes of rows ``rows`` / columns ``cols`` of a stored GGUF tensor, and its local tensor info."""
    N, K, block, type_bytes = _gguf_row_bytes(info, types)
    byte_cols = _byte_cols(K, cols, block, type_bytes, f"{what} ({info['type']}, K={K})")
    buf = _read_ranges(fd, start, N, K // block * type_bytes, rows, byte_cols, what)
    r0, r1 = rows or (0, N)
    c0, c1 = cols or (0, K)
    dims = [c1 - c0] + ([r1 - r0] if len(info["dims"]) > 1 else [])
    return buf, dict(info, dims=dims, nbytes=len(buf))


def _pread_into(fd: int, view: memoryview, offset: int, what: str) -> None:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise ValueError(f"{what}: the file ended while reading bytes {offset}..{offset + len(view)}")
        done += n


def load_sharded(path: str, mesh=None, *, device="cpu", dtype: torch.dtype = torch.float32,
                 direct_heads: bool = True):
    """``(model, plan)``: a GGUF model split over the ranks of ``mesh``, read straight into shards.

    Each rank walks the header and reads with ``pread`` only the byte ranges of its own shards
    (rows of blocks for column-parallel and vocabulary shards, a block-aligned slice of every row
    for row-parallel ones) plus the small replicated tensors (norms), so no rank holds the whole
    model at any time. The model is transformers' own (``torch_uqr.models.auto``), built at the
    local sizes, then wrapped as :func:`shard_model` does; the same greedy tokens come out as
    from one process. A split that would cut a block is refused naming the nearest valid one;
    fused q/k/v or gate/up tensors (phi3) are refused.
    """
    from .loaders.gguf import GGUFCheckpoint, GGUFMetadata, _convert, _ggml_types, _map, _walk_header
    from .models.auto import _DIRECT_HEAD_TYPES, build_from_gguf, gguf_config

    group, rank, world = process_group(mesh)
    path = os.fspath(path)
    what = f"GGUF file {path!r}"
    mm = _map(path, what)  # only the header pages are touched through the map
    positions, infos, data_start = _walk_header(mm, len(mm), what)
    types = _ggml_types()
    by_name = {t["name"]: t for t in infos}
    fused = [n for n in by_name if _FUSED.match(n)]
    if fused:
        raise NotImplementedError(f"{path}: fused projections ({fused[0]}) are not split by the tensor-parallel "
                                  "plan yet")
    full_cfg = gguf_config(path)

    def k_blocks(role: str) -> list[int]:
        return [_gguf_row_bytes(t, types)[2] for n, t in by_name.items()
                if (m := _ROLE.match(n)) and m.group(1) == role and m.group(2) == "weight"]

    plan = megatron_plan(full_cfg, world, rank, o_blocks=k_blocks("attn_output"), down_blocks=k_blocks("ffn_down"))
    spans = {"attn_q": (plan.q_rows, None), "attn_k": (plan.kv_rows, None), "attn_v": (plan.kv_rows, None),
             "attn_output": (None, plan.q_rows), "ffn_gate": (plan.span(plan.ffn), None),
             "ffn_up": (plan.span(plan.ffn), None), "ffn_down": (None, plan.span(plan.ffn))}
    vocab_rows = plan.span(plan.vocab)
    tensors, ggml_types, dequantized = {}, {}, []
    fd = os.open(path, os.O_RDONLY)
    try:
        for name, info in by_name.items():
            m = _ROLE.match(name)
            rows = cols = None
            if m:
                rows, cols = spans[m.group(1)]
                if len(info["dims"]) == 1:
                    # A bias: split with a column-parallel layer's rows (its elements are the only
                    # dim), whole for a row-parallel one (added once, after the sum).
                    rows, cols = None, rows
            elif name in ("token_embd.weight", "output.weight"):
                rows = vocab_rows
            try:
                buf, local = _read_shard(fd, data_start + info["offset"], info, types, rows, cols, name)
                tensors[name] = _convert(buf, 0, local)
            except ValueError as e:
                raise ValueError(f"{what}: tensor {name!r}: {e}") from None
            ggml_types[name] = info["type"]
            if not isinstance(tensors[name], QTensor) and info["type"] not in ("F32", "F16", "BF16", "F64"):
                dequantized.append(name)
    finally:
        os.close(fd)
    raw_info = {t["name"]: {k: t[k] for k in ("dims", "type", "offset", "nbytes")} for t in infos}
    ckpt = GGUFCheckpoint(path, tensors, GGUFMetadata(mm, len(mm), positions, what), ggml_types, dequantized,
                          raw_info)
    cfg = copy.deepcopy(full_cfg)
    h, hkv = plan.local_heads
    local = {"num_attention_heads": h, "num_key_value_heads": hkv, "head_dim": plan.head_dim,
             "intermediate_size": plan.ffn[rank + 1] - plan.ffn[rank],
             "vocab_size": vocab_rows[1] - vocab_rows[0], "pad_token_id": None}
    restore = {k: getattr(cfg, k, None) for k in local}
    for k, v in local.items():
        setattr(cfg, k, v)
    model, report = build_from_gguf(ckpt, cfg, device=device, dtype=dtype)
    if direct_heads and cfg.model_type in _DIRECT_HEAD_TYPES:
        from .models.llama import use_direct_heads

        use_direct_heads(model)
    # The modules were built at the local sizes; the config describes the whole model again.
    for k, v in restore.items():
        setattr(model.config, k, v)
    for name, a in _layers(model, _ATTN):
        a.o_proj = _wrap_row(a.o_proj, group)
    for name, m in _layers(model, _MLP):
        m.down_proj = _wrap_row(m.down_proj, group)
    _shard_vocab(model, plan, group, already_local=True)
    model.uqr_report = report
    model.uqr_plan = plan
    return model, plan


def _wrap_row(local: nn.Module, group: Group) -> RowParallel:
    """A module already holding its K shard, as a RowParallel (its bias moves after the sum)."""
    bias = local.bias
    if bias is not None:
        if isinstance(local, QuantLinear):
            local.bias = None
        else:
            local.register_parameter("bias", None)
    return RowParallel(local, bias, group)


# ---- safetensors files written by save_quantized ----------------------------------------------

_ST_DTYPES = {"U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
              "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
              "BOOL": torch.bool}


class _SafetensorsShards:
    """Byte ranges of the tensors of one safetensors file, read with ``pread`` (header checked first)."""

    def __init__(self, path: str):
        import json
        import struct

        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        size = os.fstat(self.fd).st_size
        head = os.pread(self.fd, 8, 0)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < n <= size - 8:
            raise ValueError(f"{path!r}: not a safetensors file (header length {n}, file size {size})")
        try:
            header = json.loads(os.pread(self.fd, n, 8))
        except ValueError as e:
            raise ValueError(f"{path!r}: the safetensors header is not valid JSON: {e}") from None
        header.pop("__metadata__", None)
        self.data_start, self.header = 8 + n, header
        for key, info in header.items():
            a, b = info["data_offsets"]
            dtype = _ST_DTYPES.get(info["dtype"])
            if dtype is None:
                raise ValueError(f"{path!r}: tensor {key!r} has dtype {info['dtype']}, not one torch_uqr reads")
            if not 0 <= a <= b <= size - self.data_start or b - a != math.prod(info["shape"]) * dtype.itemsize:
                raise ValueError(f"{path!r}: tensor {key!r} bytes {a}..{b} disagree with its shape or the file size")

    def close(self) -> None:
        os.close(self.fd)

    def __contains__(self, key: str) -> bool:
        return key in self.header

    def read(self, key: str, rows: Optional[tuple[int, int]] = None, byte_cols: Optional[tuple[int, int]] = None):
        """Rows ``rows`` and, of each, bytes ``byte_cols`` (a 1-D tensor: bytes of its only row)."""
        info = self.header[key]
        dtype, shape = _ST_DTYPES[info["dtype"]], list(info["shape"])
        N, C = (shape[0], math.prod(shape[1:])) if len(shape) > 1 else (1, math.prod(shape))
        item = dtype.itemsize
        buf = _read_ranges(self.fd, self.data_start + info["data_offsets"][0], N, C * item, rows, byte_cols,
                           f"{self.path!r}: {key}")
        t = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
        r0, r1 = rows or (0, N)
        width = (byte_cols[1] - byte_cols[0]) // item if byte_cols else C
        return t.reshape(width) if len(shape) <= 1 else t.reshape(r1 - r0, width)


def _st_linear(src: _SafetensorsShards, name: str, rows=None, cols=None, out_heads: int = 0) -> nn.Module:
    """The shard (``rows`` or K columns ``cols``) of a linear layer stored by ``save_quantized``:
    a QuantLinear where the file has its packed bytes, else an nn.Linear."""
    from .nn.linear import _decode_fmt, _decode_shape

    has_bias = f"{name}.bias" in src
    bias = None
    if has_bias:
        item = _ST_DTYPES[src.header[f"{name}.bias"]["dtype"]].itemsize
        bias = src.read(f"{name}.bias", byte_cols=None if rows is None else (rows[0] * item, rows[1] * item))
    if f"{name}.weight_format" in src:
        fmt = _decode_fmt(src.read(f"{name}.weight_format"))
        N, K, g, in_features = _decode_shape(src.read(f"{name}.weight_shape"))
        block, nbytes = format_table.spec(fmt).block_geometry(g)
        if cols is not None and in_features != K:
            raise ValueError(f"{name}: a zero-padded weight (in_features {in_features} < packed K {K}) cannot be "
                             "split row-parallel")
        data = src.read(f"{name}.weight", rows, _byte_cols(K, cols, block, nbytes, f"{name} ({fmt}, K={K})"))
        r0, r1 = rows or (0, N)
        c0, c1 = cols or (0, K)
        qt = QTensor._validated(data, fmt, (r1 - r0, c1 - c0), **({"group_size": g} if format_table.spec(fmt).grouped
                                                                   else {}))
        local = QuantLinear(qt, None if cols is not None else bias, out_heads=out_heads,
                            in_features=None if cols is not None else in_features)
    else:
        item = _ST_DTYPES[src.header[f"{name}.weight"]["dtype"]].itemsize
        w = src.read(f"{name}.weight", rows, None if cols is None else (cols[0] * item, cols[1] * item))
        local = nn.Linear(w.shape[1], w.shape[0], bias=bias is not None and cols is None, dtype=w.dtype)
        with torch.no_grad():
            local.weight.copy_(w)
            if bias is not None and cols is None:
                local.bias.copy_(bias)
        local.requires_grad_(False)
    return local if cols is None else (local, bias)


def load_quantized_sharded(model: nn.Module, path: str, mesh=None, *, device="cpu") -> TPPlan:
    """Fill ``model`` (a skeleton, e.g. built on the meta device) with this rank's shards of a
    safetensors file written by ``save_quantized``, reading only their byte ranges; returns the plan.

    The model's module names must be the file's. Layers split as in :func:`shard_model`; float
    tensors of the other modules (norms) are read whole. Non-persistent buffers (rotary tables)
    are computed by transformers' initializer, as ``from_pretrained`` does.
    """
    from .models.auto import _materialize_buffers
    from .nn.linear import _decode_fmt, _decode_shape

    group, rank, world = process_group(mesh)
    _fused_check(model)
    src = _SafetensorsShards(os.fspath(path))
    try:
        attns, mlps = _layers(model, _ATTN), _layers(model, _MLP)

        def k_block(name: str) -> int:
            if f"{name}.weight_format" not in src:
                return 1
            _, _, g, _ = _decode_shape(src.read(f"{name}.weight_shape"))
            return _block(_decode_fmt(src.read(f"{name}.weight_format")), g)

        plan = megatron_plan(model.config, world, rank, o_blocks=[k_block(f"{n}.o_proj") for n, _ in attns],
                             down_blocks=[k_block(f"{n}.down_proj") for n, _ in mlps])
        done: set[str] = set()
        for name, a in attns:
            a.q_proj = _st_linear(src, f"{name}.q_proj", rows=plan.q_rows)
            a.k_proj = _st_linear(src, f"{name}.k_proj", rows=plan.kv_rows)
            a.v_proj = _st_linear(src, f"{name}.v_proj", rows=plan.kv_rows)
            a.o_proj = RowParallel(*_st_linear(src, f"{name}.o_proj", cols=plan.q_rows), group)
            _set_local_heads(a, plan)
            done |= {f"{name}.{p}" for p in _ATTN}
        for name, m in mlps:
            m.gate_proj = _st_linear(src, f"{name}.gate_proj", rows=plan.span(plan.ffn))
            m.up_proj = _st_linear(src, f"{name}.up_proj", rows=plan.span(plan.ffn))
            m.down_proj = RowParallel(*_st_linear(src, f"{name}.down_proj", cols=plan.span(plan.ffn)), group)
            done |= {f"{name}.{p}" for p in _MLP}
        names = {mod: n for n, mod in model.named_modules()}
        emb, head = model.get_input_embeddings(), model.get_output_embeddings()
        emb_name = names[emb]
        v0, v1 = plan.span(plan.vocab)
        table = src.read(f"{emb_name}.weight", rows=(v0, v1))
        local_emb = nn.Embedding(v1 - v0, table.shape[1], dtype=table.dtype).requires_grad_(False)
        with torch.no_grad():
            local_emb.weight.copy_(table)
        scale = getattr(emb, "scalar_embed_scale", None)  # scaled embeddings (Gemma 3)
        done.add(emb_name)
        if head is not None:
            head_name = names[head]
            if f"{head_name}.weight" in src:
                local_head = _st_linear(src, head_name, rows=(v0, v1))
            else:  # tied: the head reads the embedding shard
                local_head = nn.Linear(table.shape[1], v1 - v0, bias=False, dtype=table.dtype)
                local_head.weight = local_emb.weight
            done.add(head_name)
        for key, t in list(model.state_dict(keep_vars=True).items()):
            module_name, _, leaf = key.rpartition(".")
            if any(module_name == d or module_name.startswith(d + ".") for d in done):
                continue
            if key in src:
                module = model.get_submodule(module_name)
                value = src.read(key).reshape(t.shape).to(t.dtype)
                if leaf in module._parameters:
                    p = nn.Parameter(value, requires_grad=False)
                    p._is_hf_initialized = True
                    module._parameters[leaf] = p
                else:
                    module._buffers[leaf] = value
    finally:
        src.close()
    local_emb = local_emb if scale is None else _Scaled(local_emb, float(scale))
    model.set_input_embeddings(VocabParallelEmbedding(local_emb, v0, v1, group))
    if head is not None:
        model.set_output_embeddings(GatheredHead(local_head, plan.sizes(plan.vocab), group))
        if hasattr(model, "all_tied_weights_keys"):
            model.all_tied_weights_keys = {}
        model.config.tie_word_embeddings = False
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ValueError(f"{path}: the file has no tensor for {', '.join(missing)}")
    _materialize_buffers(model, torch.device(device))
    model.to(device)
    return plan
