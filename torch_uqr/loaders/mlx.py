"""Load an MLX quantized checkpoint (safetensors) keeping its groups as ``mlx<bits>`` QTensors.

MLX stores a quantized linear as ``<name>.weight`` (uint32 words of packed ``bits``-bit codes),
``<name>.scales`` and ``<name>.biases`` (one per group); config.json's ``quantization`` gives
``group_size`` and ``bits``, and mixed-precision models (mlx_lm's quantization predicates) add a
``{group_size, bits}`` entry under a layer's name there. Each triple becomes one QTensor via the
lossless ``torch_uqr.from_mlx``; every other tensor is returned as it is.
"""
from __future__ import annotations

import os
from typing import Optional, Union

import torch

from ..qtensor import QTensor
from ._safetensors import checkpoint_files, read_tensors

__all__ = ["load_mlx"]


def _quant_config(config: dict) -> dict:
    q = config.get("quantization") or config.get("quantization_config") or {}
    if not isinstance(q, dict):
        raise ValueError(f"config.json 'quantization' must be an object, got {type(q).__name__}")
    return q


def _layer_quant(q: dict, base: str) -> tuple[Optional[int], Optional[int]]:
    """(group_size, bits) of layer ``base``: its own entry of a mixed-precision config, else the defaults."""
    layer = q.get(base)
    if isinstance(layer, dict):
        return layer.get("group_size", q.get("group_size")), layer.get("bits", q.get("bits"))
    return q.get("group_size"), q.get("bits")


def load_mlx(path: Union[str, os.PathLike], group_size: Optional[int] = None) -> dict[str, Union[QTensor, torch.Tensor]]:
    """Tensors of an MLX checkpoint (a .safetensors file or a folder with config.json).

    Returns ``{name: tensor}`` where each quantized ``<layer>.weight`` is an ``mlx<bits>`` QTensor
    of shape ``(N, K)`` (its ``.scales`` / ``.biases`` are consumed). The bit width comes from
    config.json (per layer where it has an entry for it); the group size from ``group_size``, else
    config.json, else the array shapes. A file without config.json is read as MLX's default
    4-bit. A bit width torch-uqr has no format for raises ValueError.
    """
    from ..interop import from_mlx

    path = os.fspath(path)
    files, config = checkpoint_files(path)
    qcfg = _quant_config(config)
    tensors = read_tensors(files)
    out: dict[str, Union[QTensor, torch.Tensor]] = {}
    consumed = set()
    for key, t in tensors.items():
        if not key.endswith(".scales"):
            continue
        base = key[: -len(".scales")]
        wkey, bkey = base + ".weight", base + ".biases"
        if wkey not in tensors or bkey not in tensors:
            raise ValueError(f"{path!r}: {key!r} has no matching {wkey!r} and {bkey!r}")
        wq, scales, biases = tensors[wkey], t, tensors[bkey]
        if wq.dtype not in (torch.uint32, torch.int32) or wq.dim() != 2:
            raise ValueError(f"{path!r}: {wkey!r} must be a 2-D uint32 array of packed codes, "
                             f"got {wq.dtype} {tuple(wq.shape)}")
        if scales.dim() != 2 or scales.shape != biases.shape or scales.shape[0] != wq.shape[0]:
            raise ValueError(f"{path!r}: {base!r}: scales {tuple(scales.shape)} / biases {tuple(biases.shape)} "
                             f"do not match weight {tuple(wq.shape)}")
        cfg_group, bits = _layer_quant(qcfg, base)
        g = group_size or cfg_group
        if g is None and bits is None:
            bits = 4
        try:
            out[wkey] = from_mlx(wq.view(torch.int32).numpy().view("uint32"), scales.float().numpy(),
                                 biases.float().numpy(), group_size=g, bits=bits)
        except ValueError as e:
            raise ValueError(f"{path!r}: {base!r}: {e}") from e
        consumed.update((wkey, key, bkey))
    for key, t in tensors.items():
        if key not in consumed:
            out[key] = t
    return out
