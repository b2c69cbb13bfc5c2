"""Loaders that keep a checkpoint's quantized bytes as they are (no re-quantization).

- ``load_gguf(path)``: GGUF files (llama.cpp), Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K/TQ1_0/TQ2_0 kept as QTensors
  over a private memory map of the file; metadata decoded on access (``GGUFMetadata``).
- ``load_mlx(path)``: MLX safetensors checkpoints with quantized weight/scales/biases triples.
- ``load_bitnet(path)``: Hugging Face BitNet checkpoints (packed uint8 weights + weight_scale).
"""
from .gguf import GGUFCheckpoint, GGUFMetadata, load_gguf
from .mlx import load_mlx
from .bitnet import load_bitnet

__all__ = ["GGUFCheckpoint", "GGUFMetadata", "load_gguf", "load_mlx", "load_bitnet"]
