"""Time the CUDA C++ small-M kernel against the Triton path and cuBLAS bf16 (H200 run of task F).

For N x K in {14336 x 4096, 4096 x 4096}, M in {1, 8}, every format, bf16 x: CUDA-graph replay with
the weight sets rotated over > 3 x L2 (torch_uqr/bench_cuda.py's method and helpers); each kernel's
first output checked against float64. Writes a markdown table and JSON to the given directory.
    python bench/cuda_gemv_bench.py OUT_DIR
"""
from __future__ import annotations

import json
import os
import sys

import torch

from torch_uqr.bench_cuda import FORMATS, MLX4_GROUP, _errors, _n_sets, _time_calls
from torch_uqr.triton_kernels.dispatch import gemm_triton
from torch_uqr.triton_kernels.formats_meta import block_geometry
from torch_uqr.triton_kernels.testing import random_packed, reference_dequantize

SHAPES = ((14336, 4096), (4096, 4096))
MS = (1, 8)
REPS = 15


def bench(out_dir: str) -> list[dict]:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows: list[dict] = []
    for N, K in SHAPES:
        n_dense = _n_sets(N * K * 2, l2)
        Wd = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(n_dense)]
        X = [torch.randn(max(MS), K, device="cuda", dtype=torch.bfloat16) for _ in range(64)]
        cublas = {M: _time_calls([lambda j=j, M=M: X[j][:M] @ Wd[j].t() for j in range(n_dense)], REPS)
                  for M in MS}
        del Wd
        for fmt in FORMATS:
            g = MLX4_GROUP if fmt == "mlx4" else 0
            elems, nbytes = block_geometry(fmt, g)
            wbytes = N * (K // elems) * nbytes
            n_sets = _n_sets(wbytes, l2)
            W = [random_packed(fmt, N, K, g, seed=s, device="cuda") for s in range(n_sets)]
            ref_w = reference_dequantize(W[0], fmt, N, K, g)
            for M in MS:
                ref = X[0][:M].double() @ ref_w.t()
                row = {"N": N, "K": K, "M": M, "fmt": fmt, "weight_MB": wbytes / 1e6, "cublas_us": cublas[M] * 1e3}
                for name, kernel in (("cuda", "cuda"), ("triton", "gemv" if M == 1 else "fused")):
                    def call(j, kernel=kernel):
                        return gemm_triton(X[j][:M], W[j], fmt, N, K, g, kernel=kernel)
                    os.environ["UQR_POISON"] = "1"
                    err = _errors(call(0), ref)
                    os.environ.pop("UQR_POISON")
                    ms = _time_calls([lambda j=j: call(j) for j in range(n_sets)], REPS)
                    row[f"{name}_us"] = ms * 1e3
                    row[f"{name}_TBps"] = wbytes / (ms * 1e-3) / 1e12
                    row[f"{name}_err"] = err["max_rel_err"]
                rows.append(row)
                print(f"{N}x{K} M={M} {fmt:10s} cuda {row['cuda_us']:6.1f} us ({row['cuda_TBps']:.2f} TB/s, "
                      f"err {row['cuda_err']:.1e})  triton {row['triton_us']:6.1f} us  cublas {row['cublas_us']:6.1f} us",
                      flush=True)
            del W, ref_w
            torch.cuda.empty_cache()
    with open(os.path.join(out_dir, "cuda_gemv.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    with open(os.path.join(out_dir, "cuda_gemv_table.md"), "w") as f:
        f.write("| N x K | M | fmt | MB | CUDA C++ us | TB/s | Triton us | cuBLAS bf16 us | CUDA err |\n"
                "|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['N']}x{r['K']} | {r['M']} | {r['fmt']} | {r['weight_MB']:.1f} | {r['cuda_us']:.1f} | "
                    f"{r['cuda_TBps']:.2f} | {r['triton_us']:.1f} | {r['cublas_us']:.1f} | {r['cuda_err']:.1e} |\n")
    return rows


if __name__ == "__main__":
    bench(sys.argv[1] if len(sys.argv) > 1 else ".")
