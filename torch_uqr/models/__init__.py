"""Whole models on the router (a GGUF llama-architecture model built on ``QuantLinear``)."""
