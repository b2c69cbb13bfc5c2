"""CUDA backend of ``uqr::gemm``: its router, and the kernels launched from Python (Triton's
per-format decoders feeding tensor cores or adders). The CUDA C++ kernels are in csrc/cuda/.

Modules, one job each: ``decode`` (bit-exact decoders), ``gemm`` (fused tensor-core kernel),
``ternary_vec`` (add/subtract path), ``dequant`` (decode to a dense matrix), ``reduce`` (split-K
epilogue), ``configs`` (tuning tables), ``tuning`` (in-process overrides of the launch plan's
rules), ``dispatch`` (``route``: kernel by M and path, and the CUDA C++ kernels' launch plan),
``register`` (the Python half of the CUDA dispatch key).
Nothing is imported here so that ``import torch_uqr`` never needs Triton.
"""
