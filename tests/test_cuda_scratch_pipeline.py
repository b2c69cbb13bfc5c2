"""The scratch path split over N and pipelined over two streams (triton_kernels/scratch_pipeline.py).

GPU tests (skipped without a CUDA device): every slice count, ring size and format gives the float64
product of the reference-decoded weights on NaN-poisoned outputs, including a last slice shorter
than the others, a y with a row stride wider than N, and a replay of the call captured in a CUDA
graph with new inputs. The slice arithmetic has a CPU test.
"""
from __future__ import annotations

import pytest
import torch

from torch_uqr.backends.cuda.scratch_pipeline import chunk_rows, slice_bounds

from cuda_test_helpers import check_close, fresh_seed, poisoned_outputs  # noqa: F401 (fixture)


@pytest.mark.parametrize("N,chunks,align,want", [(14336, 1, 128, 14336), (14336, 4, 128, 3584),
                                                  (14336, 3, 128, 4864), (1000, 3, 128, 384),
                                                  (1000, 64, 128, 128), (100, 2, 128, 100),
                                                  (4096, 0, 128, 4096), (4096, 8, 64, 512)])
def test_chunk_rows(N: int, chunks: int, align: int, want: int) -> None:
    rows = chunk_rows(N, chunks, align)
    assert rows == want
    assert rows % align == 0 or rows == N  # every slice but the last is a whole number of tiles


@pytest.mark.parametrize("N,chunks,first,want", [(14336, 2, 0.0, [0, 7168, 14336]),
                                                  (14336, 2, 0.25, [0, 3584, 14336]),
                                                  (14336, 3, 0.2, [0, 2816, 8576, 14336]),
                                                  (1000, 3, 0.3, [0, 256, 640, 1000]),
                                                  (1000, 2, 0.01, [0, 128, 1000]),
                                                  (100, 2, 0.5, [0, 100]), (4096, 1, 0.3, [0, 4096])])
def test_slice_bounds(N: int, chunks: int, first: float, want: list[int]) -> None:
    """Slices cover [0, N) in order, every one but the last a whole number of 128-row tiles."""
    b = slice_bounds(N, chunks, first)
    assert b == want
    assert all(0 < hi - lo and (lo % 128 == 0) for lo, hi in zip(b, b[1:]))


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
FORMATS = [("q4_0", 0), ("q4_k", 0), ("mlx4", 64), ("var_affine", 0), ("exl3", 0), ("ternary", 0)]


def _decoder():
    from torch_uqr.backends.cuda.dispatch import scratch_decoder
    return scratch_decoder()


@needs_cuda
@pytest.mark.parametrize("fmt,g", FORMATS, ids=[f for f, _ in FORMATS])
def test_pipelined_matches_reference(fmt: str, g: int) -> None:
    from torch_uqr.backends.cuda.scratch_pipeline import scratch_pipelined
    from packed_reference import random_packed, reference_dequantize
    N, K = 1000, 2304  # 1000 = 3 x 384 - 152: the last slice is short
    w = random_packed(fmt, N, K, g, seed=fresh_seed(), device="cuda")
    wref = reference_dequantize(w, fmt, N, K, g)
    for M in (1, 7, 33, 129):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        ref = x.double() @ wref.t()
        for chunks, ring, first in ((1, 1, 0), (2, 1, 0), (3, 2, 0), (8, 3, 0), (64, 2, 0), (2, 2, 0.3), (3, 2, 0.2)):
            wide = torch.full((M, N + 24), float("nan"), device="cuda", dtype=torch.bfloat16)
            y = scratch_pipelined(x, w, fmt, N, K, g, wide[:, 8:8 + N], _decoder(), chunks, ring, first)
            torch.cuda.synchronize()
            check_close(y.float(), ref, 8e-3, f"{fmt} M={M} {chunks}x{ring} first {first}", worst_factor=4)
            assert torch.isnan(wide[:, :8]).all() and torch.isnan(wide[:, 8 + N:]).all(), "wrote outside y"


@needs_cuda
def test_pipelined_in_cuda_graph() -> None:
    from torch_uqr.backends.cuda.scratch_pipeline import scratch_pipelined
    from packed_reference import random_packed, reference_dequantize
    N, K, M = 1536, 1024, 65
    w = random_packed("q4_k", N, K, 0, seed=fresh_seed(), device="cuda")
    wref = reference_dequantize(w, "q4_k", N, K, 0)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    scratch_pipelined(x, w, "q4_k", N, K, 0, y, _decoder(), 4, 2)  # warm-up outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        scratch_pipelined(x, w, "q4_k", N, K, 0, y, _decoder(), 4, 2)
    for _ in range(2):
        x.copy_(torch.randn(M, K, device="cuda", dtype=torch.bfloat16))
        y.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        check_close(y.float(), x.double() @ wref.t(), 8e-3, "graph replay", worst_factor=4)


@needs_cuda
def test_pipelined_rejects_bad_layouts() -> None:
    from torch_uqr.backends.cuda.scratch_pipeline import scratch_pipelined
    x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.zeros(8, 36, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="unit column stride"):
        scratch_pipelined(x, w, "q4_0", 8, 64, 0, torch.empty(8, 4, device="cuda").t(), _decoder(), 2)


def test_pipeline_table_lookup(monkeypatch) -> None:
    from torch_uqr.backends.cuda import configs
    monkeypatch.setattr(configs, "SCRATCH_PIPELINE", ((512, 8192, 4, 2, 0.0), (2048, 8192, 8, 3, 0.3),
                                                      (4096, 0, 1, 1, 0.0)))
    assert configs.scratch_pipeline_for(511, 14336) is None
    assert configs.scratch_pipeline_for(512, 14336) == (4, 2, 0.0)
    assert configs.scratch_pipeline_for(512, 4096) is None  # N below the entry's minimum
    assert configs.scratch_pipeline_for(2048, 14336) == (8, 3, 0.3)
    assert configs.scratch_pipeline_for(4096, 14336) is None  # a later entry with 1 slice turns it off
    monkeypatch.setattr(configs, "SCRATCH_PIPELINE", ())
    assert configs.scratch_pipeline_for(4096, 14336) is None


@needs_cuda
def test_gemm_uses_pipeline_end_to_end(monkeypatch, poisoned_outputs) -> None:
    """gemm_cuda_route's scratch kernel with a pipeline entry in force, plain and batched x."""
    from torch_uqr.backends.cuda import configs, dispatch
    from packed_reference import random_packed, reference_dequantize
    monkeypatch.setattr(configs, "SCRATCH_PIPELINE", ((1, 1, 3, 2, 0.25),))
    calls = []
    real = dispatch.scratch_pipelined
    monkeypatch.setattr(dispatch, "scratch_pipelined", lambda *a: calls.append(a[-3:]) or real(*a))
    N, K = 777, 1024
    w = random_packed("q4_1", N, K, 0, seed=fresh_seed(), device="cuda")
    wref = reference_dequantize(w, "q4_1", N, K, 0)
    for shape in ((33, K), (2, 40, K)):
        x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
        y = dispatch.gemm_cuda_route(x, w, "q4_1", N, K, 0, kernel="scratch")
        check_close(y.float(), x.double() @ wref.t(), 8e-3, f"pipelined gemm {shape}", worst_factor=4)
    assert calls == [(3, 2, 0.25), (3, 2, 0.25)]
