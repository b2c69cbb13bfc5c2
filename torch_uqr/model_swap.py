"""Placeholder: being written."""
quantize_model = None
