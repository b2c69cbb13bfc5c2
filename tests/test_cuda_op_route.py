"""The CUDA kernel of ``uqr::gemm`` registered in C++ (csrc/cuda/qmma_binding.cpp): it asks the
router (dispatch.route) once per call shape and tuning, then launches the CUDA C++ kernels without
Python; calls the router gives to the kernels launched from Python go through ``uqr::_gemm_triton``.

Skipped without a CUDA device or an extension built with the CUDA C++ kernels.
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

from cuda_test_helpers import check_close, check_half, fresh_seed, poisoned, require_qmma_kernel
from gemm_helpers import reference
from packed_reference import random_packed, reference_dequantize

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def _needs_kernel():
    require_qmma_kernel()
    with poisoned():
        yield


class _PythonCalls:
    """Counts the Python functions of torch_uqr entered while active (sys.setprofile)."""

    def __init__(self) -> None:
        import torch_uqr
        self.package = os.path.dirname(os.path.abspath(torch_uqr.__file__)) + os.sep
        self.names: list[str] = []

    def _hook(self, frame, event, arg) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(self.package):
            self.names.append(frame.f_code.co_name)

    def __enter__(self) -> "_PythonCalls":
        sys.setprofile(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)


def _call(x, w, fmt, N, K, path="auto"):
    return torch.ops.uqr.gemm(x, w, fmt, N, K, 0, 0, False, path)


def test_the_cuda_kernel_is_registered_in_cpp() -> None:
    from torch_uqr.backends.cuda import register
    assert register.CPP_KERNEL, "a build with the CUDA C++ kernels registers uqr::gemm's CUDA kernel in C++"


@pytest.mark.parametrize("rows,kind", [(1, "qmma"), (12, "qmma"), (200, "triton")])
def test_a_repeated_call_runs_without_python_on_cpp_kernels(rows: int, kind: str) -> None:
    """The first call of a shape asks the router; the next one with a C++ kernel enters no Python
    function of torch_uqr, and both give the float64 answer. A call routed to the kernels launched
    from Python runs them through uqr::_gemm_triton."""
    from torch_uqr.backends.cuda import dispatch

    fmt, N, K = "q4_0", 2064, 1024
    w = random_packed(fmt, N, K, 0, seed=fresh_seed()).cuda()
    x = torch.randn(rows, K, dtype=torch.bfloat16, device="cuda")
    assert dispatch.route(x, w, fmt, N, K)[0] == kind
    ref = reference(x.double().cpu(), reference_dequantize(w.cpu(), fmt, N, K))
    with _PythonCalls() as first:
        y1 = _call(x, w, fmt, N, K)
    with _PythonCalls() as second:
        y2 = _call(x, w, fmt, N, K)
    torch.cuda.synchronize()
    check_half(y1.cpu(), ref, torch.bfloat16, f"first call, {rows} rows")
    assert torch.equal(y1, y2)
    if kind == "triton":
        assert "gemm_cuda" in second.names, second.names
    else:
        assert second.names == [], f"the repeated call ran Python: {second.names[:10]}"


def test_the_route_follows_the_key() -> None:
    """A new dtype, alignment, path or tuning is a new key: the router is asked again, and its
    answer for that key is what runs (a misaligned x takes no tensor-core kernel)."""
    from torch_uqr.backends.cuda import dispatch, tuning

    fmt, N, K = "q4_k", 4096, 1024
    w = random_packed(fmt, N, K, 0, seed=fresh_seed()).cuda()
    x = torch.randn(12, K, dtype=torch.float16, device="cuda")
    _call(x, w, fmt, N, K)
    with _PythonCalls() as again:
        _call(x, w, fmt, N, K)
    assert again.names == []
    with tuning.override(split16=False):
        assert not dispatch.launch_plan("qmma", x, fmt, N, K).mid
        with _PythonCalls() as tuned:
            y = _call(x, w, fmt, N, K)
        assert "route_codes" in tuned.names, "an override is part of the key"
    with _PythonCalls() as back:
        _call(x, w, fmt, N, K)
    assert back.names == [], "leaving the override finds the default plan cached"
    x_odd = torch.randn(12 * K + 4, dtype=torch.float16, device="cuda")[4:].view(12, K)
    assert dispatch.route(x_odd, w, fmt, N, K)[0] == "triton"
    with _PythonCalls() as odd:
        y_odd = _call(x_odd, w, fmt, N, K)
    assert "gemm_cuda" in odd.names, "8-byte-offset x goes to the kernels launched from Python"
    W = reference_dequantize(w.cpu(), fmt, N, K)
    torch.cuda.synchronize()
    check_half(y.cpu(), reference(x.double().cpu(), W), torch.float16, "small-M kernel under override")
    check_half(y_odd.cpu(), reference(x_odd.double().cpu(), W), torch.float16, "misaligned x")
    y32 = _call(x.float(), w, fmt, N, K)
    check_close(y32.cpu(), reference(x.double().cpu(), W), 1e-4, "fp32 x")


def test_bad_arguments_fail_in_cpp_before_python() -> None:
    """A call that breaks the contract is refused by the C++ check with the argument named, as a
    ValueError, without reaching the router."""
    fmt, N, K = "q4_0", 256, 512
    w = random_packed(fmt, N, K, 0, seed=1).cuda()
    x = torch.randn(3, K + 32, dtype=torch.bfloat16, device="cuda")
    with _PythonCalls() as calls, pytest.raises(ValueError, match="x"):
        _call(x, w, fmt, N, K)
    assert "route_codes" not in calls.names
