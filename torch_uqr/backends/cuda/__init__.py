"""CUDA backend of ``uqr::gemm`` in Triton: per-format decoders feeding tensor cores or adders.

Modules, one job each: ``decode`` (bit-exact decoders), ``gemm`` (fused tensor-core kernel),
``ternary_vec`` (add/subtract path), ``dequant`` (decode to a dense matrix), ``reduce`` (split-K
epilogue), ``configs`` (tuning tables), ``tuning`` (in-process overrides of the launch plan's
rules), ``dispatch`` (``gemm_cuda``: kernel by M and path, and the CUDA C++ kernels' launch plan),
``register`` (CUDA dispatch key), ``testing`` (random blocks + float64 reference for tests/bench).
Nothing is imported here so that ``import torch_uqr`` never needs Triton.
"""
