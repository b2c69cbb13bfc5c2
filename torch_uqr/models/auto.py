"""Any GGUF model transformers can read, as a transformers ``PreTrainedModel`` on packed weights.

``from_pretrained(path)`` follows what ``transformers``' own ``from_pretrained(dir, gguf_file=...)``
does for the file (its config mapping, its GGUF -> transformers tensor-name mapping and its
per-architecture tensor processor), but builds the model with its parameters on the meta device
and fills it from ``load_gguf``: every linear weight the file holds in a packed format becomes a
``QuantLinear`` over the file's own blocks, a packed token embedding a ``QuantEmbedding`` (rows
decoded on lookup), and a tied output head a ``QuantLinear`` over the embedding's bytes.

transformers' tensor processors may change a weight on load. Which change they make is found by
running the processor on a probe whose entries encode their own row and column: a pure row
permutation (llama.cpp's q/k rotary order) is applied to the packed rows, which is exact because
blocks never span rows; anything else decodes that tensor to float, runs the processor on the
values and lists it in the ``LoadReport``. Tensors whose ggml type has no packed format here
arrive from ``load_gguf`` already decoded to float, and are listed too.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from ..loaders.gguf import GGUFCheckpoint, load_gguf
from ..nn import QuantLinear
from ..nn import QuantEmbedding
from ..qtensor import QTensor, dequantize

__all__ = ["LoadReport", "from_pretrained", "load_gguf_model", "gguf_config", "gguf_tokenizer", "take_rows",
           "tie_packed_head", "gguf_names",
           "gguf_architecture"]

# Model types whose attention the direct-head layout of ``models.llama`` reproduces exactly.
_DIRECT_HEAD_TYPES = ("llama",)


@dataclass
class LoadReport:
    """What ``load_gguf_model`` did with every tensor of the file."""

    path: str
    architecture: str                                       # the file's general.architecture
    model_type: str                                         # transformers' model_type
    packed: dict[str, str] = field(default_factory=dict)    # module -> format of its packed weight
    row_permuted: list[str] = field(default_factory=list)   # packed modules whose rows were reordered
    float_fallback: dict[str, str] = field(default_factory=dict)  # parameter -> why it is float
    dequantized: list[str] = field(default_factory=list)    # file tensors decoded (no packed format)
    tied_head: bool = False                                 # lm_head reads the embedding's blocks
    unused: list[str] = field(default_factory=list)         # file tensors transformers does not use

    def __str__(self) -> str:
        kinds: dict[str, int] = {}
        for f in self.packed.values():
            kinds[f] = kinds.get(f, 0) + 1
        lines = [f"{os.path.basename(self.path)} ({self.architecture} -> {self.model_type}): "
                 f"{len(self.packed)} modules packed {kinds}"
                 + (", lm_head tied to the packed embedding" if self.tied_head else "")]
        if self.row_permuted:
            lines.append(f"rows reordered on the packed blocks: {len(self.row_permuted)} modules")
        if self.dequantized:
            lines.append(f"decoded to float (ggml type without a packed format): {', '.join(self.dequantized)}")
        for name, why in self.float_fallback.items():
            lines.append(f"float: {name}: {why}")
        if self.unused:
            lines.append(f"not used by transformers: {', '.join(self.unused)}")
        return "\n".join(lines)


# ---- config and tokenizer (cached: parsing a large vocabulary takes seconds) -------------------

def cache_dir(path: str) -> str:
    """Per-file cache folder (``$UQR_CACHE`` or ``~/.cache/torch_uqr``), keyed by path, size and mtime."""
    st = os.stat(path)
    key = hashlib.sha1(f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    root = os.environ.get("UQR_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "torch_uqr"))
    return os.path.join(root, f"{os.path.basename(path)}-{key}")


def _split(path: str) -> tuple[str, str]:
    path = os.path.abspath(path)
    return os.path.dirname(path), os.path.basename(path)


def _cached(path: str, sub: str, marker: str, auto_cls):
    """``auto_cls.from_pretrained(dir, gguf_file=...)``, saved once under the file's cache folder."""
    cache = os.path.join(cache_dir(path), sub)
    if os.path.isfile(os.path.join(cache, marker)):
        return auto_cls.from_pretrained(cache)
    folder, name = _split(path)
    obj = auto_cls.from_pretrained(folder, gguf_file=name)
    os.makedirs(cache, exist_ok=True)
    obj.save_pretrained(cache)
    return obj


def gguf_config(path: str):
    """transformers' config for a GGUF file, as ``AutoConfig.from_pretrained(dir, gguf_file=...)`` builds it."""
    from transformers import AutoConfig

    return _cached(path, "", "config.json", AutoConfig)


def gguf_tokenizer(path: str):
    """transformers' tokenizer (chat template included) converted from the GGUF's own vocabulary."""
    from transformers import AutoTokenizer

    return _cached(path, "tokenizer", "tokenizer.json", AutoTokenizer)


# ---- transforms on packed rows --------------------------------------------------------------

def take_rows(w, rows: torch.Tensor):
    """``w[rows]`` for a QTensor (whole rows of blocks move, bytes untouched) or a float tensor."""
    if isinstance(w, QTensor):
        kw = {"group_size": w.group_size} if w.group_size else {}
        return QTensor.from_bytes(w.data[rows.to(w.data.device)].contiguous(), w.fmt, tuple(w.shape), **kw)
    return w[rows]


class _NotRowOnly(Exception):
    """The processor does more to a tensor than reorder its rows."""


def _process(processor, values: np.ndarray, name: str, mapping: dict) -> np.ndarray:
    res = processor.process(weights=values, name=name, tensor_key_mapping=mapping,
                            parsed_parameters={"tensors": {}})
    if res.name != name:
        raise _NotRowOnly(f"the {type(processor).__name__} renames it to {res.name!r}")
    return np.asarray(res.weights)


def _row_order(processor, name: str, n_rows: int, mapping: dict) -> Optional[torch.Tensor]:
    """The row order the processor applies to a ``[n_rows, K]`` tensor (None: unchanged).

    Probe entry (r, c) holds ``2r + c`` for two columns: the output is a pure row permutation iff
    every output row is some ``(2r, 2r+1)`` and every r appears once. Raises _NotRowOnly otherwise.
    """
    probe = (2 * np.arange(n_rows, dtype=np.float64)[:, None] + np.arange(2, dtype=np.float64)[None, :])
    try:
        out = _process(processor, probe.copy(), name, mapping)
    except _NotRowOnly:
        raise
    except Exception as e:  # a processor that needs the real K, or fails on the probe
        raise _NotRowOnly(f"the {type(processor).__name__} could not be probed: {e}") from None
    if out.shape != probe.shape or not np.array_equal(out[:, 1], out[:, 0] + 1) or np.any(out[:, 0] % 2):
        raise _NotRowOnly(f"the {type(processor).__name__} changes values, not only the row order")
    src = (out[:, 0] // 2).astype(np.int64)
    if not np.array_equal(np.sort(src), np.arange(n_rows)):
        raise _NotRowOnly(f"the {type(processor).__name__} repeats or drops rows")
    return None if np.array_equal(src, np.arange(n_rows)) else torch.from_numpy(src)


# ---- building the model ---------------------------------------------------------------------

def _tensor_processor(architecture: str, config):
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    return TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())


def _weights_map(model: nn.Module, processor, arch: str) -> dict[str, str]:
    """GGUF tensor name -> transformers parameter name, as transformers' ``get_gguf_hf_weights_map``.

    Same rule (gguf's name table for the architecture, tried on every parameter name relative to
    each enclosing module, the outermost match winning) with the table built once instead of
    once per submodule, which takes most of a load's time on a 30-layer model.
    """
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch_id = next((k for k, v in MODEL_ARCH_NAMES.items() if v == arch), None)
    if arch_id is None:
        raise ValueError(f"the gguf package does not know architecture {arch!r}")
    table = get_tensor_name_map(arch_id, model.config.num_hidden_layers)
    out: dict[str, str] = {}
    names = [processor.preprocess_name(n) for n in model.state_dict(keep_vars=True)]
    depth = 0
    while names:
        deeper = []
        for full in names:
            parts = full.split(".")
            rel = ".".join(parts[depth:])
            stem, suffix = (rel.rsplit(".", 1) if rel.endswith((".weight", ".bias")) else (rel, None))
            gname = table.get_name(stem)
            qual = ".".join(parts[:depth]) + "." if depth else ""
            if gname is None:
                processor.perform_fallback_tensor_mapping(out, "." + suffix if suffix else "", qual, rel)
            else:
                out.setdefault(gname + ("." + suffix if suffix else ""), full)
            if len(parts) - depth > 2:
                deeper.append(full)
        names, depth = deeper, depth + 1
    return out


def gguf_architecture(config) -> str:
    """The GGUF architecture name for a transformers config (a mistral is written as llama, as
    llama.cpp's converter does); ValueError when the gguf package has no name table for it."""
    from gguf import MODEL_ARCH_NAMES

    arch = {"mistral": "llama"}.get(config.model_type, config.model_type)
    if arch not in MODEL_ARCH_NAMES.values():
        raise ValueError(f"model_type {config.model_type!r} has no GGUF architecture in the gguf package")
    return arch


def gguf_names(model: nn.Module, arch: str) -> tuple[dict[str, str], Any]:
    """(GGUF tensor name -> the model's parameter name, transformers' tensor processor) for
    ``model`` as a GGUF file of architecture ``arch``: the mapping the loader uses, for writers."""
    processor = _tensor_processor(arch, model.config)
    return _weights_map(model, processor, arch), processor


def _set_param(model: nn.Module, name: str, value: torch.Tensor) -> None:
    module_name, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_name)
    old = getattr(module, leaf)
    if tuple(old.shape) != tuple(value.shape):
        raise ValueError(f"{name} expects shape {tuple(old.shape)}, the file gives {tuple(value.shape)}")
    p = nn.Parameter(value.to(dtype=old.dtype).contiguous(), requires_grad=False)
    p._is_hf_initialized = True
    module._parameters[leaf] = p


def _materialize_buffers(model, device) -> None:
    """Give the non-persistent buffers (rotary frequencies, embedding scales) their values.

    They were created on the meta device with the parameters; transformers' own initializer
    computes them, and every loaded tensor carries ``_is_hf_initialized`` so it is left alone.
    """
    fresh = set()
    for name, buf in list(model.named_buffers()):
        if buf is not None and buf.is_meta:
            module_name, _, leaf = name.rpartition(".")
            model.get_submodule(module_name)._buffers[leaf] = torch.empty_like(buf, device=device)
            fresh.add(name)
    for t in model.parameters():
        t._is_hf_initialized = True
    for name, buf in model.named_buffers():
        if name not in fresh:
            buf._is_hf_initialized = True
    model.initialize_weights()


def build_from_gguf(ckpt: GGUFCheckpoint, config, *, device="cpu", dtype=torch.float32) -> tuple[nn.Module, LoadReport]:
    """transformers' model for ``config`` with the weights of ``ckpt``, packed where the file is."""
    from transformers import AutoModelForCausalLM
    device = torch.device(device)
    arch = ckpt.architecture
    try:
        from transformers.integrations.gguf import GGUF_ARCHS
    except ImportError:  # older transformers: every architecture goes through the tensor processors
        GGUF_ARCHS = {}
    if arch in GGUF_ARCHS:
        # transformers converts these through weight-conversion mappings, not the tensor
        # processors probed here; loading them without those conversions would be silently wrong.
        raise NotImplementedError(f"{ckpt.path}: architecture {arch!r} is loaded by transformers' weight-conversion "
                                  "path, which torch_uqr does not reproduce yet")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    report = LoadReport(ckpt.path, arch, config.model_type)
    processor = _tensor_processor(arch, config)
    # The file's architecture names its tensors (a llama-architecture file may hold a mistral).
    mapping = _weights_map(model, processor, arch)
    dequantized = set(getattr(ckpt, "dequantized", ()))
    report.dequantized = [n for n in ckpt if n in dequantized]
    done: set[str] = set()

    def float_values(gname: str, w) -> torch.Tensor:
        values = dequantize(w) if isinstance(w, QTensor) else w.float()
        return torch.from_numpy(_process(processor, values.numpy().copy(), gname, mapping).copy()).to(device)

    # Pass 1: packed weights of linear and embedding modules.
    for gname in ckpt:
        w, hf = ckpt[gname], mapping.get(gname)
        if hf is None or not isinstance(w, QTensor) or not hf.endswith(".weight"):
            continue
        module_name = hf[: -len(".weight")]
        module = model.get_submodule(module_name)
        if not isinstance(module, (nn.Linear, nn.Embedding)):
            report.float_fallback[hf] = f"{type(module).__name__} has no packed counterpart"
            continue
        try:
            rows = _row_order(processor, gname, w.shape[0], mapping)
        except _NotRowOnly as e:
            report.float_fallback[hf] = str(e)
            continue
        want = tuple(module.weight.shape)
        if tuple(w.shape) != want:
            raise ValueError(f"{ckpt.path}: {gname} -> {hf} expects {want}, the file holds {tuple(w.shape)}")
        qt = (take_rows(w, rows) if rows is not None else w).to(device)
        if isinstance(module, nn.Embedding):
            new = QuantEmbedding.from_embedding(module, qt)
        else:
            bias = None
            if module.bias is not None:
                bname = gname[: -len(".weight")] + ".bias"
                if bname not in ckpt:
                    raise ValueError(f"{ckpt.path}: {hf} has a bias but the file has no {bname!r}")
                bias = float_values(bname, ckpt[bname]).to(module.bias.dtype)
                done.add(bname)
            new = QuantLinear.from_qtensor(qt, bias)
        model.set_submodule(module_name, new)
        report.packed[module_name] = qt.fmt
        if rows is not None:
            report.row_permuted.append(module_name)
        done.add(gname)

    # Pass 2: everything else, as transformers loads it (values through the tensor processor).
    for gname in ckpt:
        if gname in done:
            continue
        hf = mapping.get(gname)
        if hf is None:
            report.unused.append(gname)
            continue
        _set_param(model, hf, float_values(gname, ckpt[gname]))

    # A tied output head: the file has no output.weight and the head reads the embedding.
    head = model.get_output_embeddings()
    emb = model.get_input_embeddings()
    if head is not None and not isinstance(head, QuantLinear) and head.weight.is_meta:
        if isinstance(emb, QuantEmbedding):
            report.packed[tie_packed_head(model)] = emb.fmt
            report.tied_head = True
        else:
            head.weight = emb.weight
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ValueError(f"{ckpt.path}: the file has no tensor for {', '.join(missing)}")
    _materialize_buffers(model, device)
    model.eval()
    return model, report


def _module_name(model: nn.Module, module: nn.Module) -> str:
    return next(n for n, m in model.named_modules() if m is module)


def tie_packed_head(model: nn.Module) -> str:
    """Make the output head a QuantLinear over the packed input embedding's own bytes; returns
    the head's module name. transformers is told the weights are no longer tied, so that it does
    not tie the head back to a float table."""
    emb = model.get_input_embeddings()
    model.set_output_embeddings(QuantLinear.from_qtensor(emb.qtensor))
    model.config.tie_word_embeddings = False
    if hasattr(model.config, "get_text_config"):
        model.config.get_text_config().tie_word_embeddings = False
    model.all_tied_weights_keys = {}
    return _module_name(model, model.get_output_embeddings())


def load_gguf_model(path: str, *, device="cpu", dtype=torch.float32, direct_heads: bool = True,
                    ckpt: Optional[GGUFCheckpoint] = None):
    """``(model, report)`` for a GGUF file; see :func:`from_pretrained`."""
    ckpt = ckpt if ckpt is not None else load_gguf(path)
    config = gguf_config(path)
    model, report = build_from_gguf(ckpt, config, device=device, dtype=dtype)
    if direct_heads and config.model_type in _DIRECT_HEAD_TYPES:
        from .llama import use_direct_heads

        use_direct_heads(model)
    model.uqr_report = report
    return model, report


def _is_gguf(path: str) -> bool:
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def from_pretrained(path_or_gguf: str, *, device="cpu", dtype: torch.dtype = torch.float32,
                    direct_heads: bool = True, **hf_kwargs: Any):
    """A transformers ``PreTrainedModel`` whose weights run on the router.

    ``path_or_gguf`` is a GGUF file (or a folder holding exactly one): its packed tensors stay
    packed (see the module docstring) and ``model.uqr_report`` says what happened to each one.
    ``model.generate()``, ``TextStreamer`` and the tokenizer of :func:`gguf_tokenizer` work as
    with any transformers model. ``direct_heads`` uses the direct-head attention layout for
    llama models. Any other folder is a Hugging Face checkpoint and goes to
    ``AutoModelForCausalLM.from_pretrained(path, **hf_kwargs)`` (pass
    ``quantization_config=UqrConfig(...)`` to quantize it on load).
    """
    path = os.fspath(path_or_gguf)
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):
        ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
        if len(ggufs) != 1:
            raise ValueError(f"{path}: expected a GGUF file, a folder with exactly one .gguf or a Hugging Face "
                             f"checkpoint folder (config.json); found {len(ggufs)} .gguf files and no config.json")
        path = os.path.join(path, ggufs[0])
    if _is_gguf(path):
        if hf_kwargs:
            raise ValueError(f"options {sorted(hf_kwargs)} apply to Hugging Face checkpoints, not to a GGUF file")
        return load_gguf_model(path, device=device, dtype=dtype, direct_heads=direct_heads)[0]
    if not os.path.isdir(path):
        raise ValueError(f"path_or_gguf must be a GGUF file or a checkpoint folder, got {path!r}")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **hf_kwargs)
    return model.to(device).eval()
