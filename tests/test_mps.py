"""The Metal kernels on a real Apple GPU (``mps`` tensors), against the float64 reference and the
CPU emulator of the same shaders (``backend="metal-emu"``).

Runs on macOS arm64 with an MPS-enabled torch and torch_uqr._C built there
(``scripts/mac_check.sh`` does all of it); everywhere else the GPU tests skip with the reason.

Covered: every format (mlx4 at each group size) x path x dtype (fp16 / bf16 / fp32) x odd M (1, 7,
33, 127, 129, 2047) x head layout (out_heads: y written as heads; in_heads: x read head-strided),
with every output NaN-poisoned before the kernels run (``ops.poison_outputs``, so a finite y proves each
element was written); x as an offset view (storage_offset, row stride wider than K) and packed
weights as an offset view; blocks whose fp16 scales are subnormal (fast math would flush them);
and a compile of the shader library through ``torch.mps.compile_shader``, which needs no build.

The last tests run everywhere: they apply this suite's subnormal and offset-view checks to the
emulator and show they fail on a planted error, so a Mac run cannot pass them vacuously.
"""
from __future__ import annotations

import platform
import sys

import pytest
import torch

import torch_uqr as uqr
from torch_uqr import ops
from torch_uqr.backends.metal import source
from gemm_helpers import FORMAT_CASES, FORMAT_IDS, SEED, assert_close, randn, reference, weights

N, K = 70, 256
MS = [1, 7, 33, 127, 129, 2047]
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
DTYPE_IDS = ["f16", "bf16", "f32"]
LAYOUTS = ["out_heads", "in_heads"]


def _macos_version() -> tuple[int, ...]:
    text = platform.mac_ver()[0]
    return tuple(int(p) for p in text.split(".") if p.isdigit()) if text else ()


def mps_skip_reason() -> str | None:
    """Why the GPU tests cannot run here (None: they can)."""
    if sys.platform != "darwin" or platform.machine() != "arm64":
        return (f"needs an Apple Silicon Mac (this is {platform.system()} {platform.machine()}); "
                "run scripts/mac_check.sh there")
    if not torch.backends.mps.is_built():
        return f"torch {torch.__version__} was built without MPS support"
    if not torch.backends.mps.is_available():
        return "torch.backends.mps.is_available() is False (no Metal device, or macOS older than 12.3)"
    return None


def op_skip_reason() -> str | None:
    """Why torch.ops.uqr.gemm cannot run on mps tensors here (None: it can)."""
    reason = mps_skip_reason()
    if reason:
        return reason
    if not ops.op_available():
        return "torch_uqr._C is not built (pip install --no-build-isolation -e . on the Mac)"
    if not torch._C._dispatch_has_kernel_for_dispatch_key("uqr::gemm", "MPS"):
        return "torch_uqr._C was built without the Metal glue (csrc/mps is compiled on macOS arm64 only)"
    return None


needs_mps = pytest.mark.skipif(mps_skip_reason() is not None, reason=str(mps_skip_reason()))
needs_op = pytest.mark.skipif(op_skip_reason() is not None, reason=str(op_skip_reason()))


@pytest.fixture(autouse=True)
def poisoned_outputs():
    """Every backend fills its fresh output with NaN before the kernels write it."""
    ops.poison_outputs(True)
    yield
    ops.poison_outputs(False)


def skip_unsupported(dtype: torch.dtype) -> None:
    if dtype == torch.bfloat16 and _macos_version() and _macos_version() < (14,):
        pytest.skip("bfloat16 kernels need Metal 3.1 (macOS 14 or later)")


def paths(fmt: str) -> list[str]:
    return ["auto", "mma", "vec"] if fmt == "ternary" else ["auto", "mma"]


def make_x(layout: str, M: int, dtype: torch.dtype) -> tuple[torch.Tensor, int, bool]:
    """(x, out_heads, in_heads). out_heads: x [2, M, K], y as 2 heads of 35. in_heads: x is the
    [2, 2, M, K/2] head-split view attention produces (not contiguous)."""
    if layout == "out_heads":
        return randn(2, M, K, dtype=dtype), 2, False
    return randn(2, M, 2, K // 2, dtype=dtype).transpose(1, 2), 0, True


def on_mps(t: torch.Tensor) -> torch.Tensor:
    """t on the GPU with the same strides (a non-contiguous view stays one)."""
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="mps")
    out.copy_(t)
    return out


def run_both(x: torch.Tensor, qt, out_heads: int, in_heads: bool, path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(y from the GPU, moved to the CPU; the float64 reference)."""
    y = uqr.gemm(on_mps(x), qt.to("mps"), out_heads=out_heads, in_heads=in_heads, path=path)
    assert y.device.type == "mps"
    torch.mps.synchronize()
    return y.cpu(), reference(x, uqr.dequantize(qt).double(), out_heads, in_heads)


# --- Shader compile smoke test (no build needed) ------------------------------------------------

def kernel_names(with_bf16: bool) -> list[str]:
    dtypes = ["f16", "f32"] + (["bf16"] if with_bf16 else [])
    return [f"uqr_gemm_{kind}_{fmt}_{d}" for kind in ("mma", "mv") for fmt in ops.FORMATS for d in dtypes]


@needs_mps
def test_shader_library_compiles_on_this_gpu() -> None:
    """Apple's compiler accepts the embedded library source and every kernel the host asks for."""
    if not hasattr(torch.mps, "compile_shader"):
        pytest.skip(f"torch {torch.__version__} has no torch.mps.compile_shader (added in torch 2.6)")
    lib = torch.mps.compile_shader(source.metal_source())
    missing = []
    for name in kernel_names(with_bf16=_macos_version() >= (14,)):
        try:
            getattr(lib, name)
        except Exception as exc:  # noqa: BLE001 - report every missing kernel at once
            missing.append(f"{name}: {exc}")
    assert not missing, "\n".join(missing)


# --- The operator on mps tensors ----------------------------------------------------------------

@needs_op
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("M", MS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fmt,group_size", FORMAT_CASES, ids=FORMAT_IDS)
def test_gpu_matches_reference(fmt: str, group_size: int | None, dtype: torch.dtype, M: int, layout: str) -> None:
    skip_unsupported(dtype)
    qt, _ = weights(fmt, group_size, N, K)
    x, out_heads, in_heads = make_x(layout, M, dtype)
    for path in paths(fmt):
        y, ref = run_both(x, qt, out_heads, in_heads, path)
        assert_close(y, ref, dtype, f"mps {fmt} M={M} {layout} path={path}")


@needs_op
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("M", MS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fmt,group_size", FORMAT_CASES, ids=FORMAT_IDS)
def test_gpu_matches_emulator(fmt: str, group_size: int | None, dtype: torch.dtype, M: int, layout: str) -> None:
    """The same shader source on the GPU and on emulated threads: equal to the dtype's rounding
    (accumulation order inside a simdgroup multiply may differ)."""
    skip_unsupported(dtype)
    qt, _ = weights(fmt, group_size, N, K)
    x, out_heads, in_heads = make_x(layout, M, dtype)
    for path in paths(fmt):
        y, _ = run_both(x, qt, out_heads, in_heads, path)
        y_emu = uqr.gemm(x, qt, out_heads=out_heads, in_heads=in_heads, path=path, backend="metal-emu")
        assert_close(y, y_emu.double(), dtype, f"mps vs metal-emu {fmt} M={M} {layout} path={path}")


def offset_views(M: int, dtype: torch.dtype, device: str = "cpu") -> dict[str, torch.Tensor]:
    """x as views that start inside their storage (on ``device``): rows of a wider matrix (row
    stride K + 48) and a flat slice."""
    gen = torch.Generator().manual_seed(SEED + M)
    wide = torch.randn(M + 5, K + 48, generator=gen).to(dtype).to(device)
    flat = torch.randn(M * K + 24, generator=gen).to(dtype).to(device)
    return {"rows_of_wider": wide[3:3 + M, 16:16 + K], "flat_slice": flat[24:].view(M, K)}


@needs_op
@pytest.mark.parametrize("M", [1, 33])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fmt", ["q4_0", "q4_k", "ternary"])
def test_gpu_offset_views(fmt: str, dtype: torch.dtype, M: int) -> None:
    skip_unsupported(dtype)
    qt, W = weights(fmt, None, N, K)
    wide_w = torch.cat([torch.zeros(3, qt.data.shape[1], dtype=torch.uint8), qt.data]).to("mps")
    qt_view = uqr.QTensor(wide_w[3:], fmt, (N, K), qt.group_size)  # w at a storage offset too
    cpu_views = offset_views(M, dtype)
    for name, xv in offset_views(M, dtype, "mps").items():
        assert xv.storage_offset() > 0
        for path in paths(fmt):
            y = uqr.gemm(xv, qt_view, path=path).cpu()
            assert_close(y, reference(cpu_views[name], W), dtype, f"mps {fmt} x={name} M={M} path={path}")


SUBNORMAL_FORMATS = {"q4_0": 18, "q8_0": 34}  # block bytes; the fp16 scale d is bytes 0-1


def subnormal_scale_weights(fmt: str) -> tuple[uqr.QTensor, torch.Tensor]:
    """Valid random blocks whose every fp16 scale is subnormal (bits 0x0001..0x03ff)."""
    qt, _ = weights(fmt, None, N, K)
    data = qt.data.clone()
    blocks = data.view(N, K // 32, SUBNORMAL_FORMATS[fmt])
    gen = torch.Generator().manual_seed(SEED)
    bits = torch.randint(0x0040, 0x0400, (N, K // 32), generator=gen, dtype=torch.int32)
    blocks[:, :, 0] = (bits & 0xFF).to(torch.uint8)
    blocks[:, :, 1] = (bits >> 8).to(torch.uint8)
    sub = uqr.QTensor.from_bytes(data, fmt, (N, K))
    W = uqr.dequantize(sub).double()
    assert bool((W != 0).any()), "subnormal scales decoded to zero"
    return sub, W


def subnormal_x(M: int, dtype: torch.dtype) -> torch.Tensor:
    """x large enough that y sits in fp16's normal range while every weight is ~1e-6."""
    return (randn(M, K) * 200).to(dtype)


@needs_op
@pytest.mark.parametrize("M", [1, 33])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fmt", sorted(SUBNORMAL_FORMATS))
def test_gpu_keeps_subnormal_scales(fmt: str, dtype: torch.dtype, M: int) -> None:
    """Fast math may flush subnormal fp16 scales to zero; the glue compiles with safe math."""
    skip_unsupported(dtype)
    qt, W = subnormal_scale_weights(fmt)
    x = subnormal_x(M, dtype)
    for path in paths(fmt):
        y = uqr.gemm(on_mps(x), qt.to("mps"), path=path).cpu()
        assert_close(y, reference(x, W), dtype, f"mps {fmt} subnormal scales M={M} path={path}")


# --- Runs everywhere: this suite's checks, on the emulator, catch planted errors ------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fmt", sorted(SUBNORMAL_FORMATS))
def test_emulator_keeps_subnormal_scales(fmt: str, dtype: torch.dtype) -> None:
    qt, W = subnormal_scale_weights(fmt)
    x = subnormal_x(33, dtype)
    for path in paths(fmt):
        y = uqr.gemm(x, qt, path=path, backend="metal-emu")
        assert_close(y, reference(x, W), dtype, f"metal-emu {fmt} subnormal scales path={path}")


def test_subnormal_check_catches_flushed_scales() -> None:
    """A kernel that flushed the subnormal scales (to zero) fails the check above."""
    qt, W = subnormal_scale_weights("q4_0")
    flushed = qt.data.clone()
    flushed.view(N, K // 32, 18)[:, :, 0:2] = 0
    x = subnormal_x(33, torch.float32)
    y = uqr.gemm(x, uqr.QTensor(flushed, "q4_0", (N, K)), backend="metal-emu")
    with pytest.raises(AssertionError, match="rel error"):
        assert_close(y, reference(x, W), torch.float32, "flushed")


def test_offset_view_check_catches_a_kernel_that_ignores_the_offset() -> None:
    """The offset-view check compares against the view's own values: reading from the start of
    the storage (ignoring storage_offset) gives a different y, which the check rejects."""
    qt, W = weights("q4_0", None, N, K)
    x = offset_views(33, torch.float32)["flat_slice"]
    assert x.storage_offset() > 0
    y_ok = uqr.gemm(x, qt, backend="metal-emu")
    assert_close(y_ok, reference(x, W), torch.float32, "offset view")
    from_start = torch.as_strided(x, x.shape, x.stride(), 0)
    y_bad = uqr.gemm(from_start, qt, backend="metal-emu")
    with pytest.raises(AssertionError, match="rel error"):
        assert_close(y_bad, reference(x, W), torch.float32, "offset ignored")


def test_poisoned_output_check_catches_an_unwritten_element() -> None:
    qt, W = weights("q4_0", None, N, K)
    x = randn(7, K)
    y = uqr.gemm(x, qt, backend="metal-emu")
    y[3, 5] = float("nan")  # what a kernel that skipped one element leaves behind
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close(y, reference(x, W), torch.float32, "unwritten")

