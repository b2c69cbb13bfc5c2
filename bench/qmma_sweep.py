"""Sweep of the tensor-core kernels on the GPU: time + check uqr::_qmma_cuda (and, with --cublas /
--peers, cuBLAS and other gemm_triton kernels beside it) for a few formats, shapes and row counts,
with bench_cuda's method (graph replay, weights rotated out of L2, median). UQR_QMMA_TAG labels the
rows (the version being measured).

    UQR_QMMA_TAG=v11 python bench/qmma_sweep.py --M 1,16,128 --peers fused,scratch --json out.json
"""
from __future__ import annotations

import argparse
import json
import os

import torch

from torch_uqr.bench_cuda import _errors, _n_sets, _time_calls
from torch_uqr.triton_kernels.dispatch import gemm_triton
from torch_uqr.triton_kernels.formats_meta import block_geometry
from torch_uqr.triton_kernels.testing import random_packed, reference_dequantize


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--M", default="1,16")
    ap.add_argument("--shapes", default="14336x4096,4096x14336,4096x4096")
    ap.add_argument("--formats", default="q4_0,q4_k,q4_1,mlx4,ternary,q8_0")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--cublas", action="store_true")
    ap.add_argument("--peers", default="", help="gemm_triton kernels to time beside it, e.g. fused,scratch")
    ap.add_argument("--no-qmma", action="store_true", help="time only the peers (and cuBLAS)")
    ap.add_argument("--json")
    args = ap.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    Ms = [int(m) for m in args.M.split(",")]
    tag = os.environ.get("UQR_QMMA_TAG", "qmma")
    rows = []
    for shape in args.shapes.split(","):
        N, K = (int(v) for v in shape.split("x"))
        X = [torch.randn(max(Ms), K, device="cuda", dtype=torch.bfloat16) for _ in range(8)]
        if args.cublas:
            n_sets = _n_sets(N * K * 2, l2)
            Wd = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(n_sets)]
            for M in Ms:
                ms = _time_calls([lambda j=j: X[j % 8][:M] @ Wd[j].t() for j in range(n_sets)], args.reps)
                rows.append({"N": N, "K": K, "M": M, "fmt": "bf16", "kernel": "cublas", "ms": ms})
                print(f"{N}x{K} M={M:3d} cublas {ms * 1e3:7.1f} us", flush=True)
            del Wd
        for fmt in args.formats.split(","):
            g = 64 if fmt == "mlx4" else 0
            elems, nbytes = block_geometry(fmt, g)
            n_sets = _n_sets(N * (K // elems) * nbytes, l2)
            W = [random_packed(fmt, N, K, g, seed=s, device="cuda") for s in range(n_sets)]
            w_ref = reference_dequantize(W[0], fmt, N, K, g)
            for M in Ms:
                def call(j, M=M):
                    return torch.ops.uqr._qmma_cuda(X[j % 8][:M], W[j], fmt, N, K, g, 0, False)
                if not args.no_qmma:
                    err = _errors(call(0), X[0][:M].double() @ w_ref.t())
                    ms = _time_calls([lambda j=j: call(j) for j in range(n_sets)], args.reps)
                    gbps = N * (K // elems) * nbytes / (ms * 1e-3) / 1e9
                    rows.append({"N": N, "K": K, "M": M, "fmt": fmt, "kernel": "qmma", "tag": tag, "ms": ms, "GBps": gbps, **err})
                    print(f"{N}x{K} M={M:3d} {fmt:8s} {tag} {ms * 1e3:7.1f} us {gbps:6.0f} GB/s "
                          f"err {err['max_rel_err']:.1e}", flush=True)
                for peer in filter(None, args.peers.split(",")):
                    def other(j, M=M, peer=peer):
                        return gemm_triton(X[j % 8][:M], W[j], fmt, N, K, g, kernel=peer)
                    err = _errors(other(0), X[0][:M].double() @ w_ref.t())
                    ms = _time_calls([lambda j=j: other(j) for j in range(n_sets)], args.reps)
                    rows.append({"N": N, "K": K, "M": M, "fmt": fmt, "kernel": peer, "ms": ms, **err})
                    print(f"{N}x{K} M={M:3d} {fmt:8s} {peer} {ms * 1e3:7.1f} us err {err['max_rel_err']:.1e}", flush=True)
            del W
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
