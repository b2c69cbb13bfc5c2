"""Path "int8" on CUDA (csrc/cuda/qmma_int8.cu) against the exact small-M kernel, on the GPU: checks
uqr::_int8_cuda against a float64 product of the int8-rounded x (rounded here in torch fp32, as the
kernel's pre-pass and the CPU int8 path round it), then times both with bench_cuda's method (graph
replay, weights rotated out of L2, median).

    PYTHONPATH=. python bench/int8_probe.py --M 1,8,16 --json out.json
"""
from __future__ import annotations

import argparse
import json

import torch

from torch_uqr.bench_cuda import _errors, _n_sets, _time_calls
from torch_uqr.triton_kernels.formats_meta import block_geometry
from torch_uqr.triton_kernels.testing import random_packed, reference_dequantize

SPAN = {"q4_0": 32, "q4_k": 256, "mlx4": 64, "ternary": 32, "var_affine": 256, "exl3": 256}  # mlx4 at g = 64
ONE_ROW = ("mlx4", "ternary", "var_affine", "exl3")  # their int8 kernel takes one row


def int8_rounded(x: torch.Tensor, span: int) -> torch.Tensor:
    """x as the int8 path sees it: codes round-half-even(x / d), d = amax / 127 per span, in fp32."""
    xs = x.float().reshape(x.shape[0], -1, span)
    d = xs.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(xs * inv).clamp(-128, 127)
    return (q.double() * d.double()).reshape(x.shape)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--M", default="1,8,16")
    ap.add_argument("--shapes", default="14336x4096,4096x14336,4096x4096")
    ap.add_argument("--formats", default="q4_0,q4_k,mlx4,ternary")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--cublas", action="store_true", help="also time cuBLAS bf16 on dense weights (rotated)")
    ap.add_argument("--no-exact", action="store_true", help="time the int8 kernel only")
    args = ap.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    Ms = [int(m) for m in args.M.split(",")]
    rows = []
    for shape in args.shapes.split(","):
        N, K = (int(v) for v in shape.split("x"))
        X = [torch.randn(max(Ms), K, device="cuda", dtype=torch.bfloat16) for _ in range(8)]
        if args.cublas:
            n_dense = _n_sets(N * K * 2, l2)
            Wd = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(n_dense)]
            for M in Ms:
                ms = _time_calls([lambda j=j, M=M: X[j % 8][:M] @ Wd[j].t() for j in range(n_dense)], args.reps)
                rows.append({"N": N, "K": K, "M": M, "fmt": "dense", "kernel": "cublas", "ms": ms})
                print(f"{N}x{K} M={M:3d} cuBLAS bf16 {ms * 1e3:7.1f} us", flush=True)
            del Wd
        for fmt in args.formats.split(","):
            g = 64 if fmt == "mlx4" else 0
            elems, nbytes = block_geometry(fmt, g)
            n_sets = _n_sets(N * (K // elems) * nbytes, l2)
            W = [random_packed(fmt, N, K, g, seed=s, device="cuda") for s in range(n_sets)]
            w_ref = reference_dequantize(W[0], fmt, N, K, g)
            for M in Ms:
                ops = {"exact": torch.ops.uqr._qmma_cuda, "int8": torch.ops.uqr._int8_cuda}
                if fmt in ONE_ROW and M > 1:
                    del ops["int8"]
                if args.no_exact:
                    del ops["exact"]
                for name, op in ops.items():
                    def call(j, M=M, op=op):
                        return op(X[j % 8][:M], W[j], fmt, N, K, g, 0, False)
                    xr = X[0][:M].double() if name == "exact" else int8_rounded(X[0][:M], SPAN[fmt])
                    err = _errors(call(0), xr @ w_ref.t())
                    err_exact = _errors(call(0), X[0][:M].double() @ w_ref.t())
                    ms = _time_calls([lambda j=j: call(j) for j in range(n_sets)], args.reps)
                    gbps = N * (K // elems) * nbytes / (ms * 1e-3) / 1e9
                    rows.append({"N": N, "K": K, "M": M, "fmt": fmt, "kernel": name, "ms": ms, "GBps": gbps,
                                 "max_rel_err_own_ref": err["max_rel_err"],
                                 "max_rel_err_vs_exact": err_exact["max_rel_err"]})
                    print(f"{N}x{K} M={M:3d} {fmt:5s} {name:5s} {ms * 1e3:7.1f} us {gbps:6.0f} GB/s "
                          f"err(own ref) {err['max_rel_err']:.1e} err(vs exact x) {err_exact['max_rel_err']:.1e}",
                          flush=True)
            del W
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
