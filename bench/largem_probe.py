"""Where the scratch path's time goes at large M (bench/NOTES.md v13): cuBLAS alone, the decoder
alone, decode + cuBLAS as the scratch path runs them, and cuBLAS on the same weights decoded ahead,
each timed as bench_cuda times (graph replay, inputs rotated past the L2), in an interleaved order
so that clock drift shows; then the scratch path's kernels under torch.profiler."""
import argparse
import json

import torch

from torch_uqr.bench_cuda import _n_sets, _time_calls
from torch_uqr.triton_kernels.dispatch import gemm_triton, scratch_decoder
from torch_uqr.triton_kernels.testing import random_packed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="14336x4096")
    ap.add_argument("--M", default="2048,4096")
    ap.add_argument("--formats", default="q4_0,q8_0")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    N, K = map(int, a.shape.split("x"))
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    dec = scratch_decoder()
    out = []
    for fmt in a.formats.split(","):
        g = 64 if fmt == "mlx4" else 0
        n = _n_sets(N * K * 2, l2)  # sets of dense weights: as many as cuBLAS's own rows use
        W = [random_packed(fmt, N, K, g, seed=s, device="cuda") for s in range(n)]
        Wd = [dec(w, fmt, N, K, g, dtype=torch.bfloat16) for w in W]
        for M in map(int, a.M.split(",")):
            X = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in range(n)]
            cases = {
                "cublas_predecoded": [lambda j=j: X[j] @ Wd[j].t() for j in range(n)],
                "decode_only": [lambda j=j: dec(W[j], fmt, N, K, g, dtype=torch.bfloat16) for j in range(n)],
                "decode_then_mm": [lambda j=j: X[j] @ dec(W[j], fmt, N, K, g, dtype=torch.bfloat16).t()
                                   for j in range(n)],
                "scratch_path": [lambda j=j: gemm_triton(X[j], W[j], fmt, N, K, g, kernel="scratch")
                                 for j in range(n)],
            }
            for rnd in range(2):
                for name, calls in cases.items():
                    ms = _time_calls(calls, a.reps)
                    out.append({"fmt": fmt, "N": N, "K": K, "M": M, "case": name, "round": rnd, "us": ms * 1e3})
                    print(f"{fmt:6s} M={M:5d} round {rnd} {name:18s} {ms*1e3:8.1f} us", flush=True)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    for c in cases["scratch_path"]:
                        c()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8), flush=True)
            del X
        del W, Wd
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
