"""The Metal emulator: the project's .metal kernels compiled as C++ and run on CPU threads.

``gemm(x, w, fmt, N, K, group_size, out_heads, in_heads, path)`` has the arguments of
``torch.ops.uqr.gemm`` and is what ``uqr.gemm(..., backend="metal-emu")`` calls. See ``shim.h`` for
the execution model, ``build.py`` for the compiled variants (plain, AddressSanitizer,
ThreadSanitizer), ``sanitized.py`` for running a call under a sanitizer, and ``strict.py`` for the
checks the emulator cannot make (distinct address spaces, a lint of the Metal branch and of the
kernel argument bindings).
"""
from .runner import gemm, kernel_name, prepare

__all__ = ["gemm", "kernel_name", "prepare"]
