"""Load a Hugging Face BitNet checkpoint keeping its ternary weights packed (``ternary`` QTensors).

BitNet's safetensors hold each linear as ``<name>.weight``: uint8 ``[ceil(N/4), K]`` with four
2-bit codes per byte (value + 1), and ``<name>.weight_scale``. ``BitLinear`` divides by that scale,
``AutoBitLinear`` multiplies; config.json's ``quantization_config.linear_class`` says which, and
``convention`` overrides it. The repack into our 32-weight ternary blocks is
``torch_uqr.from_bitnet`` (exact when the per-tensor scale fits fp16).
"""
from __future__ import annotations

import os
from typing import Mapping, Optional, Union

import torch

from ..qtensor import QTensor
from ._safetensors import checkpoint_files, read_tensors

__all__ = ["load_bitnet"]

_CONVENTIONS = {"bitlinear": "divide", "autobitlinear": "multiply"}


def _convention(config: dict, convention: Optional[str], path: str) -> str:
    if convention is not None:
        if convention not in ("divide", "multiply"):
            raise ValueError(f"convention must be 'divide' or 'multiply', got {convention!r}")
        return convention
    q = config.get("quantization_config") or {}
    cls = str(q.get("linear_class", "bitlinear")).lower() if isinstance(q, dict) else "bitlinear"
    if cls not in _CONVENTIONS:
        raise ValueError(f"{path!r}: unknown quantization_config.linear_class {cls!r}; "
                         "pass convention='divide' or 'multiply'")
    return _CONVENTIONS[cls]


def load_bitnet(path: Union[str, os.PathLike], *, convention: Optional[str] = None,
                out_features: Optional[Mapping[str, int]] = None) -> dict[str, Union[QTensor, torch.Tensor]]:
    """Tensors of a BitNet checkpoint (a .safetensors file or a folder with config.json).

    Every ``<layer>.weight`` that is uint8 and has a ``<layer>.weight_scale`` (one value, or one per row) becomes a
    ``ternary`` QTensor ``(N, K)``; the scale is consumed. ``N`` is ``4 * packed rows`` unless
    ``out_features[<layer>.weight]`` gives it (the packing rounds N up to a multiple of 4).
    Other tensors are returned as they are.
    """
    from ..interop import from_bitnet

    path = os.fspath(path)
    files, config = checkpoint_files(path)
    conv = _convention(config, convention, path)
    tensors = read_tensors(files)
    out: dict[str, Union[QTensor, torch.Tensor]] = {}
    consumed = set()
    for key, t in tensors.items():
        if not key.endswith(".weight_scale"):
            continue
        wkey = key[: -len("_scale")]
        packed = tensors.get(wkey)
        if packed is None:
            raise ValueError(f"{path!r}: {key!r} has no matching {wkey!r}")
        if packed.dtype != torch.uint8 or packed.dim() != 2:
            raise ValueError(f"{path!r}: {wkey!r} must be 2-D uint8 packed ternary codes, got "
                             f"{packed.dtype} {tuple(packed.shape)}")
        n = int((out_features or {}).get(wkey, 4 * packed.shape[0]))
        if not 4 * packed.shape[0] - 3 <= n <= 4 * packed.shape[0]:
            raise ValueError(f"{path!r}: out_features {n} for {wkey!r} does not match "
                             f"{packed.shape[0]} packed rows (expected {4 * packed.shape[0] - 3}..{4 * packed.shape[0]})")
        try:
            out[wkey] = from_bitnet(packed, t.float(), n, convention=conv)
        except ValueError as e:
            raise ValueError(f"{path!r}: {wkey!r}: {e}") from e
        consumed.update((wkey, key))
    for key, t in tensors.items():
        if key not in consumed:
            out[key] = t
    return out
