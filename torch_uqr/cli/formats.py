"""``python -m torch_uqr formats``: bits per weight, error and quantize time of every format."""
from __future__ import annotations

import argparse
import time

import torch

from ..formats import table as format_table
from ..qtensor import dequantize, quantize

__all__ = ["main", "measure"]


def _rows(formats: list[str] | None = None) -> list[tuple[str, int | None]]:
    """(format, group size) cases of the table, or of ``formats`` only."""
    return [(f, g) for f, g in format_table.format_cases() if formats is None or f in formats]


def _rel_rms(approx: torch.Tensor, exact: torch.Tensor) -> float:
    # float64 on the CPU: MPS has no float64, and the error is the table's point.
    a, e = approx.cpu().double(), exact.cpu().double()
    return float(((a - e).pow(2).mean() / e.pow(2).mean()).sqrt())


def _sync(device: str) -> None:
    """Wait for queued GPU work, so the time covers the quantizer, not only its launch."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elif device.startswith("mps"):
        torch.mps.synchronize()


def measure(size: int = 4096, seed: int = 0, device: str = "cpu", formats: list[str] | None = None) -> list[dict]:
    """One dict per format/group size: bits per weight, relative RMS error on N(0,1) and on
    Student-t(3) weights of shape ``[size, size]``, and the wall-clock and CPU seconds ``quantize``
    took on the first (CPU time, summed over threads, is the steadier number on a shared machine).
    ``formats``: only these (default: every format of the table)."""
    gen = torch.Generator().manual_seed(seed)
    gauss = torch.randn(size, size, generator=gen).to(device)
    # Student-t(3) drawn from the seeded generator: a normal over the root of a chi-square(3)/3.
    chi2 = torch.randn(3, size, size, generator=gen).pow(2).sum(0)
    heavy = (torch.randn(size, size, generator=gen) / (chi2 / 3).sqrt()).to(device)
    results = []
    for fmt, g in _rows(formats):
        _sync(device)
        start, cpu_start = time.perf_counter(), time.process_time()
        qt = quantize(gauss, fmt, group_size=g)
        _sync(device)
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
        results.append({
            "format": fmt if g is None else f"{fmt} g={g}",
            "bits_per_weight": qt.bits_per_weight,
            "rel_rms_gaussian": _rel_rms(dequantize(qt), gauss),
            "rel_rms_student_t3": _rel_rms(dequantize(quantize(heavy, fmt, group_size=g)), heavy),
            "quantize_seconds": seconds,
            "quantize_cpu_seconds": cpu_seconds,
        })
    return results


def render(results: list[dict], size: int) -> str:
    """A Markdown table of :func:`measure`'s results."""
    lines = [f"| format | bits/weight | rel. RMS error, N(0,1) | rel. RMS error, Student-t (nu=3) "
             f"| quantize {size}x{size}: wall | CPU |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['format']} | {r['bits_per_weight']:.2f} | {r['rel_rms_gaussian']:.4f} "
                     f"| {r['rel_rms_student_t3']:.4f} | {r['quantize_seconds']:.2f} s "
                     f"| {r['quantize_cpu_seconds']:.2f} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the table; ``--size 512`` for a quick run."""
    parser = argparse.ArgumentParser(prog="python -m torch_uqr formats", description=__doc__)
    parser.add_argument("--size", type=int, default=4096, help="weights are size x size (default 4096)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="where to quantize (cpu, cuda, mps)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--formats", default=None,
                        help=f"comma-separated formats (default: all of {', '.join(format_table.NAMES)})")
    args = parser.parse_args(argv)
    formats = None
    if args.formats:
        formats = [f.strip() for f in args.formats.split(",") if f.strip()]
        unknown = [f for f in formats if f not in format_table.NAMES]
        if unknown:
            parser.error(f"--formats: unknown format {unknown[0]!r}; expected one of {format_table.quoted_names(format_table.NAMES)}")
    if args.size < 256 or args.size % 256:
        parser.error("--size must be a positive multiple of 256 (the largest block)")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} CPU threads, device {args.device}")
    print(render(measure(args.size, args.seed, args.device, formats), args.size))
    return 0
