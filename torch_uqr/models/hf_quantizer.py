"""Quantize a Hugging Face checkpoint while transformers loads it: ``quantization_config=UqrConfig(...)``.

Importing this module registers ``UqrConfig`` and its quantizer with transformers (method name
``"uqr"``). transformers then hands every ``nn.Linear`` weight to the quantizer as it reads it
from the checkpoint, one tensor at a time; the packed bytes take the float weight's place, and
once loading ends each such layer becomes a ``QuantLinear``. The float model is never held in
memory as a whole.

Left in float: layers named in ``skip`` (fnmatch patterns on module names), weights tied to
another parameter (a tied output head stays the embedding's float weight), and layers whose
input width is not a multiple of the format's block.
"""
from __future__ import annotations

import fnmatch
from typing import Iterable, Optional

import torch
from torch import nn
from transformers.core_model_loading import ConversionOps
from transformers.quantizers import HfQuantizer, register_quantization_config, register_quantizer
from transformers.quantizers.auto import AUTO_QUANTIZATION_CONFIG_MAPPING, AUTO_QUANTIZER_MAPPING
from transformers.utils.quantization_config import QuantizationConfigMixin

from ..formats import get as _format_module, resolve_group_size
from ..nn import QuantLinear, block_size_of
from ..qtensor import QTensor, quantize

__all__ = ["UqrConfig", "UqrHfQuantizer"]

METHOD = "uqr"


class UqrConfig(QuantizationConfigMixin):
    """transformers quantization config: every linear layer into ``fmt`` on load.

    Args:
        fmt: one of ``torch_uqr.formats()``.
        group_size: an MLX-family format's group size (32 / 64 / 128; default 64).
        skip: module-name patterns (fnmatch) to keep in float, e.g. ``["lm_head"]``.
    """

    def __init__(self, fmt: str = "q4_k", group_size: Optional[int] = None, skip: Optional[Iterable[str]] = None,
                 **kwargs):
        _format_module(fmt)  # a clear error for an unknown format
        self.quant_method = METHOD
        self.fmt = fmt
        self.group_size = group_size
        self.skip = list(skip or [])


class _Quantize(ConversionOps):
    """Float weight -> packed bytes, applied by transformers' loader to each weight as it is read."""

    def __init__(self, quantizer: "UqrHfQuantizer"):
        self.quantizer = quantizer

    @torch.no_grad()
    def convert(self, input_dict, full_layer_name=None, model=None, **kwargs):
        cfg = self.quantizer.quantization_config
        out = {}
        for key, value in input_dict.items():
            w = value[0] if isinstance(value, list) else value
            out[key] = quantize(w.float(), cfg.fmt, group_size=cfg.group_size).data
        return out


class UqrHfQuantizer(HfQuantizer):
    """The transformers side of :class:`UqrConfig` (see the module docstring)."""

    requires_calibration = False

    def __init__(self, quantization_config: UqrConfig, **kwargs):
        super().__init__(quantization_config, **kwargs)
        if self.pre_quantized:
            raise ValueError("UqrConfig quantizes float checkpoints on load; this checkpoint says it is "
                             "already quantized with 'uqr', which cannot be read back this way")

    def validate_environment(self, *args, **kwargs) -> None:
        return None

    def _block(self) -> int:
        cfg = self.quantization_config
        return block_size_of(cfg.fmt, group_size=cfg.group_size)

    def param_needs_quantization(self, model, param_name: str, **kwargs) -> bool:
        module_name, _, leaf = param_name.rpartition(".")
        if leaf != "weight":
            return False
        try:
            module = model.get_submodule(module_name)
        except AttributeError:
            return False
        if type(module) is not nn.Linear or module.in_features % self._block():
            return False
        if param_name in (getattr(model, "all_tied_weights_keys", None) or {}):
            return False
        return not any(fnmatch.fnmatchcase(module_name, p) for p in self.quantization_config.skip)

    def get_quantize_ops(self) -> ConversionOps:
        return _Quantize(self)

    def _process_model_after_weight_loading(self, model, **kwargs):
        cfg = self.quantization_config
        for name, module in list(model.named_modules()):
            if type(module) is nn.Linear and module.weight.dtype == torch.uint8:
                qt = QTensor(module.weight.data, cfg.fmt, (module.out_features, module.in_features),
                             resolve_group_size(cfg.fmt, cfg.group_size))
                model.set_submodule(name, QuantLinear.from_qtensor(qt, module.bias))
        return model

    @property
    def is_trainable(self) -> bool:
        return False

    @property
    def is_compileable(self) -> bool:
        return True

    def is_serializable(self, safe_serialization=None) -> bool:
        return False


if METHOD not in AUTO_QUANTIZATION_CONFIG_MAPPING:
    register_quantization_config(METHOD)(UqrConfig)
if METHOD not in AUTO_QUANTIZER_MAPPING:
    register_quantizer(METHOD)(UqrHfQuantizer)
