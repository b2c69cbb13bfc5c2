"""``python -m torch_uqr bench --device cuda``: time every format's CUDA kernels against cuBLAS and
PyTorch's int4 kernel on the same inputs, check every output against float64, write JSON and a plot.

Method: each measured call is captured with its
input set rotating among enough sets that their weights overflow the L2 three times over, into one
CUDA graph; the graph is replayed ``reps`` times, each replay timed with CUDA events; the figure is
the median replay time divided by the calls in it. Graphs remove Python launch overhead, which is
not the kernels' cost (``ms_eager`` records it for the auto path separately).

q4_0, q4_k, mlx4, ternary, var_affine and exl3 also get a row of kernel "int8" (path "int8", the
int8-activation kernel) wherever it takes the call (q4_0 / q4_k M <= 16, the others M = 1): shown in
the table as "/ int8 <us>"
after the format's best exact kernel, never counted as that best. Its error column is a few 1e-3 by design (x rounded to int8), not a
defect (INT8_NOTE).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from typing import Callable

import torch

from ..formats import table as format_table

FORMATS = format_table.NAMES
SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336))
MS = (1, 16, 128, 512, 2048, 4096)
MLX4_GROUP = 64  # MLX's default group size
SCRATCH_MIN_M = 128  # below this the decode pass alone outweighs any matmul saving
VEC_MAX_M = 128      # the vec path re-reads W per row; larger M takes seconds
GEMV_MAX_M = 16      # likewise the one-row CUDA-core kernel
PAIRED_MIN_M = 512   # from here (compute-bound) the ratio to cuBLAS is also timed interleaved
WGMMA_MIN_M, WGMMA_BENCH_MAX_M = 17, 512  # the Hopper kernel (sm_90): timed where auto may take it and one step past
EXACT_KERNELS = ("fused", "scratch", "gemv", "qmma", "wgmma")
INT8_NOTE = ("int8: path 'int8' (q4_0 / q4_k M <= 16, mlx4 / ternary / var_affine / exl3 M = 1) rounds x to int8 "
             "(one scale per 32 elements, q4_k / var_affine / exl3 per 256, mlx4 per group): its max rel err of a "
             "few 1e-3 is expected")


def _graph(calls: list[Callable[[], object]]) -> Callable[[], None]:
    """Warm ``calls`` up, capture them in one CUDA graph and return its replay."""
    for c in calls:
        c()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    torch.cuda.synchronize()
    return g.replay


def _timed_ms(run: Callable[[], object]) -> float:
    """Milliseconds of one ``run()``, between CUDA events on the current stream."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    run()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e)


def _time_calls(calls: list[Callable[[], object]], reps: int, graph: bool = True) -> float:
    """Median milliseconds per call of ``calls`` run back to back (graph-replayed by default)."""
    if graph:
        run = _graph(calls)
    else:
        def run():
            for c in calls:
                c()
        run()
        torch.cuda.synchronize()
    return statistics.median(_timed_ms(run) / len(calls) for _ in range(reps))


def _time_paired(calls_a: list[Callable[[], object]], calls_b: list[Callable[[], object]],
                 reps: int) -> tuple[float, float]:
    """Median milliseconds per call of a and of b, their graph replays interleaved (a b b a ...).

    At large M the H200's clock under its power limit drifts by 10-15 % over a run (cuBLAS
    alone 623 then 708 us a minute later), so a ratio of two timings taken apart measures
    the drift; replays side by side see the same conditions."""
    run_a, run_b = _graph(calls_a), _graph(calls_b)
    ta, tb = [], []
    for i in range(reps):
        for run, out, n in ((run_a, ta, len(calls_a)), (run_b, tb, len(calls_b)))[:: 1 if i % 2 == 0 else -1]:
            out.append(_timed_ms(run) / n)
    return statistics.median(ta), statistics.median(tb)


def copy_bandwidth_GBps(reps: int, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth (bytes read + bytes written per second) of a buffer far
    larger than the L2: the bound a memory-bound M = 1 kernel is measured against."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = _time_calls([lambda: b.copy_(a)], reps)
    del a, b
    torch.cuda.empty_cache()
    return 2 * nbytes / (ms * 1e-3) / 1e9


def _n_sets(bytes_per_set: int, l2: int) -> int:
    return max(4, min(64, math.ceil(3 * l2 / max(1, bytes_per_set))))


def _errors(y: torch.Tensor, ref: torch.Tensor) -> dict:
    y = y.double()
    finite = bool(torch.isfinite(y).all())
    return {"finite": finite,
            "max_rel_err": float((y - ref).abs().max() / ref.abs().max()) if finite else float("inf"),
            "fro_rel_err": float((y - ref).norm() / ref.norm()) if finite else float("inf")}


def _row(N: int, K: int, M: int, name: str, kernel: str, ms: float, weight_bytes: int) -> dict:
    return {"N": N, "K": K, "M": M, "fmt": name, "kernel": kernel, "ms": ms,
            "tflops": 2.0 * M * N * K / (ms * 1e-3) / 1e12,
            "weight_GBps": weight_bytes / (ms * 1e-3) / 1e9}


def _checked_timed_row(call: Callable[[int], torch.Tensor], n_sets: int, ref: torch.Tensor, reps: int, N: int,
                       K: int, M: int, fmt: str, kernel: str, wbytes: int) -> dict:
    """Check ``call(0)`` against ``ref`` (output NaN-poisoned, so an unwritten element shows), time
    ``call(j)`` over the ``n_sets`` rotating weight sets, print and return the row."""
    from ..ops import poison_outputs
    poison_outputs(True)
    try:
        err = _errors(call(0), ref)
    finally:
        poison_outputs(False)
    ms = _time_calls([lambda j=j: call(j) for j in range(n_sets)], reps)
    r = _row(N, K, M, fmt, kernel, ms, wbytes)
    r.update(err)
    print(f"  {fmt:10s} M={M:5d} {kernel:8s} {ms*1e3:9.1f} us {r['tflops']:7.1f} TFLOP/s "
          f"{r['weight_GBps']:7.0f} GB/s err {r['max_rel_err']:.1e}", flush=True)
    return r


def _random_packed(fmt: str, N: int, K: int, group_size: int, seed: int, device: str) -> torch.Tensor:
    """Random valid blocks of ``fmt`` (the format module's generator), on ``device``."""
    from ..formats import get
    gen = torch.Generator().manual_seed(seed)
    return get(fmt).random_blocks(N, K, gen, group_size).to(device)


def _rotating_copies(w: torch.Tensor, n: int) -> list[torch.Tensor]:
    """``n`` copies of ``w`` at different addresses: what defeats the L2 is where the bytes are,
    not what they hold (random blocks are generated once, on the CPU)."""
    return [w] + [w.clone() for _ in range(n - 1)]


def _reference(w: torch.Tensor, fmt: str, N: int, K: int, group_size: int) -> torch.Tensor:
    """The format module's exact decode, in float64 on w's device (every output is checked)."""
    from ..formats import get
    return get(fmt).decode(w.cpu(), N, K, group_size).double().to(w.device)


def bench_shape(N: int, K: int, Ms, formats, reps: int, l2: int, rows: list) -> None:
    """Time and check every format and peer on one weight shape, appending rows."""
    from ..backends.cuda import configs
    from ..backends.cuda.configs import QMMA_MID_MAX_ROWS as QMMA_BENCH_MAX_M
    from ..backends.cuda.dispatch import gemm_cuda_route, int8_available, int8_fits, qmma_available, qmma_fits, wgmma_fits
    from ..backends.cuda.formats_meta import block_geometry

    dev = "cuda"
    x_max = max(Ms)
    dense_sets = _n_sets(N * K * 2, l2)
    Wd = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(dense_sets)]
    X = [torch.randn(x_max, K, device=dev, dtype=torch.bfloat16) for _ in range(dense_sets)]
    # tinygemm int4 (group 32): random nibbles and scales/zeros, as the anchors measured it.
    tg_sets = _n_sets(N * K // 2, l2)
    TG = []
    for _ in range(tg_sets):
        q = torch.randint(0, 16, (N, K), device=dev, dtype=torch.int32)
        qq = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
        TG.append((torch.ops.aten._convert_weight_to_int4pack(qq, 8),
                   torch.randn(K // 32, N, 2, device=dev, dtype=torch.bfloat16) * 0.01))
    for M in Ms:
        xs = [X[j % len(X)][:M] for j in range(max(dense_sets, tg_sets))]
        ms = _time_calls([lambda j=j: xs[j] @ Wd[j].t() for j in range(dense_sets)], reps)
        rows.append(_row(N, K, M, "bf16", "cublas", ms, N * K * 2))
        try:
            ms = _time_calls([lambda j=j: torch.ops.aten._weight_int4pack_mm(xs[j], TG[j][0], 32, TG[j][1])
                              for j in range(tg_sets)], reps)
            rows.append(_row(N, K, M, "int4_g32", "tinygemm", ms, N * K // 2 + (K // 32) * N * 4))
        except Exception as exc:  # noqa: BLE001 - a missing peer must not stop the benchmark
            rows.append({"N": N, "K": K, "M": M, "fmt": "int4_g32", "kernel": "tinygemm", "error": repr(exc)[:200]})
        print(f"  M={M}: cublas {rows[-2]['ms']*1e3:.1f} us", flush=True)
    del TG
    torch.cuda.empty_cache()

    for fmt in formats:
        g = MLX4_GROUP if format_table.spec(fmt).grouped else 0
        elems, nbytes = block_geometry(fmt, g)
        wbytes = N * (K // elems) * nbytes
        n_sets = _n_sets(wbytes, l2)
        W = _rotating_copies(_random_packed(fmt, N, K, g, seed=0, device=dev), n_sets)
        w_ref = _reference(W[0], fmt, N, K, g)
        for M in Ms:
            xs = [X[j % len(X)][:M] for j in range(n_sets)]
            ref = xs[0].double() @ w_ref.t()
            kernels = (["fused"] + (["scratch"] if M >= SCRATCH_MIN_M else [])
                       + (["gemv"] if M <= GEMV_MAX_M else [])
                       + (["qmma"] if qmma_available() and M <= QMMA_BENCH_MAX_M
                          and qmma_fits(xs[0], W[0], fmt, K, g, False, M) else [])
                       + (["wgmma"] if WGMMA_MIN_M <= M <= WGMMA_BENCH_MAX_M
                          and wgmma_fits(xs[0], W[0], fmt, K, g, False, M) else []))
            paths = ["mma"] + (["vec"] if fmt == "ternary" and M <= VEC_MAX_M else [])
            for path in paths:
                for kernel in (kernels if path == "mma" else ["fused"]):
                    def call(j, path=path, kernel=kernel):
                        return gemm_cuda_route(xs[j], W[j], fmt, N, K, g, path=path, kernel=kernel)
                    rows.append(_checked_timed_row(call, n_sets, ref, reps, N, K, M, fmt,
                                                   kernel if path == "mma" else "vec", wbytes))
            # Path auto as a user gets it, graph-replayed: the row the published plot draws.
            rows.append(_checked_timed_row(lambda j: gemm_cuda_route(xs[j], W[j], fmt, N, K, g), n_sets, ref, reps,
                                           N, K, M, fmt, "auto", wbytes))
            if int8_available() and int8_fits(xs[0], W[0], fmt, K, g, False, M):
                # Forced kernel: a row labelled int8 never measures auto's fallback.
                def call_int8(j):
                    return gemm_cuda_route(xs[j], W[j], fmt, N, K, g, path="int8", kernel="int8")
                rows.append(_checked_timed_row(call_int8, n_sets, ref, reps, N, K, M, fmt, "int8", wbytes))
            if M >= PAIRED_MIN_M:
                # The auto path against cuBLAS, replays interleaved (_time_paired): the ratio row.
                ms_c, ms_f = _time_paired([lambda j=j: X[j % len(X)][:M] @ Wd[j].t()
                                           for j in range(dense_sets)],
                                          [lambda j=j: gemm_cuda_route(xs[j], W[j], fmt, N, K, g) for j in range(n_sets)],
                                          reps)
                r = _row(N, K, M, fmt, "auto_paired", ms_f, wbytes)
                r.update({"cublas_ms": ms_c, "ratio_vs_cublas": ms_c / ms_f})
                rows.append(r)
                print(f"  {fmt:10s} M={M:5d} paired   {ms_f*1e3:9.1f} us vs cuBLAS {ms_c*1e3:.1f} us: "
                      f"{ms_c / ms_f:.3f}x cuBLAS throughput", flush=True)
            # The auto path as a user gets it, eager (Python launch overhead included), one call.
            ms = _time_calls([lambda j=j: gemm_cuda_route(xs[j], W[j], fmt, N, K, g) for j in range(n_sets)],
                             max(5, reps // 3), graph=False)
            rows.append(dict(_row(N, K, M, fmt, "auto_eager", ms, wbytes)))
        del W, w_ref
        torch.cuda.empty_cache()
    del Wd
    torch.cuda.empty_cache()
    _ = configs  # the tables the run used are recorded by main()


def sweep(reps: int, l2: int) -> list:
    """Time candidate tensor-core configurations per M bucket on q4_0 / q4_k 14336x4096."""
    from ..backends.cuda.configs import GemmConfig, VecConfig
    from ..backends.cuda.dispatch import gemm_cuda_route
    N, K = 14336, 4096
    row_cands = [VecConfig(32, 4, 4), VecConfig(32, 4, 4, 4, True), VecConfig(16, 8, 4, 4, True),
                 VecConfig(64, 4, 4, 4, True), VecConfig(32, 8, 4, 4, True), VecConfig(16, 4, 8, 4, True),
                 VecConfig(32, 4, 8, 4, True), VecConfig(64, 4, 8, 8, True), VecConfig(8, 8, 8, 2, True)]
    cands = {1: []}
    out = []
    for fmt in ("q4_0", "q4_k"):
        W = _rotating_copies(_random_packed(fmt, N, K, 0, seed=0, device="cuda"), 6)
        w_ref = _reference(W[0], fmt, N, K, 0)
        for M, cs in cands.items():
            X = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in range(6)]
            for c in cs + (row_cands if M == 1 else []):  # noqa: B023 (lambdas run inside the loop)
                kern = "gemv" if isinstance(c, VecConfig) else "fused"
                try:
                    ms = _time_calls([lambda j=j: gemm_cuda_route(X[j], W[j], fmt, N, K, kernel=kern, config=c)
                                      for j in range(6)], reps)
                except Exception as exc:  # noqa: BLE001 - a config that fails to compile is a data point
                    ms = float("nan")
                    print("   ", c, repr(exc)[:160])
                # A fast wrong configuration is not a result (one was, once): check every output.
                err = (_errors(gemm_cuda_route(X[0], W[0], fmt, N, K, kernel=kern, config=c), X[0].double() @ w_ref.t())
                       if ms == ms else {"max_rel_err": float("nan")})
                out.append({"fmt": fmt, "M": M, "kernel": kern, "config": c.__dict__, "ms": ms, **err})
                print(f"  sweep {fmt} M={M:5d} {c} {ms*1e3:9.1f} us err {err['max_rel_err']:.1e}", flush=True)
        from ..backends.cuda.dequant import dequantize_triton
        for tile in ((8, 16, 4),):
            ms = _time_calls([lambda j=j: dequantize_triton(W[j], fmt, N, K, 0, torch.bfloat16, tile=tile)
                              for j in range(6)], reps)
            out.append({"fmt": fmt, "kernel": "dequant", "tile": tile, "ms": ms})
            print(f"  sweep {fmt} dequant {tile} {ms*1e3:9.1f} us ({(N * K * 2 + W[0].numel()) / ms / 1e9:.2f} TB/s)", flush=True)
        del W
    return out


def plot(rows: list, path: str, device: str = "CUDA") -> None:
    """Throughput relative to cuBLAS bf16 against M on path auto (the default), one line per
    format, one panel per weight shape: the question a user asks of the table."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    shapes = sorted({(r["N"], r["K"]) for r in rows})
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 5), squeeze=False)
    for ax, (N, K) in zip(axes[0], shapes):
        cublas = {r["M"]: r["ms"] for r in rows if (r["N"], r["K"]) == (N, K) and r["kernel"] == "cublas" and "ms" in r}
        for i, fmt in enumerate(FORMATS):
            pts = sorted((r["M"], cublas[r["M"]] / r["ms"]) for r in rows
                         if (r["N"], r["K"], r["fmt"]) == (N, K, fmt) and r["kernel"] == "auto" and "ms" in r
                         and r["M"] in cublas)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=fmt, linewidth=1,
                        color=plt.cm.tab20(i % 20), linestyle="-" if i < 10 else "--")
        ax.axhline(1.0, color="k", linewidth=2, label="cuBLAS bf16")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("M (activation rows)")
        ax.set_ylabel("cuBLAS bf16 time / torch-uqr time (higher is faster)")
        ax.set_title(f"N={N} K={K} ({device}, bf16 x, path auto)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(rows: list, copy_GBps: float | None = None) -> str:
    """Markdown table: per (shape, M), each format's best mma kernel next to the peers."""
    lines = ["| N x K | M | cuBLAS bf16 us | tinygemm g32 us | " + " | ".join(FORMATS) + " |",
             "|---|---|---|---|" + "---|" * len(FORMATS)]
    keys = sorted({(r["N"], r["K"], r["M"]) for r in rows})
    for N, K, M in keys:
        sel = [r for r in rows if (r["N"], r["K"], r["M"]) == (N, K, M) and "ms" in r]
        def best(fmt, kernels=EXACT_KERNELS):
            c = [r for r in sel if r["fmt"] == fmt and r["kernel"] in kernels]
            if not c:
                return "-"
            b = min(c, key=lambda r: r["ms"])
            return f"{b['ms']*1e3:.1f} ({b['kernel'][0]})"
        cells = [best(f) for f in FORMATS]
        # Other paths ride along in the format's cell (ternary's vec; int8, not exact, never its best).
        for r in sel:
            if r["kernel"] in ("vec", "int8") and r["fmt"] in FORMATS:
                cells[FORMATS.index(r["fmt"])] += f" / {r['kernel']} {r['ms']*1e3:.1f}"
        lines.append(f"| {N}x{K} | {M} | {best('bf16', ('cublas',))} | {best('int4_g32', ('tinygemm',))} | "
                     + " | ".join(cells) + " |")
    paired = [r for r in rows if r.get("kernel") == "auto_paired"]
    if paired:
        lines += ["", "Throughput vs cuBLAS bf16, path auto and cuBLAS replayed interleaved (cuBLAS time / ours):", "",
                  "| N x K | M | " + " | ".join(FORMATS) + " |", "|---|---|" + "---|" * len(FORMATS)]
        for N, K, M in sorted({(r["N"], r["K"], r["M"]) for r in paired}):
            cells = []
            for f in FORMATS:
                c = [r for r in paired if (r["N"], r["K"], r["M"], r["fmt"]) == (N, K, M, f)]
                cells.append(f"{c[0]['ratio_vs_cublas']:.2f}" if c else "-")
            lines.append(f"| {N}x{K} | {M} | " + " | ".join(cells) + " |")
    one = [r for r in rows if r.get("M") == 1 and "ms" in r and r["kernel"] in EXACT_KERNELS]
    if copy_GBps and one:
        lines += ["", f"M = 1 against the weight-bytes bound (weight bytes / measured copy bandwidth "
                      f"{copy_GBps:.0f} GB/s): best exact kernel time / bound (1.00 = at the bound):", "",
                  "| N x K | " + " | ".join(FORMATS) + " |", "|---|" + "---|" * len(FORMATS)]
        for N, K in sorted({(r["N"], r["K"]) for r in one}):
            cells = []
            for f in FORMATS:
                c = [r for r in one if (r["N"], r["K"], r["fmt"]) == (N, K, f)]
                if c:
                    b = min(c, key=lambda r: r["ms"])
                    bound_ms = b["ms"] * b["weight_GBps"] / copy_GBps
                    cells.append(f"{b['ms'] / bound_ms:.2f}")
                else:
                    cells.append("-")
            lines.append(f"| {N}x{K} | " + " | ".join(cells) + " |")
    if any(r.get("kernel") == "int8" for r in rows):
        lines += ["", INT8_NOTE]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns a process exit status (1 if any output was wrong)."""
    ap = argparse.ArgumentParser(prog="torch_uqr bench --device cuda", description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write all rows to this JSON file")
    ap.add_argument("--plot", help="write a PNG of time vs M per format")
    ap.add_argument("--quick", action="store_true", help="one shape, M in {1, 16, 512, 4096}")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--sweep", action="store_true", help="also sweep kernel configurations")
    ap.add_argument("--sweep-only", action="store_true", help="only the configuration sweep")
    ap.add_argument("--table", help="write the markdown table to this file")
    ap.add_argument("--M", help="comma list of activation rows (default: the issue's list)")
    ap.add_argument("--shapes", help="comma list of NxK (default: the issue's three shapes)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench --device cuda: no CUDA device visible", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 60 << 20)
    print(f"# {props.name} sms={props.multi_processor_count} L2={l2 >> 20}MiB torch={torch.__version__}", flush=True)
    formats = [f for f in args.formats.split(",") if f]
    shapes = SHAPES[1:2] if args.quick else SHAPES
    Ms = (1, 16, 512, 4096) if args.quick else MS
    if args.M:
        Ms = tuple(int(m) for m in args.M.split(","))
    if args.shapes:
        shapes = tuple(tuple(int(v) for v in s.split("x")) for s in args.shapes.split(","))
    result = {"device": props.name, "torch": torch.__version__, "rows": []}
    if shapes and not args.sweep_only:
        result["copy_GBps"] = copy_bandwidth_GBps(args.reps)
        print(f"# device-to-device copy: {result['copy_GBps']:.0f} GB/s", flush=True)
    if args.sweep or args.sweep_only:
        result["sweep"] = sweep(args.reps, l2)
    if args.sweep_only:
        shapes = ()
    for N, K in shapes:
        print(f"# N={N} K={K}", flush=True)
        bench_shape(N, K, Ms, formats, args.reps, l2, result["rows"])
        if args.json:  # keep partial results if a later shape dies
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    md = table(result["rows"], result.get("copy_GBps"))
    print(md)
    if args.table:
        with open(args.table, "w") as f:
            f.write(md + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.plot and result["rows"]:
        plot(result["rows"], args.plot, props.name)
    bad = [r for r in result["rows"] if r.get("finite") is False or r.get("max_rel_err", 0) > 2e-2]
    for r in bad:
        print("BAD OUTPUT:", r)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
