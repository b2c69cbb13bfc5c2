"""The Triton CUDA kernels, run on the CPU by Triton's interpreter (CI has no GPU).

Each format runs in its own subprocess with TRITON_INTERPRET=1 set before Triton decorates the
kernels (the decorator reads it once), so this file never changes how other tests see Triton.
Every case draws fresh random packed blocks, poisons the output with NaN, and compares with the
float64 reference decoder in ``tests/packed_reference.py``.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from torch_uqr.formats import table

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
from torch_uqr.formats.table import NAMES, spec  # noqa: E402

FORMATS = list(NAMES)

# ||y - ref|| / ||ref||. bf16 operands: ~2^-9 rounding of every weight and of y (the interpreter
# truncates instead of rounding, so about twice that); fp16 ~2^-12; fp32 is exact fp32 here.
TOL = {"bfloat16": 1.5e-2, "float16": 2e-3, "float32": 1e-5}

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="triton is not installed (pip install triton==3.6.0)")


def _cases(fmt: str) -> list[dict]:
    """Small shapes covering small-M (split-K) and large-M configs, layouts and paths."""
    from torch_uqr.backends.cuda.configs import GemmConfig, VecConfig
    small = GemmConfig(BN=16, BM=16, NS=2, SPLIT_K=3)   # several K tiles in splits of 2, last short
    large = GemmConfig(BN=32, BM=32, NS=4, SPLIT_K=1)
    K = 192 if spec(fmt).grouped else max(160, spec(fmt).block)  # 5 blocks of 32, or one of 256
    cases = [
        dict(dtype="bfloat16", lead=(2,), M=3, N=24, K=K, cfg=small),
        dict(dtype="float16", lead=(), M=40, N=40, K=K, cfg=large, out_heads=4),             # direct-head y
        dict(dtype="float32", lead=(), M=6, N=24, K=K, cfg=small, in_heads=2, out_heads=2),  # head-strided x
        dict(dtype="float16", lead=None, M=1, N=20, K=K, cfg=small),                         # 1-D x
        dict(dtype="float32", lead=(), M=7, N=16, K=K, cfg=None, kernel="scratch", out_heads=2),
        dict(dtype="bfloat16", lead=(2,), M=2, N=24, K=K, cfg=VecConfig(BN=8, NS=2, SPLIT_K=2, reduce_each=True), kernel="gemv",
             in_heads=2, out_heads=3),
    ]
    if fmt == "ternary":
        cases += [dict(dtype="bfloat16", lead=(2,), M=3, N=24, K=K, cfg=VecConfig(BN=16, NS=2, SPLIT_K=2), path="vec"),
                  dict(dtype="float32", lead=(), M=2, N=16, K=K, cfg=VecConfig(BN=16, NS=4, SPLIT_K=1), path="vec",
                       in_heads=4, out_heads=4)]
    return cases


def run_format(fmt: str) -> None:
    """Run every case of ``fmt`` (called in the interpreter subprocess); raise on any failure."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    import torch
    from torch_uqr.backends.cuda.dequant import dequantize_triton
    from torch_uqr.backends.cuda.dispatch import gemm_cuda_route
    from packed_reference import random_packed, reference_dequantize

    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
    groups = spec(fmt).group_sizes or (0,)
    for g in groups:  # decoders vs the float64 reference (2 super-blocks per row)
        w = random_packed(fmt, 7, 512, g, seed=seed)
        got = dequantize_triton(w, fmt, 7, 512, g).double()
        ref = reference_dequantize(w, fmt, 7, 512, g)
        # The kernels decode in fp32: products such as d*s_j*q need up to 28 bits, so the only
        # allowed difference is fp32 rounding (a wrong field or bit index errs by O(max|w|)).
        err = float((got - ref).abs().max())
        assert err <= 2.0 ** -21 * float(ref.abs().max()), f"{fmt} g={g}: decode differs by {err} (seed {seed})"
    from torch_uqr.ops import poison_outputs
    poison_outputs(True)  # this subprocess only
    for i, c in enumerate(_cases(fmt)):
        g = spec(fmt).default_group_size
        N, K, M = c["N"], c["K"], c["M"]
        w = random_packed(fmt, N, K, g, seed=seed + i)
        wref = reference_dequantize(w, fmt, N, K, g)
        dtype = getattr(torch, c["dtype"])
        H_in = c.get("in_heads", 0)
        if c["lead"] is None:
            x = torch.randn(K, generator=gen).to(dtype)
            x_mk = x[None, :]
        elif H_in:
            # [..., H_in, M, D_in], read as [..., M, K] with column h*D_in + d.
            x = torch.randn(*c["lead"], H_in, M, K // H_in, generator=gen).to(dtype)
            x_mk = x.transpose(-3, -2).reshape(*c["lead"], M, K)
        else:
            x = torch.randn(*c["lead"], M, K, generator=gen).to(dtype)
            x_mk = x
        ref = x_mk.double() @ wref.t()
        H = c.get("out_heads", 0)
        y = gemm_cuda_route(x, w, fmt, N, K, g, out_heads=H, in_heads=bool(H_in), path=c.get("path", "mma"),
                        kernel=c.get("kernel", "fused"), config=c["cfg"])
        if c["lead"] is None:
            ref = ref[0]
        if H:
            ref = ref.reshape(*ref.shape[:-1], H, N // H).transpose(-3, -2)
        assert y.dtype == dtype and tuple(y.shape) == tuple(ref.shape), (i, y.dtype, y.shape, ref.shape)
        assert torch.isfinite(y).all(), f"{fmt} case {i}: unwritten (NaN) outputs"
        err = float((y.double() - ref).norm() / ref.norm())
        assert err < TOL[c["dtype"]], f"{fmt} case {i} {c}: rel err {err:.2e} (seed {seed})"
    check_invalid_bytes_and_nan(fmt, seed)


def check_invalid_bytes_and_nan(fmt: str, seed: int) -> None:
    """Bytes validation would reject (var_affine's any modes, ternary's code 3) decode as formats.h
    reads them (docs/formats.md, "Invalid bytes"), compared with the CPU operator on x = I; and a
    NaN in x makes its whole output row non-finite on every path (docs/operator.md)."""
    import torch
    import torch_uqr as uqr
    from torch_uqr.backends.cuda.dequant import dequantize_triton
    from torch_uqr.backends.cuda.dispatch import gemm_cuda_route
    from packed_reference import random_packed
    gen = torch.Generator().manual_seed(seed)
    N, K = 6, 512
    g = spec(fmt).default_group_size
    w = random_packed(fmt, N, K, g, seed=seed)
    if fmt in ("var_affine", "ternary") and uqr.ops.op_available():
        blocks = w.view(-1, 160 if fmt == "var_affine" else 12)
        if fmt == "var_affine":
            blocks[:, 20:28] = torch.randint(0, 256, (blocks.shape[0], 8), generator=gen, dtype=torch.uint8)
        else:
            blocks[:, 4:] = torch.randint(0, 256, (blocks.shape[0], 8), generator=gen, dtype=torch.uint8)
        got = dequantize_triton(w, fmt, N, K, g).double()
        ref = torch.ops.uqr.gemm(torch.eye(K), w, fmt, N, K, g, 0, False, "auto").t().double()
        err = float((got - ref).abs().max())
        assert err <= 2.0 ** -21 * float(ref.abs().max()), f"{fmt}: invalid bytes decode differs by {err} (seed {seed})"
    paths = ["mma", "vec"] if fmt == "ternary" else ["mma"]
    for path in paths:
        x = torch.randn(3, K, generator=gen)
        x[0, 5] = float("nan")
        x[2, K - 1] = float("inf")
        y = gemm_cuda_route(x, w, fmt, N, K, g, path=path)
        assert not torch.isfinite(y[0]).any() and not torch.isfinite(y[2]).any(), f"{fmt} {path}: NaN/Inf lost"
        assert torch.isfinite(y[1]).all(), f"{fmt} {path}: a clean row is non-finite"


def run_all(path: str) -> None:
    """Subprocess entry: run every format, write {fmt: "" or the failure} as JSON to ``path``."""
    import json
    import traceback
    results = {}
    for fmt in FORMATS:
        try:
            run_format(fmt)
            results[fmt] = ""
        except Exception:  # noqa: BLE001 - reported per format by the test below
            results[fmt] = traceback.format_exc()[-3000:]
    with open(path, "w") as f:
        json.dump(results, f)


@pytest.fixture(scope="module")
def interpreted_results(tmp_path_factory) -> dict:
    """One interpreter subprocess for all formats (torch + Triton start-up paid once)."""
    import json
    out = tmp_path_factory.mktemp("triton_interp") / "results.json"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = f"import sys; sys.path.insert(0, {HERE!r}); import test_triton_interpret as t; t.run_all({str(out)!r})"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@needs_triton
@pytest.mark.parametrize("fmt", FORMATS)
def test_triton_kernels_interpreted(fmt: str, interpreted_results: dict) -> None:
    assert interpreted_results[fmt] == "", interpreted_results[fmt]


@needs_triton
def test_triton_argument_errors() -> None:
    """Bad arguments raise ValueError naming the argument (checked before any launch)."""
    import torch
    from torch_uqr.backends.cuda.dispatch import gemm_cuda_route
    w = torch.zeros(8, 18 * 2, dtype=torch.uint8)
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="path"):
        gemm_cuda_route(x, w, "q4_0", 8, 64, path="vec")
    with pytest.raises(ValueError, match="w: expected uint8 \\[8, 36\\]"):
        gemm_cuda_route(x, w[:, :20], "q4_0", 8, 64)
    with pytest.raises(ValueError, match="K"):
        gemm_cuda_route(torch.randn(2, 48), w, "q4_0", 8, 48)
    with pytest.raises(ValueError, match="fmt"):
        gemm_cuda_route(x, w, "q9_9", 8, 64)
    with pytest.raises(ValueError, match="x"):
        gemm_cuda_route(x.to(torch.int32), w, "q4_0", 8, 64)
    with pytest.raises(ValueError, match="group_size"):
        gemm_cuda_route(x, torch.zeros(8, 4 + 32, dtype=torch.uint8), "mlx4", 8, 64, group_size=48)


@needs_triton
@pytest.mark.parametrize("fmt", FORMATS)
def test_reference_agrees_with_formats_package(fmt: str) -> None:
    """The kernels' float64 oracle and block geometry match torch_uqr's own quantizer/decoder."""
    import torch
    import torch_uqr as uqr
    from torch_uqr.backends.cuda.formats_meta import block_geometry
    from packed_reference import reference_dequantize
    if not callable(getattr(uqr, "quantize", None)):
        pytest.skip("torch_uqr.quantize is not available")
    w = torch.randn(6, 512)
    qt = uqr.quantize(w, fmt)
    g = qt.group_size
    assert block_geometry(fmt, g) == (qt.block_size, qt.block_bytes)
    ours = reference_dequantize(qt.data, fmt, 6, 512, g)
    theirs = uqr.dequantize(qt).double()
    assert float((ours - theirs).abs().max()) <= 2.0 ** -21 * float(ours.abs().max())
