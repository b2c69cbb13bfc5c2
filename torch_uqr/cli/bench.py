"""``python -m torch_uqr bench``: the router benchmark (formats x M x shapes) on CPU or MPS.

For every (shape, format, path, M) it reports the median time of ``uqr.gemm``, its GFLOP/s, the
max error relative to a float64 CPU reference (``max|y - ref| / max|ref|``), and, measured in the
same run, "dequantize + torch.matmul" (the reference decoder then a dense matmul) and the dense
matmul alone (weights already in x's dtype). Between repetitions the packed weights rotate through
enough copies to exceed the last-level cache, so every call reads its weights from memory, as the
seed's benchmark flushes its cache. ``--hot`` instead reuses ONE copy (weights, dense baseline
too), as llama.cpp's ``test-backend-ops perf`` does: weights that fit in the LLC are then read
from it, which is the like-for-like comparison with the llama.cpp column. That column is measured
in the same run when ``--llama-cpp-bin`` names a ``test-backend-ops`` binary (``llama_peer.py``);
``--threads`` sets torch's thread count (and the peer's). The "read floor ms"
column is the median time to read the packed bytes once (``torch.sum`` of the copy viewed as
int64, same rotation and thread count as the timed calls): how close a row is to memory speed
(or LLC speed with ``--hot``). On CPU, formats with path "int8" (in the format table) get a
second row at M <= ``INT8_MAX_M`` beside "auto": its error column is a few 1e-3 by design (x is rounded
to int8 per 32 elements, q4_k / var_affine / exl3 per 256, mlx4 per group), not a kernel defect. ``--device cuda`` hands over to ``torch_uqr.cli.bench_cuda``, ``--tp N`` to ``torch_uqr.cli.tp`` (tensor parallel, under torchrun), ``--model FILE.gguf`` to ``torch_uqr.cli.bench_model`` (a whole model's prefill and decode tok/s against transformers and llama.cpp). On ``--device mps``
a second table times, in the same run, the peers a Mac user would otherwise reach for: torch's own
fp16 matmul on dense weights and, when ``mlx`` is importable, MLX's ``mx.quantized_matmul`` (4-bit,
the row's group size for an MLX-family format, else 64) at the same shape and M.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import torch

from .. import ops
from ..formats import table as fmt_table
from ..qtensor import QTensor, dequantize

DEFAULT_FORMATS = fmt_table.NAMES
MLX4_DEFAULT_GROUP = 64
INT8_MAX_M = 8  # path "int8" is a small-M (decode) kernel; larger M is benched through "auto" only


@dataclass
class Row:
    """One measured configuration (the --json records)."""

    fmt: str
    group_size: int
    path: str
    N: int
    K: int
    M: int
    dtype: str
    device: str
    ms: float
    gflops: float
    max_rel_err: float
    deq_matmul_ms: Optional[float]
    dense_matmul_ms: Optional[float]
    speedup_vs_deq_matmul: Optional[float]
    llama_cpp_ms: Optional[float]          # --llama-cpp-bin: ggml's MUL_MAT, same shape, same run
    weight_copies: int
    hot: bool = False                      # --hot: one weight copy reused, not rotated
    read_floor_ms: Optional[float] = None  # median time to read the packed bytes once
    torch_f16_ms: Optional[float] = None   # mps: torch fp16 matmul on dense weights
    mlx_ms: Optional[float] = None         # mps: mlx.core.quantized_matmul, 4-bit
    mlx_group_size: Optional[int] = None
    cpu_ms: Optional[float] = None         # median CPU time of this process per call (all threads)
    dense_cpu_ms: Optional[float] = None   # the same for the dense matmul


def llc_bytes() -> int:
    """Size of the largest CPU cache (the LLC), from sysfs; 32 MiB if unknown."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    entries = os.listdir(base) if os.path.isdir(base) else []
    for entry in entries:
        try:
            with open(os.path.join(base, entry, "size")) as f:
                text = f.read().strip()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * mult)
        except (OSError, ValueError):
            continue
    return best or 32 << 20


def _sync(device: torch.device) -> None:
    if device.type == "mps":
        torch.mps.synchronize()
    elif device.type == "cuda":
        torch.cuda.synchronize()


def median_ms(fn: Callable[[int], object], reps: int, device: torch.device, warmup: int = 1) -> float:
    """Median wall time of fn(i) over ``reps`` calls (i = repetition index, for rotating inputs)."""
    return median_wall_cpu_ms(fn, reps, device, warmup)[0]


def median_wall_cpu_ms(fn: Callable[[int], object], reps: int, device: torch.device,
                       warmup: int = 1) -> tuple[float, float]:
    """Medians of the wall time and of this process's CPU time (all its threads) per call of fn(i).
    On a machine shared with other jobs the CPU time is the steadier figure at one thread: it does
    not count the time spent waiting for a core."""
    for i in range(warmup):
        fn(i)
    _sync(device)
    walls, cpus = [], []
    for i in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn(warmup + i)
        _sync(device)
        walls.append((time.perf_counter() - t0) * 1e3)
        cpus.append((time.process_time() - c0) * 1e3)
    return statistics.median(walls), statistics.median(cpus)


def _widest_view(t: torch.Tensor) -> torch.Tensor:
    """The packed bytes as the widest integer elements that tile them (int64 where possible)."""
    flat = t.reshape(-1)
    for dt, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if flat.numel() % size == 0 and flat.data_ptr() % size == 0:
            return flat.view(dt)
    return flat


def read_floor_ms(copies: list[torch.Tensor], reps: int, device: torch.device) -> float:
    """Median time to read one copy of the packed weights once (a sum over it), rotating through
    ``copies`` as the timed calls do: the memory (or, with one copy, cache) read floor of a call."""
    views = [_widest_view(c) for c in copies]
    return median_ms(lambda i: views[i % len(views)].sum(), reps, device)


_MLX_MS: dict[tuple[int, int, int, int, int], Optional[float]] = {}


def mlx_qmm_ms(W: torch.Tensor, x: torch.Tensor, group_size: int, reps: int) -> Optional[float]:
    """Median ms of MLX's 4-bit ``quantized_matmul`` of x (fp16) by W quantized with MLX's own
    quantizer; None when mlx is not importable. Timed per (N, K, M, group size, reps), once: it does
    not depend on our format."""
    key = (*W.shape, x.shape[0], group_size, reps)
    if key in _MLX_MS:
        return _MLX_MS[key]
    try:
        import mlx.core as mx
    except ImportError:
        _MLX_MS[key] = None
        return None
    w = mx.array(W.float().numpy()).astype(mx.float16)
    wq, scales, biases = mx.quantize(w, group_size=group_size, bits=4)
    xm = mx.array(x.float().numpy()).astype(mx.float16)
    mx.eval(wq, scales, biases, xm)

    def run(_i: int) -> None:  # mx.eval returns when the GPU is done
        mx.eval(mx.quantized_matmul(xm, wq, scales, biases, transpose=True, group_size=group_size, bits=4))

    _MLX_MS[key] = median_ms(run, reps, torch.device("cpu"))
    return _MLX_MS[key]


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for item in text.split(","):
        n, _, k = item.lower().partition("x")
        if not n.isdigit() or not k.isdigit():
            raise SystemExit(f"--shapes: expected NxK items like 4096x4096, got {item!r}")
        shapes.append((int(n), int(k)))
    return shapes


def parse_formats(text: str) -> list[tuple[str, int]]:
    """``q4_0,mlx4:32`` -> [(fmt, group_size)] (group size only for a grouped format, default its table default)."""
    out = []
    for item in text.split(","):
        fmt, _, g = item.partition(":")
        if fmt not in ops.FORMATS:
            raise SystemExit(f"--formats: unknown format {fmt!r}; expected some of {', '.join(ops.FORMATS)}")
        out.append((fmt, int(g) if g else fmt_table.BY_NAME[fmt].default_group_size))
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torch_uqr bench", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"],
                   help="auto: cuda if present, else mps, else cpu")
    p.add_argument("--formats", default=",".join(DEFAULT_FORMATS),
                   help="comma list; FMT:G picks an MLX-family format's group size (default mlx4 = mlx4:64)")
    p.add_argument("--M", default="1,16,128,512", help="comma list of activation rows")
    p.add_argument("--shapes", default="4096x4096", help="comma list of NxK weight shapes")
    p.add_argument("--reps", type=int, default=0, help="repetitions per timing (default: by M)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--quick", action="store_true", help="1024x1024, M=1,16,128, 3 reps: a smoke run")
    p.add_argument("--no-baseline", action="store_true", help="skip dequantize+matmul and dense matmul")
    p.add_argument("--hot", action="store_true",
                   help="reuse ONE weight copy instead of rotating copies past the LLC (as llama.cpp's "
                        "test-backend-ops perf does): weights that fit are read from the LLC, not DRAM")
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads(N) for the whole run (default: torch's own setting)")
    p.add_argument("--llama-cpp-bin", metavar="PATH",
                   help="llama.cpp's test-backend-ops binary: times ggml's MUL_MAT (fp32 x) at the same "
                        "formats, shapes and M in this run (GGUF formats only) for the llama.cpp column")
    p.add_argument("--ggml-mul-mat-op", type=int, default=None,
                   help="GGML_OP_MUL_MAT's number in enum ggml_op (default: read from the ggml.h of the "
                        "llama.cpp tree --llama-cpp-bin was built in)")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", metavar="GGUF",
                   help="benchmark a whole GGUF model instead: prefill/decode tok/s of the router, transformers "
                        "and llama.cpp (own options: --llama-bench, --threads 1,all, --pp, --tg, --reps; "
                        "see bench --model X --help)")
    return p


def _reps_for(M: int, requested: int) -> int:
    if requested > 0:
        return requested
    return 15 if M <= 16 else 5 if M <= 128 else 3


def _paths_for(fmt: str, M: int, device: torch.device) -> list[str]:
    if fmt == "ternary":
        return ["vec", "mma"]
    if device.type == "cpu" and fmt in fmt_table.names_with_path("int8", "cpu") and M <= INT8_MAX_M:
        return ["auto", "int8"]
    return ["auto"]


def bench_one(fmt: str, g: int, N: int, K: int, Ms: list[int], args, device: torch.device,
              dtype: torch.dtype, progress) -> list[Row]:
    gen = torch.Generator().manual_seed(args.seed)
    fmod = importlib.import_module("torch_uqr.formats").get(fmt)
    data = fmod.random_blocks(N, K, gen, g)
    # Enough copies that one pass over them exceeds the LLC: each call then reads from memory.
    # --hot: one copy, reused (llama.cpp's test-backend-ops): it stays in the LLC if it fits.
    hot = bool(getattr(args, "hot", False))
    copies = 1 if device.type != "cpu" or hot else max(2, -(-int(1.5 * llc_bytes()) // data.numel()))
    qts = [QTensor(data.clone().to(device), fmt, (N, K), g) for _ in range(copies)]
    floor_ms = read_floor_ms([q.data for q in qts], _reps_for(min(Ms), args.reps), device)
    W = dequantize(QTensor(data, fmt, (N, K), g)).to(torch.float64)
    # Dense weights already in x's dtype, so the baseline is the library matmul alone (for bf16 on
    # AVX-512 CPUs, oneDNN's AMX kernel), not a conversion of W per call.
    dense = W.to(dtype).to(device)
    dense_copies = [dense] + [dense.clone() for _ in range(0 if hot else max(0, min(3, -(-int(1.5 * llc_bytes())
                                                                  // (dense.numel() * dense.element_size())) - 1)))]
    rows = []
    for M in Ms:
        paths = _paths_for(fmt, M, device)
        x = (torch.randn(M, K, generator=gen) * 0.5).to(dtype)
        ref = x.double() @ W.T
        xd = x.to(device)
        reps = _reps_for(M, args.reps)
        deq_ms = dense_ms = dense_cpu = None
        if not args.no_baseline:
            deq_ms = median_ms(lambda i: xd @ dequantize(qts[i % copies]).to(dtype).T,
                               min(reps, 3), device)
            dense_ms, dense_cpu = median_wall_cpu_ms(lambda i: xd @ dense_copies[i % len(dense_copies)].T, reps, device)
        f16_ms = mlx_ms = mlx_g = None
        if device.type == "mps" and not args.no_baseline:
            mlx_g = g or MLX4_DEFAULT_GROUP
            if dtype == torch.float16:
                f16_ms = dense_ms
            else:
                dense16, x16 = dense.to(torch.float16), xd.to(torch.float16)
                f16_ms = median_ms(lambda i: x16 @ dense16.T, reps, device)
            mlx_ms = mlx_qmm_ms(W, x, mlx_g, reps)
        for path in paths:
            y = ops.gemm(xd, qts[0], path=path).double().cpu()
            err = ((y - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
            ms, cpu_ms = median_wall_cpu_ms(lambda i: ops.gemm(xd, qts[i % copies], path=path), reps, device)
            llama = getattr(args, "llama_ms", {}).get((fmt, N, K, M)) if path == paths[0] else None
            rows.append(Row(fmt=fmt, group_size=g, path=path, N=N, K=K, M=M, dtype=str(dtype).split(".")[-1],
                            device=str(device), ms=ms, cpu_ms=cpu_ms, gflops=2.0 * M * N * K / ms / 1e6, max_rel_err=err,
                            deq_matmul_ms=deq_ms, dense_matmul_ms=dense_ms, dense_cpu_ms=dense_cpu,
                            speedup_vs_deq_matmul=(deq_ms / ms) if deq_ms else None,
                            llama_cpp_ms=llama, weight_copies=copies, hot=hot, read_floor_ms=floor_ms,
                            torch_f16_ms=f16_ms, mlx_ms=mlx_ms, mlx_group_size=mlx_g if mlx_ms else None))
            progress.update(1)
    return rows


def format_table(rows: list[Row]) -> str:
    """Markdown table of the rows (the form used in docs/perf/cpu-*.md)."""
    def f(v, spec):
        return "-" if v is None else format(v, spec)
    head = ("| format | path | N x K | M | uqr ms | uqr cpu ms | read floor ms | GFLOP/s | max rel err | deq+matmul ms "
            "| x faster | dense matmul ms (x dtype) | dense cpu ms | llama.cpp ms |")
    lines = [head, "|" + "---|" * 14]
    for r in rows:
        name = f"{r.fmt}:{r.group_size}" if r.group_size and fmt_table.BY_NAME[r.fmt].grouped else r.fmt
        lines.append(f"| {name} | {r.path} | {r.N}x{r.K} | {r.M} | {r.ms:.3f} | {f(r.cpu_ms, '.3f')} | "
                     f"{f(r.read_floor_ms, '.3f')} | {r.gflops:.1f} | "
                     f"{r.max_rel_err:.1e} | {f(r.deq_matmul_ms, '.2f')} | {f(r.speedup_vs_deq_matmul, '.1f')} | "
                     f"{f(r.dense_matmul_ms, '.3f')} | {f(r.dense_cpu_ms, '.3f')} | {f(r.llama_cpp_ms, 'g')} |")
    return "\n".join(lines)


def format_mps_peers(rows: list[Row]) -> str:
    """Markdown table of the --device mps peers: torch fp16 matmul and MLX quantized_matmul."""
    def f(v, spec):
        return "-" if v is None else format(v, spec)
    lines = ["| format | path | N x K | M | uqr ms | torch fp16 matmul ms | mlx q4 ms (group) | uqr / mlx |",
             "|" + "---|" * 8]
    for r in rows:
        name = f"{r.fmt}:{r.group_size}" if r.group_size and fmt_table.BY_NAME[r.fmt].grouped else r.fmt
        mlx = f"{r.mlx_ms:.3f} (g{r.mlx_group_size})" if r.mlx_ms is not None else "-"
        ratio = r.ms / r.mlx_ms if r.mlx_ms else None
        lines.append(f"| {name} | {r.path} | {r.N}x{r.K} | {r.M} | {r.ms:.3f} | {f(r.torch_f16_ms, '.3f')} | "
                     f"{mlx} | {f(ratio, '.2f')} |")
    return "\n".join(lines)


def _without_device(argv: list[str]) -> list[str]:
    """``argv`` less its ``--device X`` / ``--device=X`` (which the CUDA benchmark does not take)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--device":
            skip = True
        elif not a.startswith("--device="):
            out.append(a)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    """Run the benchmark; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--tp" or a.startswith("--tp=") for a in argv):  # the tensor-parallel bench (torchrun)
        from . import tp
        return tp.bench_main(argv)
    if any(a == "--model" or a.startswith("--model=") for a in argv):  # the whole-model bench
        from . import bench_model
        return int(bench_model.main(argv) or 0)
    # The device is read first: the CUDA benchmark has options of its own (bench_cuda.main).
    args, _ = build_parser().parse_known_args(argv)
    device_name = args.device
    if device_name == "auto":
        device_name = ("cuda" if torch.cuda.is_available()
                       else "mps" if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()
                       else "cpu")
    if device_name == "cuda":
        if args.hot:
            raise SystemExit("--hot is a mode of the CPU/MPS bench; the CUDA bench (torch_uqr.cli.bench_cuda) "
                             "has its own timing and does not take it")
        from . import bench_cuda
        return int(bench_cuda.main(_without_device(argv)) or 0)
    args = build_parser().parse_args(argv)
    if args.quick:
        args.shapes, args.M = "1024x1024", "1,16,128"
        args.reps = args.reps or 3
    if device_name == "mps" and not (torch.backends.mps.is_built() and torch.backends.mps.is_available()):
        raise SystemExit("--device mps: torch.backends.mps.is_available() is False here (needs an Apple "
                         "Silicon Mac and a torch built with MPS)")
    device = torch.device(device_name)
    dtype = getattr(torch, args.dtype)
    shapes = parse_shapes(args.shapes)
    fmts = parse_formats(args.formats)
    Ms = [int(m) for m in args.M.split(",")]
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    args.llama_ms = {}
    if args.llama_cpp_bin:
        if device.type != "cpu" or dtype != torch.float32:
            raise SystemExit("--llama-cpp-bin: the llama.cpp peer is timed for --device cpu --dtype float32 only")
        from . import llama_peer
        cases = [(f, N, K, M) for N, K in shapes for f, _ in fmts for M in Ms]
        try:
            args.llama_ms = llama_peer.mul_mat_ms(args.llama_cpp_bin, cases, torch.get_num_threads(),
                                                  op_id=args.ggml_mul_mat_op)
        except (OSError, RuntimeError, ValueError) as e:
            raise SystemExit(str(e))
    from tqdm import tqdm
    total = sum(len(_paths_for(f, M, device)) for f, _ in fmts for M in Ms) * len(shapes)
    rows: list[Row] = []
    with tqdm(total=total, desc="bench", unit="cfg", file=sys.stderr) as progress:
        for N, K in shapes:
            for fmt, g in fmts:
                progress.set_postfix_str(f"{fmt} {N}x{K}")
                rows.extend(bench_one(fmt, g, N, K, Ms, args, device, dtype, progress))
    weights = ("hot: one copy reused, as llama.cpp's test-backend-ops" if args.hot
               else f"rotated through {rows[0].weight_copies if rows else 0} copies")
    print(f"device={device} threads={torch.get_num_threads()} dtype={args.dtype} "
          f"LLC={llc_bytes() >> 20} MiB (weights {weights})")
    if args.llama_cpp_bin:
        print(f"llama.cpp column: {args.llama_cpp_bin} perf (ggml MUL_MAT, fp32 x, one weight buffer reused), "
              f"GGML_TEST_THREADS={torch.get_num_threads()}")
    print(format_table(rows))
    if device.type == "mps" and not args.no_baseline:
        mlx_note = "" if any(r.mlx_ms is not None for r in rows) else " (mlx not importable: pip install mlx)"
        print(f"\nMPS peers, same run{mlx_note}:")
        print(format_mps_peers(rows))
    if any(r.path == "int8" for r in rows):
        print("path int8 rounds x to int8 (one scale per 32 elements, q4_k / var_affine / exl3 per 256, "
              "mlx4 per group): its max rel err of a few 1e-3 is expected")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "threads": torch.get_num_threads(), "hot": args.hot, "rows": [asdict(r) for r in rows]},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
