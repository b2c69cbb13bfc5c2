"""Placeholder: being written."""
from_mlx = to_mlx = from_bitnet = from_gguf_ternary = None
