"""Times the pipelined scratch path (torch_uqr/triton_kernels/scratch_pipeline.py) against the plain
one and cuBLAS on dense weights, over slice counts and ring sizes (bench/NOTES.md v13). Same method
as bench_cuda: graph replay, input sets rotated past the L2, medians; each configuration's output is
compared with the plain path's before it is timed."""
import argparse
import json

import torch

from torch_uqr.bench_cuda import _n_sets, _time_calls
from torch_uqr.triton_kernels.dispatch import scratch_decoder
from torch_uqr.triton_kernels.formats_meta import block_geometry
from torch_uqr.triton_kernels.scratch_pipeline import scratch_pipelined
from torch_uqr.triton_kernels.testing import random_packed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="14336x4096,4096x14336,4096x4096")
    ap.add_argument("--M", default="128,512,2048,4096")
    ap.add_argument("--formats", default="q4_0,exl3")
    ap.add_argument("--configs", default="1x1,2x2,4x2,4x3,8x2,8x3,16x3")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    dec = scratch_decoder()
    # "SxR" = S slices in R buffers; "SxRfP" = the first slice P % of N (scratch_pipeline.slice_bounds)
    configs = []
    for c in a.configs.split(","):
        sr, _, pct = c.partition("f")
        configs.append((*map(int, sr.split("x")), float(pct or 0) / 100))
    out = []
    for shape in a.shapes.split(","):
        N, K = map(int, shape.split("x"))
        nd = _n_sets(N * K * 2, l2)
        Wd = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(nd)]
        Ms = list(map(int, a.M.split(",")))
        X = [torch.randn(max(Ms), K, device="cuda", dtype=torch.bfloat16) for _ in range(8)]
        for M in Ms:
            ms = _time_calls([lambda j=j: X[j % 8][:M] @ Wd[j].t() for j in range(nd)], a.reps)
            out.append({"N": N, "K": K, "M": M, "case": "cublas", "us": ms * 1e3})
            print(f"{shape} M={M:5d} cublas {ms*1e3:8.1f} us", flush=True)
        del Wd
        for fmt in a.formats.split(","):
            g = 64 if fmt == "mlx4" else 0
            elems, nbytes = block_geometry(fmt, g)
            n = _n_sets(N * (K // elems) * nbytes, l2)
            W = [random_packed(fmt, N, K, g, seed=s, device="cuda") for s in range(n)]
            for M in Ms:
                Y = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(n)]
                ref = scratch_pipelined(X[0][:M], W[0], fmt, N, K, g, torch.empty(M, N, device="cuda",
                                        dtype=torch.bfloat16), dec, 1).float()
                line = []
                for chunks, ring, first in configs:
                    y = scratch_pipelined(X[0][:M], W[0], fmt, N, K, g, Y[0].fill_(float("nan")), dec, chunks, ring,
                                          first)
                    torch.cuda.synchronize()
                    err = float((y.float() - ref).abs().max() / ref.abs().max())
                    ms = _time_calls([lambda j=j: scratch_pipelined(X[j % 8][:M], W[j], fmt, N, K, g, Y[j], dec,
                                                                    chunks, ring, first) for j in range(n)], a.reps)
                    name = f"{chunks}x{ring}" + (f"f{round(first * 100)}" if first else "")
                    out.append({"N": N, "K": K, "M": M, "fmt": fmt, "case": name, "us": ms * 1e3,
                                "rel_err_vs_plain": err})
                    line.append(f"{name} {ms*1e3:7.1f}" + ("" if err < 1e-2 else f" ERR {err:.1e}"))
                print(f"{shape} M={M:5d} {fmt:6s} " + " | ".join(line), flush=True)
                del Y
            del W
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
