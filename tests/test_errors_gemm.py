"""Bad arguments to uqr.gemm / torch.ops.uqr.gemm raise errors that name the argument."""
from __future__ import annotations

import pytest
import torch

import torch_uqr as uqr
from gemm_helpers import randn, weights


@pytest.fixture(scope="module")
def q4():
    return weights("q4_0", None, 48, 256)[0]


def raw(x, w, fmt="q4_0", N=48, K=256, g=0, out_heads=0, in_heads=False, path="auto"):
    return torch.ops.uqr.gemm(x, w, fmt, N, K, g, out_heads, in_heads, path)


def test_x_on_another_device(q4):
    with pytest.raises(ValueError, match=r"x is on meta but the weights \(qt.data\) are on cpu"):
        uqr.gemm(torch.empty(2, 256, device="meta"), q4)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.uint8])
def test_wrong_activation_dtype(q4, dtype):
    x = torch.zeros(2, 256, dtype=dtype)
    with pytest.raises(TypeError, match="x: expected dtype float16, bfloat16 or float32"):
        uqr.gemm(x, q4)
    with pytest.raises(ValueError, match="x: expected dtype float16, bfloat16 or float32"):
        raw(x, q4.data)


def test_wrong_weight_dtype_shape_and_layout(q4):
    x = randn(2, 256)
    with pytest.raises(ValueError, match="w: expected dtype uint8"):
        raw(x, q4.data.to(torch.int8))
    with pytest.raises(ValueError, match=r"w: expected uint8 \[48, 144\]"):
        raw(x, q4.data[:, :100])
    with pytest.raises(ValueError, match="w: the packed rows must be contiguous"):
        raw(x, torch.cat([q4.data, q4.data], 1)[:, :144])


def test_K_mismatch(q4):
    with pytest.raises(ValueError, match="x: last dim is 255 but the weights have K=256"):
        uqr.gemm(randn(3, 255), q4)
    with pytest.raises(ValueError, match="x: last dim is 255 but the weights have K=256"):
        raw(randn(3, 255), q4.data)
    with pytest.raises(ValueError, match="K=250 is not a multiple of q4_0's block of 32"):
        raw(randn(3, 250), q4.data, K=250)


def test_out_heads_not_dividing_N(q4):
    with pytest.raises(ValueError, match="out_heads=5 does not divide N=48"):
        uqr.gemm(randn(3, 256), q4, out_heads=5)
    with pytest.raises(ValueError, match="out_heads=5 does not divide N=48"):
        raw(randn(3, 256), q4.data, out_heads=5)
    with pytest.raises(ValueError, match="out_heads"):
        uqr.gemm(randn(3, 256), q4, out_heads=-2)
    with pytest.raises(ValueError, match="out_heads=4 needs x with an M dim"):
        uqr.gemm(randn(256), q4, out_heads=4)


def test_in_heads_wrong_rank_or_size(q4):
    with pytest.raises(ValueError, match=r"x: in_heads=True expects x of shape \[..., H, M, D\]"):
        uqr.gemm(randn(3, 256), q4, in_heads=True)
    with pytest.raises(ValueError, match=r"x: in_heads=True expects x of shape \[..., H, M, D\]"):
        raw(randn(3, 256), q4.data, in_heads=True)
    with pytest.raises(ValueError, match="x: in_heads=True needs H\\*D == K"):
        uqr.gemm(randn(4, 3, 32), q4, in_heads=True)


def test_path_and_format_arguments(q4):
    with pytest.raises(ValueError, match="path='vec' .* supports fmt 'ternary', not 'q4_0'"):
        uqr.gemm(randn(2, 256), q4, path="vec")
    with pytest.raises(ValueError, match="path='vec' .* supports fmt 'ternary', not 'q4_0'"):
        raw(randn(2, 256), q4.data, path="vec")
    with pytest.raises(ValueError, match="path: expected one of"):
        uqr.gemm(randn(2, 256), q4, path="fast")
    with pytest.raises(ValueError, match="path: expected 'auto', 'mma', 'vec' or 'int8'"):
        raw(randn(2, 256), q4.data, path="fast")
    with pytest.raises(ValueError, match="fmt: unknown format 'q9_9'"):
        raw(randn(2, 256), q4.data, fmt="q9_9")
    with pytest.raises(ValueError, match="group_size: mlx4 needs 32, 64 or 128"):
        raw(randn(2, 256), q4.data, fmt="mlx4", g=48)
    with pytest.raises(ValueError, match="group_size: q4_0 has a fixed block"):
        raw(randn(2, 256), q4.data, g=64)
    with pytest.raises(TypeError, match="qt: expected a torch_uqr.QTensor"):
        uqr.gemm(randn(2, 256), q4.data)
    with pytest.raises(ValueError, match="backend"):
        uqr.gemm(randn(2, 256), q4, backend="opencl")


def test_non_contiguous_input_is_copied_not_rejected(q4):
    """Documented choice: layouts outside the stride set are copied once (x.contiguous())."""
    x = randn(256, 3).t()  # K dim not unit-stride
    W = uqr.dequantize(q4).double()
    y = uqr.gemm(x, q4)
    assert torch.allclose(y.double(), x.double() @ W.T, rtol=1e-5, atol=1e-5)
