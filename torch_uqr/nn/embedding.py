"""``QuantEmbedding``: an ``nn.Embedding`` whose table stays in a packed format.

A lookup gathers the packed rows of the requested ids and decodes only those, so the float table
is never built. The output is the exact decode (``torch_uqr.dequantize``) of those rows, times an
optional scale (Gemma multiplies its embeddings by sqrt(hidden size)).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..formats import get as _format_module
from ..qtensor import QTensor

__all__ = ["QuantEmbedding"]


class QuantEmbedding(nn.Module):
    """Embedding lookup on a packed ``[num_embeddings, embedding_dim]`` table.

    Args:
        qt: the packed table (one row per token).
        dtype: dtype of the looked-up vectors (default float32).
        scale: optional factor applied to every looked-up vector, in ``dtype``.
        padding_idx: kept for reference only (inference-only module, nothing is trained).
    """

    def __init__(self, qt: QTensor, *, dtype: torch.dtype = torch.float32, scale: Optional[float] = None,
                 padding_idx: Optional[int] = None):
        super().__init__()
        if not isinstance(qt, QTensor):
            raise ValueError(f"qt must be a QTensor, got {type(qt).__name__}")
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
        self.register_buffer("weight", qt.data)
        self.fmt = qt.fmt
        self.group_size = qt.group_size
        self.num_embeddings, self.embedding_dim = (int(v) for v in qt.shape)
        self.dtype = dtype
        self.scale = None if scale is None else float(scale)
        self.padding_idx = padding_idx
        self._decode = _format_module(qt.fmt).decode

    @classmethod
    def from_embedding(cls, emb: nn.Embedding, qt: QTensor) -> "QuantEmbedding":
        """A QuantEmbedding over ``qt`` in place of ``emb``: its dtype, padding index and, for
        scaled embeddings (Gemma), its ``scalar_embed_scale``."""
        return cls(qt, dtype=emb.weight.dtype, scale=getattr(emb, "scalar_embed_scale", None),
                   padding_idx=emb.padding_idx)

    @property
    def qtensor(self) -> QTensor:
        """The packed table as a QTensor (shares ``weight``'s storage)."""
        return QTensor(self.weight, self.fmt, (self.num_embeddings, self.embedding_dim), self.group_size)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        flat = input_ids.reshape(-1)
        rows = self.weight.index_select(0, flat)
        out = self._decode(rows, flat.numel(), self.embedding_dim, self.group_size).to(self.dtype)
        if self.scale is not None:
            # Same rounding as transformers' scaled embeddings: the scale is cast to the output dtype first.
            out = out * torch.tensor(self.scale, dtype=self.dtype, device=out.device)
        return out.reshape(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}, fmt={self.fmt}, dtype={self.dtype}"
        return s + (f", scale={self.scale:g}" if self.scale is not None else "")
