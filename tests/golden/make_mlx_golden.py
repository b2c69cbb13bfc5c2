"""Write tests/golden/mlx4_golden.npz (4-bit) and mlx_family_golden.npz (every bit width of the
MLX family): MLX's own quantize / dequantize / quantized_matmul outputs.

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


def golden_family(seed: int = 4321, bits_list=(2, 3, 4, 5, 6, 8), n: int = 5, k: int = 256, m: int = 3) -> dict:
    """Keys b{bits}_g{g}_{w, wq, scales, biases, dequant32, x, qmm} for every bit width and group size."""
    rng = np.random.default_rng(seed)
    out = {"mlx_version": np.array(mx.__version__)}
    for bits in bits_list:
        for g in GROUP_SIZES:
            w = (rng.standard_t(3.0, size=(n, k)) * 0.05).astype(np.float16)
            wq, scales, biases = mx.quantize(mx.array(w), group_size=g, bits=bits)
            s32, b32 = scales.astype(mx.float32), biases.astype(mx.float32)
            x = rng.standard_normal((m, k)).astype(np.float32)
            key = f"b{bits}_g{g}_"
            out[key + "w"] = w
            out[key + "wq"] = np.array(wq)
            out[key + "scales"] = np.array(scales)
            out[key + "biases"] = np.array(biases)
            out[key + "dequant32"] = np.array(mx.dequantize(wq, s32, b32, group_size=g, bits=bits))
            out[key + "x"] = x
            out[key + "qmm"] = np.array(mx.quantized_matmul(mx.array(x), wq, s32, b32, transpose=True,
                                                            group_size=g, bits=bits))
    return out


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    for name, data in (("mlx4_golden.npz", golden()), ("mlx_family_golden.npz", golden_family())):
        np.savez_compressed(os.path.join(here, name), **data)
        print("wrote", os.path.join(here, name))
