"""torch-uqr: the Universal Quantization Router.

One PyTorch operator, ``torch.ops.uqr.gemm``, that multiplies activations by weights stored in
GGUF Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q5_K / Q6_K, MLX 4-bit affine, an EXL2-style
variable-rate affine format, an EXL3-style codebook format or BitNet ternary, decoding the packed blocks on the fly.
"""
from .qtensor import QTensor, QuantizationWarning, formats, quantize, dequantize
from .interop import from_mlx, to_mlx, from_bitnet, from_gguf_ternary
from .ops import gemm
from . import nn
from .nn import quantize_model
from .loaders import load_gguf, load_mlx, load_bitnet
from .models.auto import from_pretrained, gguf_tokenizer
from .models.export import save_gguf

__all__ = [
    "QTensor", "QuantizationWarning", "formats", "quantize", "dequantize",
    "from_mlx", "to_mlx", "from_bitnet", "from_gguf_ternary",
    "gemm", "nn", "quantize_model", "load_gguf", "load_mlx", "load_bitnet",
    "from_pretrained", "gguf_tokenizer", "save_gguf",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    # UqrConfig subclasses a transformers class: import transformers only when it is asked for.
    if name == "UqrConfig":
        from .models.hf_quantizer import UqrConfig

        return UqrConfig
    raise AttributeError(f"module 'torch_uqr' has no attribute {name!r}")
