"""Placeholder: being written."""
load_gguf = load_mlx = load_bitnet = None
