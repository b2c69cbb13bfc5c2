"""The CUDA dispatch rules that need no GPU: which row counts and shapes ``auto`` sends to the
tensor-core kernels (qmma_auto) and which calls those kernels accept (qmma_fits, the mirror of the
C++ qmma_unsupported; int8_fits for path "int8"'s kernel). Runs on CPU tensors in CI;
tests/test_cuda_qmma.py and tests/test_cuda_int8.py run the kernels."""
from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("triton")
from torch_uqr.backends.cuda import configs, dispatch  # noqa: E402
from torch_uqr.formats import table  # noqa: E402
from packed_reference import random_packed  # noqa: E402


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
    # A format without a row of its own takes the default range (17-128 rows), never silently none.
    assert dispatch.wgmma_auto(OnCuda(x), w, "q4_k", 4096, K, 0, False, 40), "format without a row: default range"
    assert not dispatch.wgmma_auto(OnCuda(xs), w, "q4_k", 8192, K, 0, False, 150), "default range ends at 128"
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
        dispatch.gemm_cuda_route(x.view(1, top + 1, K), w, "q4_k", 32, K, kernel="int8")
    with pytest.raises(ValueError, match="kernel: 'int8' takes.*got fmt 'q8_0'"):
        dispatch.gemm_cuda_route(x[:4], w8, "q8_0", 32, K, kernel="int8")
    listed = re.escape(", ".join(map(repr, table.names_with_path("int8", "cuda"))))
    with pytest.raises(ValueError, match=f"path='int8' .* on the cuda backend supports fmt {listed}, not 'q8_0'"):
        dispatch.gemm_cuda_route(x[:4], w8, "q8_0", 32, K, path="int8")
    for fmt in dispatch.ONE_ROW_INT8:  # one row only, in block columns
        wf = random_packed(fmt, 32, K, 0, seed=11)
        assert dispatch.int8_fits(x[:1], wf, fmt, K, 0, False, 1), fmt
        assert not dispatch.int8_fits(x[:2], wf, fmt, K, 0, False, 2), f"{fmt}: two rows"
        with pytest.raises(ValueError, match=f"kernel: 'int8' takes.*got fmt '{fmt}'.*2 rows"):
            dispatch.gemm_cuda_route(x[:2], wf, fmt, 32, K, kernel="int8")


# -- The launch plan of the CUDA C++ kernels (no GPU: device properties passed in) --------------
# Expected values are worked out by hand from the rules the C++ launchers applied before the plan
# moved to Python (for an H100 / H200's 132 SMs and an A100's 108), not from the planner itself.

def _residency(small=(8, 8, 7, 3), split_fit=3, int8=(8, 8, 6, 3)):
    """A fake uqr::_cuda_residency: resident CTAs an SM at 1, 2, 4, 8 warps, and the split build's."""
    calls = []

    def get(kernel: str, rows: int, variant: int):
        calls.append((kernel, rows, variant))
        return {"small_m": small, "int8": int8, "mid_split": (split_fit,)}[kernel]
    get.calls = calls
    return get


def _qmma(fmt, N, K, rows, sms=132, g=0, device_pdl=True, res=None, **knobs):
    from torch_uqr.backends.cuda import tuning
    return dispatch.plan_qmma(fmt, g, N, K, rows, sms=sms, residency=res or _residency(), pdl=device_pdl,
                              tune=tuning.Tuning(**knobs))


def test_plan_small_m_warps() -> None:
    # 1-8 rows: small-M kernel. 14336 x 4096: 896 CTAs, 16 stages; 8 warps hold 3 x 132 = 396 < 896,
    # 4 warps 7 x 132 = 924 >= 896 -> 4. On 108 SMs no count holds 896 (8 x 108 = 864): the last
    # tried, 1 warp.
    p = _qmma("q4_0", 14336, 4096, 1)
    assert p == dispatch.QmmaPlan(mid=False, warps=4, smem_cap=True, pdl=True)
    assert _qmma("q4_0", 14336, 4096, 8, sms=108).warps == 1
    # 4096 x 14336: 256 CTAs, 56 stages: 8 warps, 3 x 132 = 396 >= 256.
    assert _qmma("q4_k", 4096, 14336, 8).warps == 8
    # K = 512 (2 stages): 8 and 4 and 2 warps need >= 16 / 8 / 4 stages -> 1 warp.
    assert _qmma("q4_0", 4096, 512, 3).warps == 1
    # mlx4 g128: stages of 512 elements (4096 / 512 = 8): 8 warps need 16 -> 4 warps (7 x 132 >= 256).
    assert _qmma("mlx4", 4096, 4096, 2, g=128).warps == 4


def test_plan_split16_streamk_default() -> None:
    # 9-16 rows: mid-M kernel, 16-row tiles. 14336 x 4096 (112 row tiles, 16 stages), fit 3 on 132
    # SMs: power-of-two split 2 (224 <= 396; 448 > 396). Stream-K slots 2 x 132 = 264; 112 x 2 x 20 =
    # 4480 < 264 x 19 = 5016: stream-K, min(264, 1792 / 2) = 264 CTAs > 112 tiles; ranges of
    # 1792 // 264 = 6 stages: planes (16 - 1) // 6 + 2 = 4.
    p = _qmma("q4_0", 14336, 4096, 16)
    assert p == dispatch.QmmaPlan(mid=True, mid_cols=16, splits=4, streamk_ctas=264, wide_regs=False, pdl=True)
    assert _qmma("q4_k", 14336, 4096, 9).wide_regs and _qmma("exl3", 14336, 4096, 12).wide_regs
    assert not _qmma("mlx4", 14336, 4096, 12, g=64).wide_regs
    # 108 SMs, fit 2: split 1 (224 > 216); 112 x 1 x 20 = 2240 < 216 x 19: stream-K 216 CTAs, ranges
    # of 1792 // 216 = 8: planes 15 // 8 + 2 = 3.
    p = _qmma("q4_0", 14336, 4096, 16, sms=108, res=_residency(split_fit=2))
    assert (p.splits, p.streamk_ctas) == (3, 216)
    # 4096 x 14336 (32 tiles, 56 stages): split 8 (256 <= 396; 512 > 396); 32 x 8 x 20 = 5120 >=
    # 5016: no stream-K. 108 SMs, fit 3: 8 too; 5120 >= 216 x 19 = 4104: none.
    assert _qmma("q4_0", 4096, 14336, 16) == dispatch.QmmaPlan(mid=True, mid_cols=16, splits=8, pdl=True)
    assert (_qmma("q4_0", 4096, 14336, 16, sms=108).splits, _qmma("q4_0", 4096, 14336, 16, sms=108).streamk_ctas) == (8, 0)
    # 4096 x 4096 (16 stages): 2, 4, 8 (16 // 8 = 2 >= 2), 16 would need 256 x 2 <= 396: split 8.
    assert _qmma("q4_0", 4096, 4096, 9).splits == 8 and _qmma("q4_0", 4096, 4096, 9).streamk_ctas == 0


def test_plan_mid_m_column_tiles() -> None:
    # 17-32 rows: 32-row tiles; more: 64 where 128-row CTAs x 64-row tiles fill the SMs, else 32.
    assert _qmma("q4_0", 14336, 4096, 17) == dispatch.QmmaPlan(mid=True, mid_cols=32, pdl=True)
    assert _qmma("q4_0", 14336, 4096, 64).mid_cols == 32   # 112 x 1 < 132
    assert _qmma("q4_0", 14336, 4096, 64, sms=108).mid_cols == 64   # 112 >= 108
    assert _qmma("q4_0", 14336, 4096, 65).mid_cols == 64   # 112 x 2 >= 132
    assert _qmma("q8_0", 4096, 4096, 100).mid_cols == 32   # 32 x 2 < 132


def test_plan_qmma_overrides() -> None:
    # split16=False: 9-16 rows on the small-M kernel, x only 8-byte aligned there.
    assert not _qmma("q4_0", 14336, 4096, 12, split16=False).mid
    assert not dispatch.qmma_takes_mid(12, tuning_of(split16=False)) and dispatch.qmma_takes_mid(12)
    # Forced splits: clamped to the stages, stream-K off.
    assert _qmma("q4_0", 300, 4096, 12, split16_splits=3) == dispatch.QmmaPlan(mid=True, mid_cols=16, splits=3, pdl=True)
    assert _qmma("q4_0", 300, 2816, 12, split16_splits=12).splits == 11
    # Stream-K off: the power-of-two split.
    assert _qmma("q4_0", 14336, 4096, 16, streamk=False).splits == 2
    # Everywhere: 4096 x 14336 takes it, 264 CTAs, ranges of 1792 // 264 = 6: planes 55 // 6 + 2 = 11.
    p = _qmma("q4_0", 4096, 14336, 16, streamk=True)
    assert (p.streamk_ctas, p.splits) == (264, 11)
    # Forced grids: 7 CTAs do not exceed 112 tiles (off: split 2); 200 do: ranges of 8, planes 3.
    assert _qmma("q4_0", 14336, 4096, 16, streamk_ctas=7).streamk_ctas == 0
    assert (_qmma("q4_0", 14336, 4096, 16, streamk_ctas=200).streamk_ctas, _qmma("q4_0", 14336, 4096, 16, streamk_ctas=200).splits) == (200, 3)
    # N = 300 (3 tiles, 16 stages): 4 CTAs -> ranges of 12, planes 15 // 12 + 2 = 3.
    assert (_qmma("q4_0", 300, 4096, 16, streamk_ctas=4).streamk_ctas, _qmma("q4_0", 300, 4096, 16, streamk_ctas=4).splits) == (4, 3)
    # 3 an SM: 396 CTAs on 4096 x 14336, ranges of 1792 // 396 = 4: planes 55 // 4 + 2 = 15.
    assert (_qmma("q4_0", 4096, 14336, 16, streamk_per_sm=3).streamk_ctas, _qmma("q4_0", 4096, 14336, 16, streamk_per_sm=3).splits) == (396, 15)
    # Register builds.
    assert _qmma("q4_0", 14336, 4096, 16, streamk_wide_regs=True).wide_regs
    assert not _qmma("q4_k", 14336, 4096, 16, streamk_wide_regs=False).wide_regs
    # PDL: the device's (sm_90) unless turned off; smem cap.
    assert not _qmma("q4_0", 14336, 4096, 1, device_pdl=False).pdl  # not an sm_90 device
    assert not _qmma("q4_0", 14336, 4096, 1, pdl=False).pdl  # turned off
    assert not _qmma("q4_0", 14336, 4096, 1, smem_cap=False).smem_cap


def tuning_of(**knobs):
    from torch_uqr.backends.cuda import tuning
    return tuning.Tuning(**knobs)


def _wg(fmt, N, K, rows, sms=132, g=0, builds=(1, 1, 2), **knobs):
    return dispatch.plan_wgmma(fmt, g, N, K, rows, sms=sms, pdl=True, builds=builds, tune=tuning_of(**knobs))


def test_plan_wgmma() -> None:
    # 128 rows on 14336 x 4096: BM 128, one CTA; 112 tiles x 2 > 132: no split.
    assert _wg("q4_0", 14336, 4096, 128) == dispatch.WgmmaPlan(bm=128, ctas=1, splits=1, pdl=True)
    # 32 rows on 4096 x 4096: BM 64, 32 row tiles (2 x 32 <= 132): two CTAs; slots 264: split 2, 4
    # (16 // 4 = 4 >= 4), not 8 (16 // 8 = 2).
    assert _wg("q4_0", 4096, 4096, 32) == dispatch.WgmmaPlan(bm=64, ctas=2, splits=4, pdl=True)
    # q8_0's 64-row tiles do not fit twice: one CTA, slots 132: 64 <= 132 -> 2, 128 <= 132 -> 4.
    assert _wg("q8_0", 4096, 4096, 40, builds=(1, 1, 0)) == dispatch.WgmmaPlan(bm=64, ctas=1, splits=4, pdl=True)
    # mlx4 g128's stage does not fit 128-row tiles: BM 64 at 128 rows, one CTA (rows > 64).
    assert _wg("mlx4", 14336, 4096, 128, g=128, builds=(0, 1, 0)) == dispatch.WgmmaPlan(bm=64, ctas=1, splits=1,
                                                                                         pdl=True)
    # 14336 x 4096 at 40 rows: 2 x 112 > 132, no K split -> one CTA.
    assert _wg("q4_0", 14336, 4096, 40).ctas == 1
    # 108 SMs, 4096 x 4096 at 100 rows: BM 128, 32 tiles: 64 <= 108 -> 2; 128 > 108.
    assert _wg("q4_0", 4096, 4096, 100, sms=108).splits == 2
    # Overrides: BM 64 at 128 rows; BM 128 refused where it does not fit; two CTAs forced.
    assert _wg("q4_0", 14336, 4096, 128, wgmma_bm=64).bm == 64
    assert _wg("mlx4", 14336, 4096, 128, g=128, builds=(0, 1, 0), wgmma_bm=128).bm == 64
    assert _wg("q4_0", 14336, 4096, 40, wgmma_ctas=2).ctas == 2
    assert _wg("q8_0", 14336, 4096, 40, builds=(1, 1, 0), wgmma_ctas=2).ctas == 1  # two do not fit: refused
    assert _wg("q4_0", 4096, 4096, 32, wgmma_ctas=1).ctas == 1
    assert not _wg("q4_0", 4096, 4096, 32, pdl=False).pdl


def _i8(fmt, N, K, rows, sms=132, g=0, **knobs):
    res = _residency()
    return dispatch.plan_int8(fmt, g, N, K, rows, sms=sms, residency=res, pdl=True, tune=tuning_of(**knobs)), res


def test_plan_int8() -> None:
    # One row: block columns for every format by default (14336 x 4096: 896 CTAs; 8 warps 3 x 132
    # < 896, 4 warps 6 x 132 = 792 < 896, 2 warps 8 x 132 = 1056 -> 2).
    p, res = _i8("q4_0", 14336, 4096, 1)
    assert p == dispatch.Int8Plan(variant=dispatch.INT8_COLS, warps=2, pdl=True) and res.calls == [("int8", 1, 3)]
    assert _i8("mlx4", 4096, 4096, 1, g=64, int8_cols=False)[0].variant == dispatch.INT8_COLS
    # Without block columns: x staged where 256 CTAs < 4 x 132; 896 >= 528: x a stage ahead.
    assert _i8("q4_k", 4096, 4096, 1, int8_cols=False)[0].variant == dispatch.INT8_XRING
    assert _i8("q4_k", 14336, 4096, 1, int8_cols=False)[0].variant == dispatch.INT8_XPIPE
    assert _i8("q4_k", 14336, 4096, 1, int8_cols=False, int8_xpipe=False)[0].variant == dispatch.INT8_TILES
    assert _i8("q4_k", 14336, 4096, 1, int8_cols=False, int8_xring=True)[0].variant == dispatch.INT8_XRING
    assert _i8("q4_k", 4096, 4096, 1, int8_cols=False, int8_xring=False)[0].variant == dispatch.INT8_XPIPE
    assert _i8("q4_0", 8192, 4096, 1, sms=108, int8_cols=False)[0].variant == dispatch.INT8_XPIPE  # 512 >= 432
    # More rows: tiles.
    p, res = _i8("q4_k", 4096, 4096, 8)
    assert p.variant == dispatch.INT8_TILES and p.warps == 8 and res.calls == [("int8", 8, 0)]


def test_tuning_override_nests_and_validates() -> None:
    from torch_uqr.backends.cuda import tuning
    assert tuning.current() == tuning.DEFAULT
    with tuning.override(pdl=False) as t1:
        assert t1.pdl is False and tuning.current() is t1
        with tuning.override(split16_splits=3, pdl=None) as t2:
            assert t2.split16_splits == 3 and t2.pdl is None
        assert tuning.current() is t1
    assert tuning.current() == tuning.DEFAULT
    with pytest.raises(TypeError, match="unknown knob"):
        with tuning.override(stream_k=False):
            pass
    with pytest.raises(ValueError, match="wgmma_bm"):
        tuning.Tuning(wgmma_bm=96)
    with pytest.raises(ValueError, match="split16_splits"):
        tuning.Tuning(split16_splits=0)


def test_route_codes_match_the_cpp_kernel() -> None:
    """uqr::gemm's C++ CUDA kernel reads route_codes by position (csrc/cuda/qmma_binding.cpp): its
    RouteKind numbers and plan lengths must be ROUTE_KINDS' order and the plans' argument counts."""
    import re
    from pathlib import Path

    src = (Path(__file__).resolve().parent.parent / "csrc" / "cuda" / "qmma_binding.cpp").read_text()
    kinds = dict(re.findall(r"kRoute(\w+) = (\d+)", src))
    assert {k.lower(): int(v) for k, v in kinds.items()} == {k: i for i, k in enumerate(dispatch.ROUTE_KINDS)}
    lengths = [int(v) for v in re.search(r"kPlanArgs\[\] = \{([\d, ]+)\}", src).group(1).split(",")]
    plans = [(), dispatch.QmmaPlan(mid=False).args(), dispatch.WgmmaPlan(64, 1, 1).args(),
             dispatch.Int8Plan(0, 1).args()]
    assert lengths == [len(p) for p in plans]
    # CPU tensors: no CUDA C++ kernel takes them, so the route is the Python-launched kernels'.
    w = random_packed("q4_0", 32, 512, 0, seed=3)
    assert dispatch.route_codes(torch.randn(2, 512, dtype=torch.bfloat16), w, "q4_0", 32, 512, 0, 0, False,
                                "auto") == [0]
