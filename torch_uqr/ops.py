"""Placeholder: being written."""
gemm = None
