"""Whole models on the router: any GGUF transformers reads, as its own model class on ``QuantLinear``
and ``QuantEmbedding`` (``auto.py``), and the hand-built llama with direct-head attention (``llama.py``)."""
