"""The CUDA C++ decode-to-dense kernel (csrc/cuda/dequant.cu, op uqr::_dequant_cuda) on a real GPU.

Skipped without a CUDA device or when torch_uqr._C was built without it (CPU torch; CI compiles the
.cu with nvcc in test_cuda_build.py). Every output buffer is NaN-filled first, so an unwritten
element fails; the decode must equal, bit for bit, the float32 reference decoders of
torch_uqr/formats/ cast to the output dtype, and the Triton decoders. N is odd, K covers partial
and several 2048-element tiles, the bytes are fresh random every run.
"""
from __future__ import annotations

import pytest
import torch

from torch_uqr.formats.table import family
from cuda_test_helpers import check_close, fresh_seed, poisoned_outputs  # noqa: F401 (fixture)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

FORMATS = [("q4_0", 0), ("q4_1", 0), ("q8_0", 0), ("q4_k", 0), ("var_affine", 0), ("exl3", 0), ("ternary", 0)]
FORMATS += [(f.name, g) for f in family("mlx") for g in f.group_sizes]  # every width of the MLX family
IDS = [f"{f}{g or ''}" for f, g in FORMATS]
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


@pytest.fixture(autouse=True)
def _needs_kernel():
    ops = pytest.importorskip("torch_uqr.ops")
    from torch_uqr.backends.cuda.dispatch import cuda_dequant_available
    if not ops.op_available() or not cuda_dequant_available():
        pytest.skip("torch_uqr._C was built without the CUDA kernels")


def _poisoned(N: int, K: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.full((N, K), float("nan"), dtype=dtype, device="cuda")


def _assert_same_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape)
    diff = got.view(BITS[got.dtype]) != want.view(BITS[want.dtype])
    if diff.any():
        n, k = (int(i) for i in diff.nonzero()[0])
        pytest.fail(f"{what}: {int(diff.sum())} elements differ, first [{n}, {k}]: {got[n, k]} vs {want[n, k]}")


def _reference(w: torch.Tensor, fmt: str, N: int, K: int, g: int) -> torch.Tensor:
    from torch_uqr.formats import get as format_module
    return format_module(fmt).decode(w.cpu(), N, K, g).cuda()  # float32, computed on the CPU


@pytest.mark.parametrize("fmt,g", FORMATS, ids=IDS)
def test_dequant_bit_exact(fmt: str, g: int) -> None:
    from torch_uqr.backends.cuda.dequant import dequantize_cuda, dequantize_triton
    from packed_reference import random_packed
    # K = 256: one partial tile; 2304: a full 2048-element tile and a partial one.
    for N, K in ((1, 2304), (7, 256), (33, 2304), (129, 512)):
        w = random_packed(fmt, N, K, g, seed=fresh_seed(), device="cuda")
        ref = _reference(w, fmt, N, K, g)
        for dtype in DTYPES:
            what = f"{fmt} g={g} {N}x{K} {dtype}"
            got = dequantize_cuda(w, fmt, N, K, g, out=_poisoned(N, K, dtype))
            _assert_same_bits(got, ref.to(dtype), what + " vs reference")
            triton = dequantize_triton(w, fmt, N, K, g, dtype=dtype)
            if fmt == "exl3":  # Triton fuses d * mix + bias into one FMA (one rounding fewer)
                ulp = torch.finfo(dtype).eps * ref.abs() + torch.finfo(dtype).tiny
                assert ((got.float() - triton.float()).abs() <= ulp).all(), f"{what}: vs Triton beyond 1 ulp"
            else:
                _assert_same_bits(got, triton, what + " vs Triton")


@pytest.mark.parametrize("fmt,g", [("q4_0", 0), ("q4_k", 0), ("mlx4", 64), ("ternary", 0)],
                         ids=["q4_0", "q4_k", "mlx4_64", "ternary"])
@pytest.mark.parametrize("offset,pad", [(2, 6), (1, 3), (16, 0)])
def test_dequant_strided_and_unaligned_rows(fmt: str, g: int, offset: int, pad: int) -> None:
    """Rows sliced out of a wider buffer: base `offset` bytes off a 16-byte boundary (odd too, which
    the Triton path refuses), row stride row_bytes + pad; the bytes around the rows are untouched."""
    from torch_uqr.backends.cuda.dequant import dequantize_cuda
    from packed_reference import random_packed
    N, K = 37, 2304 + 256
    w = random_packed(fmt, N, K, g, seed=fresh_seed(), device="cuda")
    row_bytes = w.shape[1]
    buf = torch.full((N, offset + row_bytes + pad), 0xA5, dtype=torch.uint8, device="cuda")
    view = buf[:, offset:offset + row_bytes]
    view.copy_(w)
    assert view.stride() == (row_bytes + offset + pad, 1)
    got = dequantize_cuda(view, fmt, N, K, g, out=_poisoned(N, K, torch.bfloat16))
    _assert_same_bits(got, _reference(w, fmt, N, K, g).to(torch.bfloat16), f"{fmt} offset {offset} pad {pad}")


# (what is wrong, the op's arguments given a valid q4_0 w [8, 288] (K = 512) and bf16 out, message).
ERROR_CASES = [
    ("w_on_cpu", lambda w, o: (w.cpu(), "q4_0", 8, 512, 0, o), "w: expected a CUDA tensor"),
    ("w_int8", lambda w, o: (w.view(torch.int8), "q4_0", 8, 512, 0, o), "w: expected uint8"),
    ("w_short_rows", lambda w, o: (w[:, :-18], "q4_0", 8, 512, 0, o), "w: expected uint8"),
    ("K_not_blocks", lambda w, o: (w, "q4_0", 8, 528, 0, o), "K: expected a positive multiple"),
    ("N_zero", lambda w, o: (w, "q4_0", 0, 512, 0, o), "N: expected"),
    ("unknown_fmt", lambda w, o: (w, "q9_9", 8, 512, 0, o), "unknown format"),
    ("group_on_fixed_block", lambda w, o: (w, "q4_0", 8, 512, 64, o), "group_size"),
    ("mlx4_group_48", lambda w, o: (w, "mlx4", 8, 512, 48, o), "group_size: mlx4"),
    ("w_byte_stride_2", lambda w, o: (torch.empty(8, 576, dtype=torch.uint8, device="cuda")[:, ::2], "q4_0", 8, 512,
                                      0, o), "unit stride"),
    ("out_int32", lambda w, o: (w, "q4_0", 8, 512, 0, o.to(torch.int32)), "out: expected bfloat16"),
    ("out_narrow", lambda w, o: (w, "q4_0", 8, 512, 0, o[:, :256]), "out: expected a contiguous"),
    ("out_transposed", lambda w, o: (w, "q4_0", 8, 512, 0, o.t().contiguous().t()), "out: expected a contiguous"),
    ("out_on_cpu", lambda w, o: (w, "q4_0", 8, 512, 0, o.cpu()), "out: expected on w's device"),
    ("out_misaligned", lambda w, o: (w, "q4_0", 8, 512, 0,
                                     torch.empty(8 * 512 + 1, dtype=torch.bfloat16, device="cuda")[1:].view(8, 512)),
     "16-byte aligned"),
]


# One test per case, so that a case which crashes the process rather than raising is named.
@pytest.mark.parametrize("make,msg", [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_dequant_errors(make, msg: str) -> None:
    from packed_reference import random_packed
    w = random_packed("q4_0", 8, 512, 0, seed=1, device="cuda")
    out = torch.empty(8, 512, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match=msg):  # bad arguments raise ValueError, as the API's do
        torch.ops.uqr._dequant_cuda(*make(w, out))


@pytest.mark.parametrize("fmt,g", FORMATS, ids=IDS)
def test_scratch_path_end_to_end(fmt: str, g: int, monkeypatch, poisoned_outputs) -> None:
    """gemm_cuda_route(kernel="scratch") decodes with the CUDA kernel: close to float64, and bit-equal
    to the same path with the Triton decoder (same dense weights, same cuBLAS call) but for exl3."""
    from torch_uqr.backends.cuda import configs, dispatch
    from packed_reference import random_packed, reference_dequantize
    N, K = 129, 2304
    w = random_packed(fmt, N, K, g, seed=fresh_seed(), device="cuda")
    wref = reference_dequantize(w, fmt, N, K, g)
    for dtype, tol in ((torch.bfloat16, 8e-3), (torch.float16, 1.5e-3), (torch.float32, 3e-3)):
        x = torch.randn(2, 70, K, device="cuda").to(dtype)
        monkeypatch.setattr(configs, "CUDA_DEQUANT_ENABLED", True)
        assert dispatch.scratch_decoder() is dispatch.dequantize_cuda
        y = dispatch.gemm_cuda_route(x, w, fmt, N, K, g, kernel="scratch")
        check_close(y, x.double() @ wref.t(), tol, f"{fmt} scratch {dtype}", worst_factor=4)
        if fmt == "exl3":  # the Triton decoder rounds exl3 once less (test_dequant_bit_exact)
            continue
        monkeypatch.setattr(configs, "CUDA_DEQUANT_ENABLED", False)
        y_triton = dispatch.gemm_cuda_route(x, w, fmt, N, K, g, kernel="scratch")
        _assert_same_bits(y.reshape(-1, N), y_triton.reshape(-1, N), f"{fmt} scratch {dtype} vs Triton decoder")
