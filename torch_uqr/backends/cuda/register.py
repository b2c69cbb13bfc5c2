"""Register the Triton kernels as the CUDA implementation of ``uqr::gemm``.

Imported by ``torch_uqr.ops`` once the operator library (``torch_uqr._C``) is loaded and CUDA is
present; importing it earlier fails because the schema is defined by the C++ library.
"""
from __future__ import annotations

import torch

from .dispatch import gemm_cuda

torch.library.impl("uqr::gemm", "CUDA", gemm_cuda)
