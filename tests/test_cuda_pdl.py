"""Programmatic dependent launch (csrc/cuda/cuda_common.cuh): on Hopper the CUDA C++ kernels start
while the stream's previous kernel still runs, ask the L2 for their weights, and wait for that
kernel before they touch x, y or scratch memory. A missing wait shows up as a call reading its x
before the call that writes it has finished.

So: chains of calls with no synchronisation in between, each multiplying the output the previous
call has just written (square weights), checked against float64 products of the actual
intermediate outputs; and weights written by an elementwise kernel immediately before the call.
Every kernel: the exact small-M kernel (1 and 16 rows), path int8 (pre-pass + main kernel), the
wgmma kernel with and without its split-K reduction, each with the dependent launch on (the
default on sm_90) and off (tuning override pdl=False). Outputs are NaN-poisoned
(torch_uqr.ops.poison_outputs), so an output read before it is written poisons the next link. Fresh random weights every run.
Needs a CUDA device and the extension's kernels (skipped otherwise, as in CI).
"""
from __future__ import annotations

import pytest
import torch

from cuda_test_helpers import check_half, fresh_seed, poisoned, require_qmma_kernel
from gemm_helpers import int8_reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

K = 2048  # square weights: y of one call is x of the next; 8 stages, split over the warps


@pytest.fixture(autouse=True)
def _needs_kernel():
    require_qmma_kernel()
    with poisoned():
        yield


@pytest.fixture(params=[True, False], ids=["pdl", "no_pdl"])
def pdl(request):
    """Each chain with the dependent launch as planned (on for sm_90) and turned off."""
    from torch_uqr.backends.cuda import tuning
    with tuning.override(pdl=None if request.param else False):
        yield request.param


def _op(name: str):
    from torch_uqr.backends.cuda import dispatch
    return {"_qmma_cuda": dispatch.run_qmma, "_int8_cuda": dispatch.run_int8, "_wgmma_cuda": dispatch.run_wgmma}[name]


def _weights(fmt: str, g: int, n: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    from packed_reference import random_packed, reference_dequantize
    ws = [random_packed(fmt, K, K, g, seed=fresh_seed(), device="cuda") for _ in range(n)]
    return ws, [reference_dequantize(w, fmt, K, K, g) for w in ws]


def _run_chain(call, fmt: str, rows: int, g: int = 0, links: int = 5, ref=None):
    ws, wrefs = _weights(fmt, g, links)
    # |w| ~ 0.1 (random_packed), so each link scales y by ~sqrt(K) 0.1 = 4.5: 5 links stay finite.
    x0 = torch.randn(rows, K, device="cuda", dtype=torch.bfloat16) * 0.05
    outs, x = [], x0
    for w in ws:  # back to back on one stream: each link a programmatic dependent of the last
        x = call(x, w)
        outs.append(x)
    torch.cuda.synchronize()
    prev = x0
    for i, (y, wref) in enumerate(zip(outs, wrefs)):
        expect = prev.double() @ wref.t() if ref is None else ref(prev, wref)
        assert bool(torch.isfinite(expect).all()), "the chain overflowed: rescale x0"
        check_half(y, expect, torch.bfloat16, f"{fmt} rows={rows} link {i}")
        prev = y


@pytest.mark.parametrize("fmt,g", [("q4_0", 0), ("q4_k", 0), ("mlx4", 64), ("ternary", 0)])
@pytest.mark.parametrize("rows", [1, 16])
def test_small_m_chain(fmt: str, g: int, rows: int, pdl: bool) -> None:
    from torch_uqr.backends.cuda.dispatch import launch_plan
    x = torch.zeros(rows, K, device="cuda", dtype=torch.bfloat16)
    assert launch_plan("qmma", x, fmt, K, K, g).pdl == (pdl and torch.cuda.get_device_capability()[0] >= 9)
    _run_chain(lambda x, w: _op("_qmma_cuda")(x, w, fmt, K, K, g, 0, False), fmt, rows, g)


@pytest.mark.parametrize("fmt", ["q4_0", "q4_k"])
@pytest.mark.parametrize("rows", [1, 16])
def test_int8_chain(fmt: str, rows: int, pdl: bool) -> None:
    _run_chain(lambda x, w: _op("_int8_cuda")(x, w, fmt, K, K, 0, 0, False), fmt, rows,
               ref=lambda x, wref: int8_reference(x.cpu(), wref.cpu(), fmt).to(x.device))


@pytest.mark.parametrize("rows", [128, 7])
def test_wgmma_chain(rows: int, pdl: bool) -> None:
    from torch_uqr.backends.cuda.dispatch import wgmma_available
    if torch.cuda.get_device_capability() != (9, 0) or not wgmma_available(torch.cuda.current_device()):
        pytest.skip("needs the sm_90 wgmma kernel")
    # N = 2048 makes 16 row tiles: both row counts split K in two, so the reduction kernel runs too.
    _run_chain(lambda x, w: _op("_wgmma_cuda")(x, w, "q4_0", K, K, 0, 0, False), "q4_0", rows)


@pytest.mark.parametrize("op", ["_qmma_cuda", "_int8_cuda"])
def test_weights_written_just_before(op: str) -> None:
    """The kernels ask the L2 for their weights before waiting for the previous kernel: a hint only,
    so weights that kernel writes are still read as written."""
    from packed_reference import random_packed, reference_dequantize
    fmt = "q4_k"
    src = random_packed(fmt, K, K, 0, seed=fresh_seed(), device="cuda")
    for _ in range(3):
        wbuf = torch.zeros_like(src)
        torch.cuda.synchronize()
        torch.bitwise_xor(src, 0, out=wbuf)  # an elementwise kernel writes w; the gemm follows at once
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        y = _op(op)(x, wbuf, fmt, K, K, 0, 0, False)
        wref = reference_dequantize(src, fmt, K, K, 0)
        expect = x.double() @ wref.t() if op == "_qmma_cuda" else int8_reference(x.cpu(), wref.cpu(), fmt).cuda()
        check_half(y, expect, torch.bfloat16, f"{op} weights written by the kernel before")
