"""The commands of ``python -m torch_uqr``: ``bench``, ``formats``, ``generate``, ``eval``."""
