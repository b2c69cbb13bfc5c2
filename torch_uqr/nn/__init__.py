"""``nn.Linear`` replacements on packed weights, and swapping them into a model.

``QuantLinear`` (``linear.py``) holds a QTensor and runs ``torch.ops.uqr.gemm``; ``QuantEmbedding``
(``embedding.py``) looks rows up in a packed table; ``quantize_model`` (``swap.py``) replaces a
model's linear layers in place, and ``set_path`` picks their router path.
"""
from .embedding import QuantEmbedding
from .linear import QuantLinear, block_size_of, load_quantized, save_quantized
from .swap import SwapSummary, layer_format, quantize_model, set_path

__all__ = ["QuantLinear", "QuantEmbedding", "block_size_of", "save_quantized", "load_quantized", "quantize_model",
           "SwapSummary", "layer_format", "set_path"]
