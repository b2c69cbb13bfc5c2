"""Load an MLX quantized checkpoint (safetensors) keeping its 4-bit groups as ``mlx4`` QTensors.

MLX stores a quantized linear as ``<name>.weight`` (uint32 words, 8 nibbles each),
``<name>.scales`` and ``<name>.biases`` (one per group). Each triple becomes one QTensor via the
lossless ``torch_uqr.from_mlx``; every other tensor is returned as it is.
"""
from __future__ import annotations

import os
from typing import Optional, Union

import torch

from ..qtensor import QTensor
from ._safetensors import checkpoint_files, read_tensors

__all__ = ["load_mlx"]


def _quant_config(config: dict) -> tuple[Optional[int], Optional[int]]:
    q = config.get("quantization") or config.get("quantization_config") or {}
    if not isinstance(q, dict):
        raise ValueError(f"config.json 'quantization' must be an object, got {type(q).__name__}")
    return q.get("group_size"), q.get("bits")


def load_mlx(path: Union[str, os.PathLike], group_size: Optional[int] = None) -> dict[str, Union[QTensor, torch.Tensor]]:
    """Tensors of an MLX checkpoint (a .safetensors file or a folder with config.json).

    Returns ``{name: tensor}`` where each quantized ``<layer>.weight`` is an ``mlx4`` QTensor of
    shape ``(N, K)`` (its ``.scales`` / ``.biases`` are consumed). The group size comes from
    ``group_size``, else config.json, else the array shapes. Only 4-bit MLX quantization maps
    onto ``mlx4``; other bit widths raise ValueError.
    """
    from ..interop import from_mlx

    path = os.fspath(path)
    files, config = checkpoint_files(path)
    cfg_group, bits = _quant_config(config)
    if bits not in (None, 4):
        raise ValueError(f"{path!r}: MLX checkpoint uses {bits}-bit quantization; only 4-bit maps onto mlx4")
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
            raise ValueError(f"{path!r}: {wkey!r} must be a 2-D uint32 array of packed nibbles, "
                             f"got {wq.dtype} {tuple(wq.shape)}")
        if scales.dim() != 2 or scales.shape != biases.shape or scales.shape[0] != wq.shape[0]:
            raise ValueError(f"{path!r}: {base!r}: scales {tuple(scales.shape)} / biases {tuple(biases.shape)} "
                             f"do not match weight {tuple(wq.shape)}")
        K = wq.shape[1] * 8
        g = group_size or cfg_group or (K // scales.shape[1] if scales.shape[1] else 0)
        if g not in (32, 64, 128) or K != g * scales.shape[1]:
            raise ValueError(f"{path!r}: {base!r}: group size {g} does not fit K={K} with "
                             f"{scales.shape[1]} groups per row (expected 32, 64 or 128)")
        try:
            out[wkey] = from_mlx(wq.view(torch.int32).numpy().view("uint32"), scales.float().numpy(),
                                 biases.float().numpy(), group_size=g)
        except ValueError as e:
            raise ValueError(f"{path!r}: {base!r}: {e}") from e
        consumed.update((wkey, key, bkey))
    for key, t in tensors.items():
        if key not in consumed:
            out[key] = t
    return out
