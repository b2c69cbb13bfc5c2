"""The Metal kernels (shaders/), run by the CPU emulator, against the float64 reference.

Every format and path at M in {1, 7, 33, 127, 129}, N = 70 (not a multiple of any tile), fp16 and
bf16, plain and direct-head layouts; the emulator fills y with NaN first, so a finite y proves every
element was written. Called through the public entry ``uqr.gemm(..., backend="metal-emu")``.
"""
from __future__ import annotations

import pytest
import torch

import torch_uqr as uqr
from torch_uqr.backends import metal as metal_emu
from torch_uqr.backends.metal import source
from gemm_helpers import FORMAT_CASES, FORMAT_IDS, assert_close, randn, reference, weights

N, K = 70, 256
MS = [1, 7, 33, 127, 129]


def paths(fmt: str) -> list[str]:
    return ["auto", "mma", "vec"] if fmt == "ternary" else ["auto", "mma"]


def make_x(layout: str, M: int, dtype: torch.dtype) -> tuple[torch.Tensor, int, bool]:
    """(x, out_heads, in_heads) for a layout. "heads": x is a [2, 2, M, K/2] transposed view of a
    [2, M, 2, K/2] tensor (attention's head split, not contiguous) and y gets 2 heads of 35."""
    if layout == "plain":
        return (randn(K, dtype=dtype) if M == 1 else randn(M, K, dtype=dtype)), 0, False
    return randn(2, M, 2, K // 2, dtype=dtype).transpose(1, 2), 2, True


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("M", MS)
@pytest.mark.parametrize("fmt,group_size", FORMAT_CASES, ids=FORMAT_IDS)
def test_every_format_path_and_m(fmt: str, group_size: int | None, M: int, dtype: torch.dtype) -> None:
    qt, W = weights(fmt, group_size, N, K)
    layout = "heads" if M in (7, 127) else "plain"
    x, out_heads, in_heads = make_x(layout, M, dtype)
    ref = reference(x, W, out_heads, in_heads)
    for path in paths(fmt):
        y = uqr.gemm(x, qt, out_heads=out_heads, in_heads=in_heads, path=path, backend="metal-emu")
        assert_close(y, ref, dtype, f"{fmt} M={M} {layout} path={path}")


@pytest.mark.parametrize("fmt,path", [("q4_k", "mma"), ("q4_k", "auto"), ("ternary", "vec"), ("mlx4", "mma")])
@pytest.mark.parametrize("case", ["in_heads", "out_heads5", "batch_copy", "f32"])
def test_layout_combinations(fmt: str, path: str, case: str) -> None:
    """Head-strided input alone, 5 output heads of 14 (a head not a multiple of 8), leading dims
    that cannot be one stride (the wrapper's copy), and fp32 activations."""
    qt, W = weights(fmt, 64 if fmt == "mlx4" else None, N, K)
    M, dtype, out_heads, in_heads = 9, torch.float16, 0, False
    if case == "in_heads":
        x, in_heads = randn(3, 4, M, K // 4, dtype=dtype), True
    elif case == "out_heads5":
        x, out_heads = randn(2, M, K, dtype=dtype), 5
    elif case == "batch_copy":
        x = randn(3, 2, M, K, dtype=dtype).transpose(0, 1)
    else:
        dtype = torch.float32
        x = randn(M, K, dtype=dtype)
    y = uqr.gemm(x, qt, out_heads=out_heads, in_heads=in_heads, path=path, backend="metal-emu")
    assert_close(y, reference(x, W, out_heads, in_heads), dtype, f"{fmt} {case} path={path}")


def test_output_is_poisoned_before_the_kernels_run() -> None:
    qt, _ = weights("q4_0", None, N, K)
    req = metal_emu.prepare(randn(5, K, dtype=torch.float16), qt.data, "q4_0", N, K, 0, 0, False, "auto")
    assert bool(torch.isnan(req.y).all())


@pytest.mark.parametrize("M,path,dtype,expected", [
    (1, "auto", torch.float16, "uqr_gemm_mv_q4_0_f16"),
    (8, "auto", torch.bfloat16, "uqr_gemm_mv_q4_0_bf16"),
    (9, "auto", torch.float16, "uqr_gemm_mma_q4_0_f16"),
    (1, "mma", torch.float32, "uqr_gemm_mma_q4_0_f32"),
])
def test_launch_planner_picks_kernel_by_name(M: int, path: str, dtype: torch.dtype, expected: str) -> None:
    qt, _ = weights("q4_0", None, N, K)
    req = metal_emu.prepare(randn(M, K, dtype=dtype), qt.data, "q4_0", N, K, 0, 0, False, path)
    assert metal_emu.kernel_name(req) == expected


def test_ternary_vec_uses_the_add_subtract_kernel_at_any_m() -> None:
    qt, _ = weights("ternary", None, N, K)
    req = metal_emu.prepare(randn(129, K, dtype=torch.float16), qt.data, "ternary", N, K, 0, 0, False, "vec")
    assert metal_emu.kernel_name(req) == "uqr_gemm_mv_ternary_f16"


def test_bad_arguments_name_the_argument() -> None:
    qt, _ = weights("q4_0", None, N, K)
    x = randn(3, K, dtype=torch.float16)
    with pytest.raises(ValueError, match="path"):
        metal_emu.gemm(x, qt.data, "q4_0", N, K, 0, 0, False, "vec")
    with pytest.raises(ValueError, match="w:"):
        metal_emu.gemm(x, qt.data[:, :-1], "q4_0", N, K, 0, 0, False, "auto")
    with pytest.raises(ValueError, match="x:"):
        metal_emu.gemm(x.double(), qt.data, "q4_0", N, K, 0, 0, False, "auto")
    with pytest.raises(ValueError, match="fmt"):
        metal_emu.gemm(x, qt.data, "q9_9", N, K, 0, 0, False, "auto")


def test_shader_source_is_self_contained() -> None:
    """What the Mac glue embeds: every project header inlined once, attributes intact; the
    emulator's copy has the attributes stripped."""
    text = source.metal_source()
    assert '#include "' not in text
    assert text.count("struct uqr_gemm_params {") == 1
    assert "[[host_name(name)]]" in text and "[[buffer(0)]]" in text
    stripped = source.strip_attributes(text)
    assert "[[" not in stripped and "uqr_gemm_mma(device const T* x ," in stripped


@pytest.mark.skipif(not uqr.ops.op_available(), reason="torch_uqr._C (CPU backend) not built")
@pytest.mark.parametrize("fmt,path", [("q4_1", "auto"), ("exl3", "mma"), ("ternary", "vec")])
def test_same_results_as_the_cpu_backend(fmt: str, path: str) -> None:
    qt, _ = weights(fmt, None, N, K)
    x = randn(2, 2, 3, K // 2, dtype=torch.bfloat16)  # [batch, H_in, M, D_in]
    y_emu = uqr.gemm(x, qt, out_heads=5, in_heads=True, path=path, backend="metal-emu")
    y_cpu = uqr.gemm(x, qt, out_heads=5, in_heads=True, path=path)
    assert y_emu.shape == y_cpu.shape
    assert_close(y_emu, y_cpu.double(), torch.bfloat16, f"{fmt} emulator vs CPU")
