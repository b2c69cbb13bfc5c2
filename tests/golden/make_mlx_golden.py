"""Write tests/golden/mlx4_golden.npz: MLX's own quantize / dequantize / quantized_matmul outputs.

Run where ``mlx`` installs (``pip install "mlx[cpu]"``): ``python tests/golden/make_mlx_golden.py``.
The test suite compares against this file when mlx cannot be imported, and against live mlx
otherwise. Weights are fp16 so that MLX's scales and biases are fp16, as in MLX model files.
"""
import os

import mlx.core as mx
import numpy as np

GROUP_SIZES = (32, 64, 128)
N, K, M = 12, 384, 3


def golden(seed: int = 1234) -> dict:
    rng = np.random.default_rng(seed)
    out = {"mlx_version": np.array(mx.__version__)}
    for g in GROUP_SIZES:
        w = (rng.standard_t(3.0, size=(N, K)) * 0.05).astype(np.float16)
        wq, scales, biases = mx.quantize(mx.array(w), group_size=g, bits=4)
        s32, b32 = scales.astype(mx.float32), biases.astype(mx.float32)
        x = rng.standard_normal((M, K)).astype(np.float32)
        out[f"g{g}_w"] = w
        out[f"g{g}_wq"] = np.array(wq)
        out[f"g{g}_scales"] = np.array(scales)
        out[f"g{g}_biases"] = np.array(biases)
        out[f"g{g}_dequant32"] = np.array(mx.dequantize(wq, s32, b32, group_size=g, bits=4))
        out[f"g{g}_dequant16"] = np.array(mx.dequantize(wq, scales, biases, group_size=g, bits=4))
        out[f"g{g}_x"] = x
        out[f"g{g}_qmm"] = np.array(mx.quantized_matmul(mx.array(x), wq, s32, b32, transpose=True,
                                                        group_size=g, bits=4))
    return out


if __name__ == "__main__":
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mlx4_golden.npz")
    np.savez_compressed(path, **golden())
    print("wrote", path)
