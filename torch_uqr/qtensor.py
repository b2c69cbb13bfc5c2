"""Placeholder: being written."""
QTensor = formats = quantize = dequantize = None
