"""Path "int8" on CUDA: the int8 tensor-core kernel (csrc/cuda/qmma_int8.cu, op uqr::_int8_cuda;
q4_0 / q4_k at 1-16 rows, mlx4, ternary, var_affine and exl3 at one row) against a float64 reference of the same activation rounding, against the CPU int8 path, in every
layout, and the dispatch around it (calls the kernel does not take run path "auto").

The reference (gemm_helpers.int8_reference: x rounded to int8 in fp32 torch arithmetic as the
kernels do it, then code * scale times the float64 decoded W) is checked against the C++ CPU int8
path by the first test, which needs no GPU and runs in CI. The rest needs a CUDA device and an
extension built with the kernel; y is NaN-poisoned (torch_uqr.ops.poison_outputs) so an unwritten
output fails.
Fresh random weights every run.
"""
from __future__ import annotations

import pytest
import torch

import torch_uqr as uqr
from cuda_test_helpers import fresh_seed
from gemm_helpers import int8_reference, randn, rows_of, weights
from packed_reference import random_packed, reference_dequantize

FORMATS = ("q4_0", "q4_k")
HALF = (torch.bfloat16, torch.float16)
# y is the fp32 sum rounded once to x's dtype: within a unit roundoff of each element (bf16 2^-8,
# fp16 2^-11), plus the fp32 accumulation error, bounded relative to max |y| (terms of K / 32
# blocks; the measured error is ~1e-6, a wrong int8 code moves y by ~1e-4).
UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 0.0}
SUM_TOL = 2e-5


def check_rounded(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """y (x's dtype) is the float64 ``ref`` up to fp32 sums and one rounding to dtype, element-wise."""
    assert y.dtype == dtype and y.shape == ref.shape, (what, y.dtype, y.shape, ref.shape)
    assert bool(torch.isfinite(y).all()), f"{what}: unwritten (NaN) outputs"
    ref = ref.to(y.device)
    bound = UNIT_ROUNDOFF[dtype] * ref.abs() + SUM_TOL * ref.abs().max()
    excess = float(((y.double() - ref).abs() - bound).max() / ref.abs().max())
    assert excess <= 0, f"{what}: {excess:.2e} of max |y| beyond the output rounding"


@pytest.fixture(autouse=True)
def _poison():
    from cuda_test_helpers import poisoned
    with poisoned():
        yield


@pytest.mark.parametrize("fmt", FORMATS)
def test_reference_matches_cpu_int8(fmt: str) -> None:
    """The Python reference of the int8 rounding equals the C++ CPU int8 path to fp32 sums (no GPU).

    x holds bf16 values (what the CUDA tests feed) passed as fp32, so y is not rounded and the
    comparison is tight enough to tell int8-rounded x from exact x (checked)."""
    N, K = 40, 512
    qt, W = weights(fmt, None, N, K)
    for batch, M in ((1, 1), (1, 7), (1, 16), (2, 8)):
        x = randn(batch, M, K, dtype=torch.bfloat16).float()
        ref = int8_reference(x, W, fmt)
        check_rounded(uqr.gemm(x, qt, path="int8"), ref, torch.float32, f"{fmt} b={batch} M={M}")
        gap = float((ref - x.double() @ W.T).abs().max() / ref.abs().max())
        assert gap > 10 * SUM_TOL, f"{fmt}: reference too close to the exact product ({gap:.1e})"


# -- CUDA --------------------------------------------------------------------------------------

@pytest.fixture
def cuda() -> None:
    """Skip without a CUDA device or without the kernel in torch_uqr._C (CPU torch, older build)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from torch_uqr import ops
    from torch_uqr.backends.cuda.dispatch import int8_available
    if not ops.op_available() or not int8_available():
        pytest.skip("torch_uqr._C was built without the CUDA int8 kernel")


def _int8(x, w, fmt, N, K, out_heads=0, in_heads=False, g=0):
    from torch_uqr.backends.cuda.dispatch import run_int8
    return run_int8(x, w, fmt, N, K, g, out_heads, in_heads)


def _weight(fmt: str, N: int, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh random packed weights on the GPU and their float64 decode on the CPU (where the
    reference's fp32 rounding runs exactly as the CPU kernels' does)."""
    w = random_packed(fmt, N, K, 0, seed=fresh_seed(), device="cuda")
    return w, reference_dequantize(w.cpu(), fmt, N, K)


@pytest.mark.parametrize("fmt", FORMATS)
def test_int8_cuda_matches_reference(cuda, fmt: str) -> None:
    """Every row count of both column tiles (1, 7, 16; batches of 2 x 8 and 3 x 5), N with a partial
    16-row CTA and N enough to fill the GPU, K of one and several stages per warp. One row takes x
    staged through the ring below 4 CTAs an SM (on the H200: N < 8448) and from global memory a
    stage ahead in registers above (8464), unless the block-column kernel takes every one-row call
    (tuning knob int8_cols, on by default; test_int8_cuda_one_row_variants runs the others)."""
    for N, K in ((256, 512), (4352, 1024), (200, 1536), (8464, 2048)):
        w, W = _weight(fmt, N, K)
        for dtype in HALF:
            for batch, M in ((1, 1), (1, 7), (1, 16), (2, 8), (3, 5)):
                x = torch.randn(batch, M, K, device="cuda").to(dtype)
                check_rounded(_int8(x, w, fmt, N, K).cpu(), int8_reference(x.cpu(), W, fmt), dtype,
                              f"{fmt} {N}x{K} b={batch} M={M} {dtype}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_int8_cuda_layouts(cuda, fmt: str) -> None:
    """Head-strided x [B, H, M, D] and direct-head y [B, H, M, N/H] give the plain layout's y bit for
    bit: the layouts change addressing only (x is rounded into a row-major scratch first)."""
    N, K, h_in, h_out = 264, 2048, 8, 4  # x heads of 256 (whole stages), y heads of 66
    w, W = _weight(fmt, N, K)
    for batch, M in ((2, 3), (1, 7), (2, 8), (1, 16)):
        x = torch.randn(batch, h_in, M, K // h_in, device="cuda", dtype=torch.bfloat16)
        xp = rows_of(x, True).contiguous()
        plain = _int8(xp, w, fmt, N, K)
        check_rounded(plain.cpu(), int8_reference(xp.cpu(), W, fmt), torch.bfloat16, f"{fmt} plain b={batch} M={M}")
        heads = plain.reshape(batch, M, h_out, N // h_out).transpose(1, 2)
        assert torch.equal(_int8(x, w, fmt, N, K, 0, True), plain), f"{fmt} in_heads b={batch} M={M}"
        assert torch.equal(_int8(xp, w, fmt, N, K, h_out, False), heads), f"{fmt} out_heads b={batch} M={M}"
        assert torch.equal(_int8(x, w, fmt, N, K, h_out, True), heads), f"{fmt} both b={batch} M={M}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_int8_cuda_matches_cpu_int8(cuda, fmt: str) -> None:
    """The kernel against the CPU int8 path, same inputs: only the fp32 summation order differs (the
    CPU side gets x as fp32, the same values, so its y is the unrounded sum). N = 200 and 4352: one
    row's x staged through the ring (few CTAs) and read from global memory."""
    for N, K in ((200, 1536), (4352, 1024)):
        w, _ = _weight(fmt, N, K)
        qt_cpu = uqr.QTensor(w.cpu(), fmt, (N, K))
        for dtype in HALF:
            for M in (1, 9, 16):
                x = torch.randn(M, K, device="cuda").to(dtype)
                y_cpu = uqr.gemm(x.cpu().float(), qt_cpu, path="int8").double()
                check_rounded(_int8(x, w, fmt, N, K).cpu(), y_cpu, dtype, f"{fmt} {N}x{K} M={M} {dtype} vs CPU")


ONE_ROW_VARIANTS = {"xring": dict(int8_cols=False, int8_xring=True), "xpipe": dict(int8_cols=False, int8_xring=False),
                    "global": dict(int8_cols=False, int8_xring=False, int8_xpipe=False),
                    "by_grid": dict(int8_cols=False)}


@pytest.mark.parametrize("knobs", list(ONE_ROW_VARIANTS), ids=list(ONE_ROW_VARIANTS))
@pytest.mark.parametrize("fmt", ["q4_0", "q4_k"])
def test_int8_cuda_one_row_variants(cuda, fmt: str, knobs: str) -> None:
    """The one-row kernels the block-column default leaves out (tuning overrides): x staged through
    the ring, from global memory a stage ahead in registers, or without, and the grid rule's choice."""
    from torch_uqr.backends.cuda import dispatch, tuning
    with tuning.override(**ONE_ROW_VARIANTS[knobs]):
        for N, K in ((256, 512), (200, 1536), (8464, 2048)):
            w, W = _weight(fmt, N, K)
            x = torch.randn(1, K, device="cuda").to(torch.bfloat16)
            plan = dispatch.launch_plan("int8", x, fmt, N, K)
            assert plan.variant != dispatch.INT8_COLS, plan
            check_rounded(_int8(x, w, fmt, N, K).cpu(), int8_reference(x.cpu(), W, fmt), torch.bfloat16,
                          f"{fmt} {N}x{K} {knobs}")


def test_int8_cuda_dispatch_and_fallback(cuda) -> None:
    """path "int8" runs the kernel up to configs.INT8_AUTO_MAX_ROWS (its bits, not auto's) and path
    "auto" past it (batch counted), for fp32 x and for x heads narrower than a stage."""
    from torch_uqr.backends.cuda import configs
    N, K = 256, 512
    for fmt in FORMATS:
        w, _ = _weight(fmt, N, K)
        qt = uqr.QTensor(w, fmt, (N, K))
        top = configs.INT8_AUTO_MAX_ROWS[fmt]
        x = torch.randn(1, top, K, device="cuda", dtype=torch.bfloat16)
        y = uqr.gemm(x, qt, path="int8")
        assert torch.equal(y, _int8(x, w, fmt, N, K)) and not torch.equal(y, uqr.gemm(x, qt)), fmt
        x = torch.randn(2, top, K, device="cuda", dtype=torch.bfloat16)
        assert torch.equal(uqr.gemm(x, qt, path="int8"), uqr.gemm(x, qt)), f"{fmt}: 2 x {top} rows"
    w, _ = _weight("q4_k", N, K)
    qt = uqr.QTensor(w, "q4_k", (N, K))
    for shape in ((17, K), (33, K), (2, 9, K)):
        xs = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
        assert torch.equal(uqr.gemm(xs, qt, path="int8"), uqr.gemm(xs, qt)), f"rows of {shape}"
    xf = torch.randn(4, K, device="cuda")
    assert torch.equal(uqr.gemm(xf, qt, path="int8"), uqr.gemm(xf, qt)), "fp32 x"
    xh = torch.randn(4, 3, K // 4, device="cuda", dtype=torch.bfloat16)  # heads of 128 < a 256 stage
    assert torch.equal(uqr.gemm(xh, qt, in_heads=True, path="int8"), uqr.gemm(xh, qt, in_heads=True)), "x heads"


def test_int8_cuda_errors(cuda) -> None:
    from torch_uqr.backends.cuda.dispatch import gemm_cuda_route
    N, K = 64, 512
    w, _ = _weight("q4_0", N, K)
    wm = random_packed("mlx4", N, K, 64, seed=1, device="cuda")
    w8 = random_packed("q8_0", N, K, 0, seed=1, device="cuda")
    x = torch.randn(3, K, device="cuda", dtype=torch.bfloat16)
    # q8_0 has path int8 on the CPU only; q5_k on no backend.
    with pytest.raises(ValueError, match="path='int8' for fmt 'q8_0' exists only on the cpu backend .*not on 'cuda'"):
        uqr.gemm(x, uqr.QTensor(w8, "q8_0", (N, K)), path="int8")
    w5 = random_packed("q5_k", N, K, 0, seed=1, device="cuda")
    with pytest.raises(ValueError, match="path='int8' .*supports fmt 'q4_0', 'q4_1', .*'exl3'.*not 'q5_k'"):
        uqr.gemm(x, uqr.QTensor(w5, "q5_k", (N, K)), path="int8")
    with pytest.raises(ValueError, match="kernel: 'int8' takes.*got fmt 'mlx4'.*3 rows"):
        gemm_cuda_route(x, wm, "mlx4", N, K, 64, kernel="int8")  # mlx4: one row only
    wm128 = random_packed("mlx4", N, K, 128, seed=1, device="cuda")
    with pytest.raises(ValueError, match="kernel: 'int8' takes.*got fmt 'mlx4'"):
        gemm_cuda_route(x[:1], wm128, "mlx4", N, K, 128, kernel="int8")  # g = 128: no block-column form
    with pytest.raises(RuntimeError, match="unsupported call"):
        # variant 0 (tiles), 1 warp, smem cap, no PDL: the op refuses the call before the plan
        torch.ops.uqr._int8_cuda(x, wm, "mlx4", N, K, 64, 0, False, 0, 1, True, False)
    x17 = torch.randn(17, K, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="kernel: 'int8' takes.*17 rows"):
        gemm_cuda_route(x17, w, "q4_0", N, K, kernel="int8")
    with pytest.raises(RuntimeError, match="unsupported call"):
        _int8(x17, w, "q4_0", N, K)  # the op checks for itself too


@pytest.mark.parametrize("fmt", FORMATS)
def test_int8_cuda_zero_spans(cuda, fmt: str) -> None:
    """An all-zero row (d = 0 everywhere) gives exactly 0; zero blocks and a tiny block beside large
    ones keep the others exact."""
    N, K = 256, 1024
    w, W = _weight(fmt, N, K)
    x = torch.randn(3, K, device="cuda") * 4
    x[0, 32:64] = 0       # one q4_0 block of zeros
    x[0, 512:768] = 0     # one q4_k super-block of zeros
    x[1] = 0
    x[2, :32] = 1e-3
    for dtype in HALF:
        xd = x.to(dtype)
        y = _int8(xd, w, fmt, N, K)
        check_rounded(y.cpu(), int8_reference(xd.cpu(), W, fmt), dtype, f"{fmt} zero spans {dtype}")
        assert bool((y[1] == 0).all()), f"{fmt} {dtype}: zero row"


# -- mlx4 (g = 32, 64), ternary, var_affine and exl3: one activation row, in block columns -------

ONE_ROW = [("mlx4", 32), ("mlx4", 64), ("ternary", 0), ("var_affine", 0), ("exl3", 0)]


@pytest.mark.parametrize("fmt,g", ONE_ROW, ids=[f"{f}-g{g}" if g else f for f, g in ONE_ROW])
def test_int8_cuda_one_row_formats(cuda, fmt: str, g: int) -> None:
    """One row against the float64 product of the same int8 x (one scale per int8_x_span), N with a
    partial 16-row CTA, few and many CTAs, K of one and several stages per warp, both x dtypes; the
    head layouts give the plain layout's bits; the CPU int8 path agrees to fp32 sums."""
    for N, K in ((256, 512), (4352, 1024), (200, 1536), (8464, 2048)):
        w = random_packed(fmt, N, K, g, seed=fresh_seed(), device="cuda")
        W = reference_dequantize(w.cpu(), fmt, N, K, g)
        for dtype in HALF:
            for batch in ((), (1,)):
                x = torch.randn(*batch, 1, K, device="cuda").to(dtype)
                y = _int8(x, w, fmt, N, K, g=g)
                check_rounded(y.cpu(), int8_reference(x.cpu(), W, fmt, group_size=g), dtype,
                              f"{fmt} g={g} {N}x{K} {dtype} batch {batch}")
    N, K, h_in, h_out = 264, 2048, 8, 4
    w = random_packed(fmt, N, K, g, seed=fresh_seed(), device="cuda")
    x = torch.randn(1, h_in, 1, K // h_in, device="cuda", dtype=torch.bfloat16)
    xp = rows_of(x, True).contiguous()
    plain = _int8(xp, w, fmt, N, K, g=g)
    heads = plain.reshape(1, 1, h_out, N // h_out).transpose(1, 2)
    assert torch.equal(_int8(x, w, fmt, N, K, 0, True, g=g), plain), "in_heads"
    assert torch.equal(_int8(x, w, fmt, N, K, h_out, True, g=g), heads), "both"
    qt_cpu = uqr.QTensor(w.cpu(), fmt, (N, K), g)
    y_cpu = uqr.gemm(xp.cpu().float(), qt_cpu, path="int8").double()
    check_rounded(plain.cpu(), y_cpu, torch.bfloat16, f"{fmt} g={g} vs CPU int8")


@pytest.mark.parametrize("fmt,g", ONE_ROW + [("mlx4", 128)], ids=lambda v: str(v))
def test_int8_cuda_one_row_dispatch(cuda, fmt: str, g: int) -> None:
    """path "int8" runs the kernel at one row (its bits, not auto's) and path "auto" otherwise: two
    rows, mlx4 with g = 128."""
    N, K = 256, 512
    w = random_packed(fmt, N, K, g, seed=fresh_seed(), device="cuda")
    qt = uqr.QTensor(w, fmt, (N, K), g)
    x1 = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    y1 = uqr.gemm(x1, qt, path="int8")
    if g == 128:
        assert torch.equal(y1, uqr.gemm(x1, qt)), "g = 128 runs auto"
    else:
        assert torch.equal(y1, _int8(x1, w, fmt, N, K, g=g))
        assert not torch.equal(y1, uqr.gemm(x1, qt)), f"{fmt} g = {g}: int8, not auto"
    x2 = torch.randn(2, K, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(uqr.gemm(x2, qt, path="int8"), uqr.gemm(x2, qt)), f"{fmt} g = {g}: two rows run auto"
