"""Time the decode-to-dense kernels on the GPU: the CUDA C++ one (csrc/cuda/dequant.cu) against
the Triton one, and the scratch path they feed (decode + cuBLAS) against cuBLAS on a dense bf16
weight, with bench_cuda's method (CUDA-graph replay, weights rotated over >= 6 copies so they are
not L2-resident, median of --reps).

    python bench/dequant_bench.py --shapes 14336x4096,4096x14336 --M 512,4096 --json out.json
"""
from __future__ import annotations

import argparse
import json
import traceback

import torch

from torch_uqr.bench_cuda import _errors, _n_sets, _time_calls
from torch_uqr.triton_kernels import configs
from torch_uqr.triton_kernels.dequant import dequantize_cuda, dequantize_triton
from torch_uqr.triton_kernels.dispatch import gemm_triton
from torch_uqr.triton_kernels.formats_meta import block_geometry
from torch_uqr.triton_kernels.testing import random_packed, reference_dequantize

DECODERS = {"cuda": dequantize_cuda, "triton": dequantize_triton}


def _sets(nbytes: int, l2: int) -> int:
    return max(6, _n_sets(nbytes, l2))


def bench_decode(N: int, K: int, fmt: str, g: int, reps: int, l2: int, rows: list) -> list:
    """Both decoders on one format and shape; returns the weights for the scratch timings."""
    elems, nbytes = block_geometry(fmt, g)
    packed = N * (K // elems) * nbytes
    W = [random_packed(fmt, N, K, g, seed=s, device="cuda") for s in range(_sets(packed, l2))]
    outs = {name: fn(W[0], fmt, N, K, g, dtype=torch.bfloat16) for name, fn in DECODERS.items()}
    same = bool(torch.equal(outs["cuda"].view(torch.int16), outs["triton"].view(torch.int16)))
    for name, fn in DECODERS.items():
        ms = _time_calls([lambda j=j: fn(W[j], fmt, N, K, g, dtype=torch.bfloat16) for j in range(len(W))], reps)
        gbps = (packed + N * K * 2) / (ms * 1e-3) / 1e9
        rows.append({"N": N, "K": K, "fmt": fmt, "group_size": g, "kernel": f"dequant_{name}", "us": ms * 1e3,
                     "GBps": gbps, "packed_bytes": packed, "cuda_equals_triton": same})
        print(f"{N}x{K} {fmt:10s} dequant {name:6s} {ms * 1e3:7.1f} us {gbps:6.0f} GB/s "
              f"(cuda == triton bits: {same})", flush=True)
    return W


def bench_scratch(N: int, K: int, fmt: str, g: int, W: list, Ms: list, X: list, reps: int, rows: list) -> None:
    """The scratch path (decode into x's dtype + cuBLAS) with each decoder, checked vs float64."""
    w_ref = reference_dequantize(W[0], fmt, N, K, g)
    for M in Ms:
        ref = X[0][:M].double() @ w_ref.t()
        for name, enabled in (("cuda", True), ("triton", False)):
            configs.CUDA_DEQUANT_ENABLED = enabled
            def call(j, M=M):
                return gemm_triton(X[j % len(X)][:M], W[j], fmt, N, K, g, kernel="scratch")
            err = _errors(call(0), ref)
            ms = _time_calls([lambda j=j: call(j) for j in range(len(W))], reps)
            rows.append({"N": N, "K": K, "M": M, "fmt": fmt, "group_size": g, "kernel": f"scratch_{name}",
                         "us": ms * 1e3, **err})
            print(f"{N}x{K} M={M:5d} {fmt:10s} scratch {name:6s} {ms * 1e3:8.1f} us err {err['max_rel_err']:.1e}",
                  flush=True)
    configs.CUDA_DEQUANT_ENABLED = True
    del w_ref


def bench_cublas(N: int, K: int, Ms: list, X: list, reps: int, l2: int, rows: list) -> None:
    Wd = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(_sets(N * K * 2, l2))]
    for M in Ms:
        ms = _time_calls([lambda j=j: X[j % len(X)][:M] @ Wd[j].t() for j in range(len(Wd))], reps)
        rows.append({"N": N, "K": K, "M": M, "fmt": "bf16", "kernel": "cublas", "us": ms * 1e3})
        print(f"{N}x{K} M={M:5d} cublas bf16 {ms * 1e3:8.1f} us", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="14336x4096,4096x14336")
    ap.add_argument("--formats", default="q4_0,q4_1,q8_0,q4_k,mlx4,var_affine,exl3,ternary")
    ap.add_argument("--mlx4-group", type=int, default=64)
    ap.add_argument("--M", default="512,4096", help="scratch-path row counts ('' skips the scratch timings)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    Ms = [int(m) for m in args.M.split(",") if m]
    rows: list = []
    for shape in args.shapes.split(","):
        N, K = (int(v) for v in shape.split("x"))
        X = [torch.randn(max(Ms), K, device="cuda", dtype=torch.bfloat16) for _ in range(2)] if Ms else []
        if Ms:
            bench_cublas(N, K, Ms, X, args.reps, l2, rows)
        for fmt in args.formats.split(","):
            g = args.mlx4_group if fmt == "mlx4" else 0
            try:  # one format failing must not cost the others
                W = bench_decode(N, K, fmt, g, args.reps, l2, rows)
                if Ms:
                    bench_scratch(N, K, fmt, g, W, Ms, X, args.reps, rows)
                del W
            except Exception as exc:  # noqa: BLE001
                traceback.print_exc()
                rows.append({"N": N, "K": K, "fmt": fmt, "error": repr(exc)[:300]})
            torch.cuda.empty_cache()
            if args.json:  # written as it goes, so a timeout still leaves the rows so far
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=1)
        del X
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
