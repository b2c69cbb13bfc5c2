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


def test_compiled_model_generates_in_one_graph_and_revalidates(tmp_path, monkeypatch):
    """A whole GGUF model under torch.compile(fullgraph=True): one graph per input shape, not one
    per layer (a QuantLinear has no Python state for dynamo to guard on), the same logits as eager,
    and a weight corrupted after compilation is still refused before a kernel reads it."""
    from torch._dynamo.utils import counters
    from tiny_gguf_models import VOCAB, write_tiny_gguf

    monkeypatch.setenv("UQR_CACHE", str(tmp_path / "cache"))
    path = str(tmp_path / "qwen2.gguf")
    write_tiny_gguf("qwen2", path)  # q4_0 / q8_0 / q4_1 / q4_k layers, head tied to the embedding
    model = uqr.from_pretrained(path)
    ids = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(0))
    kw = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True)
    eager = model.generate(ids, **kw)

    torch._dynamo.reset()
    counters.clear()
    model.forward = torch.compile(model.forward, fullgraph=True, backend="aot_eager")
    got = model.generate(ids, **kw)
    assert torch.equal(got.sequences, eager.sequences)
    for a, b in zip(got.logits, eager.logits):
        assert ((a - b).abs().max() / b.abs().max()).item() < 1e-4
    # prefill, the first decode step, then one graph with a dynamic length for every later step
    assert counters["stats"]["unique_graphs"] <= 3, dict(counters["stats"])
    assert not counters["graph_break"]

    lin = model.model.layers[1].mlp.down_proj
    with torch.no_grad():  # the first block's fp16 scale (first two bytes in every GGUF format) -> +inf
        lin.weight[0, :2] = torch.tensor([0x00, 0x7C], dtype=torch.uint8)
    with pytest.raises(ValueError, match="finite|inf"):
        model(ids)
