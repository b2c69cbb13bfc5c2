"""MLX loader: being written."""
def load_mlx(path): raise NotImplementedError
