"""The backends of ``torch.ops.uqr.gemm`` beyond the CPU kernels of ``torch_uqr._C``: ``cuda``
(the CUDA router, its Triton kernels and tuning tables) and ``metal`` (the Metal shaders' CPU
emulator). ``strides`` is the one stride description of x and y that every backend reads."""
