"""The CUDA dispatch rules that need no GPU: which row counts and shapes ``auto`` sends to the
tensor-core kernels (qmma_auto) and which calls those kernels accept (qmma_fits, the mirror of the
C++ qmma_unsupported; int8_fits for path "int8"'s kernel). Runs on CPU tensors in CI;
tests/test_cuda_qmma.py and tests/test_cuda_int8.py run the kernels."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from torch_uqr.triton_kernels import configs, dispatch  # noqa: E402
from torch_uqr.triton_kernels.testing import random_packed  # noqa: E402


def test_auto_row_limits() -> None:
    small, mid, big = configs.QMMA_MAX_ROWS, configs.QMMA_MID_MAX_ROWS, configs.QMMA_MID_MIN_N
    assert dispatch.qmma_auto("q4_0", 1, 64) and dispatch.qmma_auto("q4_0", small, 64)
    assert not dispatch.qmma_auto("q4_0", small + 1, big - 1), "mid-M kernel needs N to fill the GPU"
    assert dispatch.qmma_auto("q4_0", small + 1, big) and dispatch.qmma_auto("q4_k", mid, 14336)
    assert not dispatch.qmma_auto("q4_0", mid + 1, 14336)
    q8 = configs.QMMA_MID_FORMAT_MAX_ROWS["q8_0"]
    assert dispatch.qmma_auto("q8_0", q8, 14336) and not dispatch.qmma_auto("q8_0", q8 + 1, 14336)


def test_scratch_rows_by_dtype_and_format() -> None:
    half, lo = configs.SCRATCH_HALF_MIN_M, configs.SCRATCH_AUTO_MIN_M
    for dt in (torch.bfloat16, torch.float16):
        assert dispatch.scratch_auto("q4_k", half, dt) and not dispatch.scratch_auto("q4_k", half - 1, dt)
        assert not dispatch.scratch_auto("q8_0", 64, dt) and dispatch.scratch_auto("q8_0", 65, dt)
        assert not dispatch.scratch_auto("ternary", 96, dt) and dispatch.scratch_auto("ternary", 128, dt)
    assert not dispatch.scratch_auto("q4_k", lo - 1, torch.float32) and dispatch.scratch_auto("q4_k", lo, torch.float32)
    assert not dispatch.scratch_auto("q4_k", lo - 1, torch.bfloat16, bmm_per_batch=True)


def test_fits_alignment_and_stage() -> None:
    K = 512
    w = random_packed("q4_0", 32, K, 0, seed=3)
    x = torch.randn(40, K, dtype=torch.bfloat16)
    assert dispatch.qmma_fits(x, w, "q4_0", K, 0, False, 40)
    x8 = torch.randn(17 * K + 4, dtype=torch.bfloat16)[4:].view(17, K)  # base 8 bytes off 16
    assert x8.data_ptr() % 16 == 8
    assert dispatch.qmma_fits(x8[:8], w, "q4_0", K, 0, False, 8), "small-M kernel loads 8 bytes"
    assert not dispatch.qmma_fits(x8[:9], w, "q4_0", K, 0, False, 9), "split-K mid-M kernel copies 16 bytes"
    assert not dispatch.qmma_fits(x8, w, "q4_0", K, 0, False, 17), "mid-M kernel copies 16 bytes"
    assert not dispatch.qmma_fits(x.float(), w, "q4_0", K, 0, False, 40), "fp32 x"
    assert not dispatch.qmma_fits(x, w, "q4_0", K, 0, False, configs.QMMA_KERNEL_MAX_ROWS + 1)
    w_odd = random_packed("q4_0", 32, 288, 0, seed=4)  # K = 288: not a whole 256-element stage
    assert not dispatch.qmma_fits(torch.randn(20, 288, dtype=torch.bfloat16), w_odd, "q4_0", 288, 0, False, 20)
    for fmt in ("var_affine", "exl3"):  # 256-element blocks of 160 / 144 bytes: one 16-byte-aligned stage
        wf = random_packed(fmt, 32, K, 0, seed=5)
        assert dispatch.qmma_fits(x, wf, fmt, K, 0, False, 40) and dispatch.qmma_fits(x[:1], wf, fmt, K, 0, False, 1)
        xh = torch.randn(4, 40, K // 4, dtype=torch.bfloat16)  # x heads of 128: a stage would straddle two
        assert not dispatch.qmma_fits(xh, wf, fmt, K, 0, True, 40)
        assert dispatch.qmma_fits(torch.randn(2, 40, K // 2, dtype=torch.bfloat16), wf, fmt, K, 0, True, 40)


def test_scratch_decoder_choice(monkeypatch) -> None:
    """The scratch path takes the CUDA C++ decoder only when the extension has it and the switch
    is on; otherwise the Triton one (CPU torch: never built here, so Triton)."""
    monkeypatch.setattr(dispatch, "cuda_dequant_available", lambda: True)
    monkeypatch.setattr(configs, "CUDA_DEQUANT_ENABLED", True)
    assert dispatch.scratch_decoder() is dispatch.dequantize_cuda
    monkeypatch.setattr(configs, "CUDA_DEQUANT_ENABLED", False)
    assert dispatch.scratch_decoder() is dispatch.dequantize_triton
    monkeypatch.setattr(configs, "CUDA_DEQUANT_ENABLED", True)
    monkeypatch.setattr(dispatch, "cuda_dequant_available", lambda: False)
    assert dispatch.scratch_decoder() is dispatch.dequantize_triton
    monkeypatch.undo()
    if not torch.cuda.is_available():
        assert not dispatch.cuda_dequant_available(), "a CPU torch build has no CUDA kernels"


def test_wgmma_auto_rows_device_and_fit(monkeypatch) -> None:
    """auto takes the Hopper kernel only inside the format's measured row, N and K ranges, on an sm_90
    device, and for calls the kernel accepts (16-byte-aligned x, K a multiple of 64 and of the
    stage); with it present the mid-M kernel keeps fewer rows."""
    K = 512
    w = random_packed("q4_0", 32, K, 0, seed=6)
    x = torch.randn(40, K, dtype=torch.bfloat16)
    assert not dispatch.wgmma_auto(x, w, "q4_0", 4096, K, 0, False, 40), "CPU tensors never take it"
    monkeypatch.setattr(dispatch, "wgmma_available", lambda index: True)
    monkeypatch.setattr(configs, "WGMMA_ROWS", {"q4_0": ((17, 64, 0, 0), (100, 200, 8192, 1024)),
                                                "q8_0": ((33, 64, 8192, 0),)})
    fake = torch.device("cuda", 0)

    class OnCuda:  # the device check reads x.device; everything else reads the real CPU tensor
        def __init__(self, t):
            self.t = t
            self.device = fake

        def __getattr__(self, name):
            return getattr(self.t, name)

    assert dispatch.wgmma_auto(OnCuda(x), w, "q4_0", 4096, K, 0, False, 40)
    assert not dispatch.wgmma_auto(OnCuda(x), w, "q4_0", 4096, K, 0, False, 65), "above the range"
    assert not dispatch.wgmma_auto(OnCuda(x[:16]), w, "q4_0", 4096, K, 0, False, 16), "below the range"
    K2 = 1024
    w2 = random_packed("q4_0", 32, K2, 0, seed=8)
    xl = torch.randn(150, K2, dtype=torch.bfloat16)
    assert dispatch.wgmma_auto(OnCuda(xl), w2, "q4_0", 8192, K2, 0, False, 150), "second range, N and K large enough"
    assert not dispatch.wgmma_auto(OnCuda(xl), w2, "q4_0", 4096, K2, 0, False, 150), "second range, N too small"
    xs = torch.randn(150, K, dtype=torch.bfloat16)
    assert dispatch.wgmma_fits(OnCuda(xs), w, "q4_0", K, 0, False, 150), "fits: only the range decides below"
    assert not dispatch.wgmma_auto(OnCuda(xs), w, "q4_0", 8192, K, 0, False, 150), "second range, K too small"
    assert not dispatch.wgmma_auto(OnCuda(x), w, "q4_k", 4096, K, 0, False, 40), "format without a range"
    w8 = random_packed("q8_0", 32, K, 0, seed=7)
    assert dispatch.wgmma_auto(OnCuda(x), w8, "q8_0", 8192, K, 0, False, 40)
    assert not dispatch.wgmma_auto(OnCuda(x), w8, "q8_0", 4096, K, 0, False, 40), "N below the format's minimum"
    x8 = torch.randn(40 * K + 4, dtype=torch.bfloat16)[4:].view(40, K)
    assert not dispatch.wgmma_auto(OnCuda(x8), w, "q4_0", 4096, K, 0, False, 40), "x not 16-byte aligned"
    monkeypatch.setattr(configs, "QMMA_MID_MAX_ROWS_WITH_WGMMA", 24)
    monkeypatch.setattr(configs, "QMMA_MID_FORMAT_MAX_ROWS_WITH_WGMMA", {"q8_0": 20})
    assert dispatch.qmma_auto("q4_0", 24, 14336, True) and not dispatch.qmma_auto("q4_0", 25, 14336, True)
    assert dispatch.qmma_auto("q4_0", 25, 14336, False), "without the Hopper kernel the mid-M range stays"
    assert dispatch.qmma_auto("q8_0", 20, 14336, True) and not dispatch.qmma_auto("q8_0", 21, 14336, True), \
        "a format's own cap"


def test_int8_fits_and_forced_kernel_errors() -> None:
    """Path "int8"'s kernel takes q4_0 / q4_k, bf16 / fp16 x, 1..INT8_MAX_ROWS rows (batch counted)
    and the small-M kernel's shapes; kernel="int8" refuses anything else with a ValueError, never a
    silent fallback (checked before any launch, so CPU tensors show it)."""
    K, top = 512, configs.INT8_MAX_ROWS
    w = random_packed("q4_k", 32, K, 0, seed=9)
    x = torch.randn(top + 1, K, dtype=torch.bfloat16)
    assert dispatch.int8_fits(x[:1], w, "q4_k", K, 0, False, 1)
    assert dispatch.int8_fits(x[:top].half(), w, "q4_k", K, 0, False, top)
    assert not dispatch.int8_fits(x, w, "q4_k", K, 0, False, top + 1), "above the kernel's two column tiles"
    assert not dispatch.int8_fits(x[:4].float(), w, "q4_k", K, 0, False, 4), "fp32 x"
    assert not dispatch.int8_fits(x[:0], w, "q4_k", K, 0, False, 0), "no rows"
    assert not dispatch.int8_fits(torch.randn(4, 3, K // 4, dtype=torch.bfloat16), w, "q4_k", K, 0, True, 3), \
        "x heads of 128 straddle a 256-element stage"
    w8 = random_packed("q8_0", 32, K, 0, seed=10)
    assert dispatch.qmma_fits(x[:4], w8, "q8_0", K, 0, False, 4), "the exact kernel takes q8_0"
    assert not dispatch.int8_fits(x[:4], w8, "q8_0", K, 0, False, 4), "int8 x only for q4_0 / q4_k"
    with pytest.raises(ValueError, match=f"kernel: 'int8' takes.*{top + 1} rows"):
        dispatch.gemm_triton(x.view(1, top + 1, K), w, "q4_k", 32, K, kernel="int8")
    with pytest.raises(ValueError, match="kernel: 'int8' takes.*got fmt 'q8_0'"):
        dispatch.gemm_triton(x[:4], w8, "q8_0", 32, K, kernel="int8")
    with pytest.raises(ValueError, match="path: 'int8' is only valid for fmt 'q4_0', 'q4_k', 'mlx4', 'ternary', "
                                         "'var_affine', 'exl3', got fmt 'q8_0'"):
        dispatch.gemm_triton(x[:4], w8, "q8_0", 32, K, path="int8")
    for fmt in dispatch.ONE_ROW_INT8:  # one row only, in block columns
        wf = random_packed(fmt, 32, K, 0, seed=11)
        assert dispatch.int8_fits(x[:1], wf, fmt, K, 0, False, 1), fmt
        assert not dispatch.int8_fits(x[:2], wf, fmt, K, 0, False, 2), f"{fmt}: two rows"
        with pytest.raises(ValueError, match=f"kernel: 'int8' takes.*got fmt '{fmt}'.*2 rows"):
            dispatch.gemm_triton(x[:2], wf, fmt, 32, K, kernel="int8")
