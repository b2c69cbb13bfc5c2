"""v54: the decode-to-dense kernel's speed (csrc/cuda/dequant.cu) - decode alone, and the scratch
path at large M next to cuBLAS on predecoded weights - in one process. In v54 the build had an
A/B switch, UQR_DEQUANT_CPT (chunks per thread, read once per process; printed as cpt=); the
committed kernel has none (4 chunks), so the label then only echoes the variable. Same method as bench_cuda: graph replay, inputs
rotated past the L2, medians; two rounds."""
import argparse
import os

import torch

from torch_uqr.bench_cuda import _n_sets, _time_calls
from torch_uqr.triton_kernels.dispatch import gemm_triton, scratch_decoder
from torch_uqr.triton_kernels.testing import random_packed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="14336x4096")
    ap.add_argument("--M", type=int, default=2048)
    ap.add_argument("--formats", default="q4_0,q4_k,mlx4")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    N, K = map(int, a.shape.split("x"))
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    dec = scratch_decoder()
    cpt = os.environ.get("UQR_DEQUANT_CPT", "2")
    n = _n_sets(N * K * 2, l2)
    X = [torch.randn(a.M, K, device="cuda", dtype=torch.bfloat16) for _ in range(n)]
    for fmt in a.formats.split(","):
        g = 64 if fmt == "mlx4" else 0
        W = [random_packed(fmt, N, K, g, seed=s, device="cuda") for s in range(n)]
        Wd = [dec(w, fmt, N, K, g, dtype=torch.bfloat16) for w in W]
        cases = {
            "decode": [lambda j=j: dec(W[j], fmt, N, K, g, dtype=torch.bfloat16) for j in range(n)],
            "cublas": [lambda j=j: X[j] @ Wd[j].t() for j in range(n)],
            "scratch": [lambda j=j: gemm_triton(X[j], W[j], fmt, N, K, g, kernel="scratch") for j in range(n)],
        }
        res = {name: [] for name in cases}
        for _ in range(2):
            for name, calls in cases.items():
                res[name].append(_time_calls(calls, a.reps) * 1e3)
        print(f"cpt={cpt} {a.shape} {fmt:6s} decode {res['decode'][0]:6.1f} / {res['decode'][1]:6.1f}  "
              f"M={a.M} scratch {res['scratch'][0]:6.1f} / {res['scratch'][1]:6.1f}  "
              f"cublas {res['cublas'][0]:6.1f} / {res['cublas'][1]:6.1f} us", flush=True)
        del W, Wd
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
