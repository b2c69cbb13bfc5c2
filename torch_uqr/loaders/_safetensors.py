"""Reading safetensors checkpoints (a file or a folder of shards) with errors as ValueError."""
from __future__ import annotations

import glob
import json
import os
from typing import Any

import torch


def checkpoint_files(path: str) -> tuple[list[str], dict[str, Any]]:
    """The .safetensors files of ``path`` (a file or a folder) and the folder's config.json (or {})."""
    path = os.fspath(path)
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    files = sorted(glob.glob(os.path.join(path, "*.safetensors"))) if os.path.isdir(path) else [path]
    if not files:
        raise ValueError(f"{path!r}: no .safetensors file found")
    config: dict[str, Any] = {}
    cfg_path = os.path.join(folder, "config.json")
    if os.path.isfile(cfg_path):
        try:
            with open(cfg_path, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"{cfg_path!r}: not valid JSON: {e}") from e
        if not isinstance(config, dict):
            raise ValueError(f"{cfg_path!r}: expected a JSON object")
    return files, config


def read_tensors(files: list[str]) -> dict[str, torch.Tensor]:
    """Every tensor of the files; a malformed or truncated file raises ValueError naming it.

    The safetensors library checks the header length and every offset against the file size
    before it reads, so a corrupt header never triggers a large allocation.
    """
    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    for fn in files:
        try:
            with safe_open(fn, framework="pt") as f:
                for key in f.keys():
                    if key in out:
                        raise ValueError(f"tensor {key!r} appears in more than one file")
                    out[key] = f.get_tensor(key)
        except ValueError:
            raise
        except Exception as e:  # SafetensorError and friends: keep the loader's one error type
            raise ValueError(f"{fn!r}: not a valid safetensors file ({type(e).__name__}: {e})") from e
    return out
