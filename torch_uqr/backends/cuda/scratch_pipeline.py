"""The scratch path split over N and pipelined across two CUDA streams.

The plain scratch path decodes all of W into one dense [N, K] matrix and then runs one cuBLAS
product, so the decode (memory-bound, ~40 us for 14336 x 4096 on the H200) and the product
(compute-bound at large M) run one after the other. Here W is decoded in ``chunks`` slices of rows
on a side stream into a ring of ``ring`` buffers while the main stream multiplies the previous
slice, so only the first slice's decode is exposed; with a small ring the buffers can also stay in
the L2 between being written and read. Events order each slice (decoded before its product; a
buffer's product done before the slice after next overwrites it), so the whole thing can be
captured in a CUDA graph like any other call.
"""
from __future__ import annotations

import torch

_SIDE: dict[int, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SIDE:
        _SIDE[idx] = torch.cuda.Stream(device=idx)
    return _SIDE[idx]


def chunk_rows(N: int, chunks: int, align: int = 128) -> int:
    """Rows per slice: N / chunks rounded up to ``align`` (cuBLAS tiles; at least ``align``)."""
    per = -(-N // max(1, chunks))
    return min(N, -(-per // align) * align)


def slice_bounds(N: int, chunks: int, first: float = 0.0, align: int = 128) -> list[int]:
    """Row boundaries [0, ..., N] of the slices: ``chunks`` equal ones (chunk_rows), or with ``first``
    in (0, 1) a first slice of that fraction of N (rounded to ``align``) and the rest in chunks - 1."""
    if first <= 0 or chunks < 2:
        rows = chunk_rows(N, chunks, align)
        return list(range(0, N, rows)) + [N]
    head = min(N, max(align, round(N * first / align) * align))
    rest = N - head
    if rest <= 0:
        return [0, N]
    rows = chunk_rows(rest, chunks - 1, align)
    return [0] + [head + r for r in range(0, rest, rows)] + [N]


def scratch_pipelined(x2d: torch.Tensor, w: torch.Tensor, fmt: str, N: int, K: int, group_size: int,
                      y2d: torch.Tensor, decode, chunks: int, ring: int = 2, first: float = 0.0) -> torch.Tensor:
    """y2d[:, :] = x2d @ W^T with W decoded slice by slice by ``decode(w_rows, fmt, n, K, g, out=)``.

    ``x2d`` is [M, K] and ``y2d`` [M, N] with unit column stride (any row stride); ``w`` is the packed
    [N, row_bytes] weight. ``chunks`` = 1 is the plain scratch path on the current stream; ``first``
    (a fraction of N) makes the first slice, the only one whose decode nothing hides, smaller.
    """
    if x2d.dim() != 2 or y2d.dim() != 2 or y2d.stride(1) != 1:
        raise ValueError("scratch_pipelined: expected x [M, K] and y [M, N] with unit column stride")
    bounds = slice_bounds(N, chunks, first)
    n_chunks = len(bounds) - 1
    rows = max(b - a for a, b in zip(bounds, bounds[1:]))
    main = torch.cuda.current_stream(x2d.device)
    if n_chunks == 1:
        wd = decode(w, fmt, N, K, group_size, out=torch.empty((N, K), dtype=x2d.dtype, device=x2d.device))
        torch.mm(x2d, wd.t(), out=y2d)
        return y2d
    side = _side_stream(x2d.device)
    ring = max(1, min(ring, n_chunks))
    bufs = [torch.empty((rows, K), dtype=x2d.dtype, device=x2d.device) for _ in range(ring)]
    decoded = [torch.cuda.Event() for _ in range(n_chunks)]
    consumed = [torch.cuda.Event() for _ in range(n_chunks)]
    side.wait_stream(main)  # w (and anything before this call) is ready
    for i in range(n_chunks):
        n0, n1 = bounds[i], bounds[i + 1]
        buf = bufs[i % ring][: n1 - n0]
        with torch.cuda.stream(side):
            if i >= ring:
                side.wait_event(consumed[i - ring])
            decode(w[n0:n1], fmt, n1 - n0, K, group_size, out=buf)
            decoded[i].record(side)
        main.wait_event(decoded[i])
        torch.mm(x2d, buf.t(), out=y2d[:, n0:n1])
        consumed[i].record(main)
    main.wait_stream(side)  # the ring buffers are freed on main after this point
    return y2d
