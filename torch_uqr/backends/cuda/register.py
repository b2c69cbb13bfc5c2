"""Register the CUDA kernel of ``uqr::gemm``.

Imported by ``torch_uqr.ops`` once the operator library (``torch_uqr._C``) is loaded and CUDA is
present; importing it earlier fails because the schema is defined by the C++ library.

An extension built with the CUDA C++ kernels registers ``uqr::gemm`` for CUDA itself
(csrc/cuda/qmma_binding.cpp): it asks ``uqr::_cuda_route`` (dispatch.route_codes) once per call
shape, caches the answer, and launches its own kernels from then on without Python; the calls
routed to the kernels launched from Python go to ``uqr::_gemm_triton``. Both are implemented here.
A build without CUDA C++ (no nvcc at install) has neither: ``uqr::gemm`` is then dispatch.gemm_cuda.
"""
from __future__ import annotations

import torch

from .dispatch import gemm_cuda, route_codes

CPP_KERNEL = torch._C._dispatch_has_kernel_for_dispatch_key("uqr::gemm", "CUDA")

if CPP_KERNEL:
    torch.library.impl("uqr::_cuda_route", "CUDA", route_codes)
    torch.library.impl("uqr::_gemm_triton", "CUDA", gemm_cuda)
else:
    torch.library.impl("uqr::gemm", "CUDA", gemm_cuda)
