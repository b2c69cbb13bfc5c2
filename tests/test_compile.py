"""torch.compile(fullgraph=True) traces the op through its fake kernel and matches eager."""
from __future__ import annotations

import pytest
import torch

import torch_uqr as uqr
from gemm_helpers import randn, weights


class HeadProjection(torch.nn.Module):
    """A q/k-style projection: packed weight, direct-head output, then a pointwise op."""

    def __init__(self, qt: uqr.QTensor, heads: int):
        super().__init__()
        self.qt, self.heads = qt, heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = uqr.gemm(x, self.qt, out_heads=self.heads)
        return torch.nn.functional.silu(y) * 2.0


def test_opcheck_fake_kernel_and_schema():
    qt = weights("q4_k", None, 32, 256)[0]
    for x, heads, in_heads in [(randn(3, 5, 256), 4, False), (randn(2, 4, 3, 64, dtype=torch.bfloat16), 0, True),
                               (randn(256, dtype=torch.float16), 0, False)]:
        torch.library.opcheck(torch.ops.uqr.gemm.default,
                              (x, qt.data, "q4_k", 32, 256, 0, heads, in_heads, "auto"),
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_matches_eager(backend):
    torch._dynamo.reset()
    qt = weights("ternary", None, 48, 256)[0]
    model = HeadProjection(qt, heads=6)
    x = randn(2, 7, 256)
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    torch.testing.assert_close(compiled(x), eager, rtol=1e-6, atol=1e-6)
    if backend == "aot_eager":  # symbolic shapes through the fake kernel; skipped for inductor (CI time)
        dyn = torch.compile(model, fullgraph=True, backend=backend, dynamic=True)
        for shape in [(2, 7, 256), (3, 9, 256), (1, 1, 256)]:
            x2 = randn(*shape)
            torch.testing.assert_close(dyn(x2), model(x2), rtol=1e-6, atol=1e-6)
