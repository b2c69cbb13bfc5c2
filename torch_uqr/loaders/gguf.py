"""Load a GGUF file keeping its quantized blocks as they are.

Q4_0 / Q4_1 / Q8_0 / Q4_K tensors become QTensors over the file's own bytes (our formats are
byte-identical to ggml's), TQ1_0 / TQ2_0 become ``ternary`` QTensors, float tensors stay float,
and any other ggml type is dequantized to float32 by the ``gguf`` package (listed in
``GGUFCheckpoint.dequantized`` so it is never silent).

The header is walked once by a bounds-checked scanner before the ``gguf`` package parses it:
the package trusts counts and offsets, so a corrupt count could otherwise make it loop for hours
or read past the end.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Iterator, Union

import numpy as np
import torch

from ..formats import table as format_table
from ..qtensor import QTensor
from ._checks import BoundedReader

# GGUF metadata value types -> fixed size in bytes (strings and arrays are variable).
_FIXED_VALUE_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 4  # GGML_MAX_DIMS
_NATIVE = {f.gguf_type: f.name for f in format_table.TABLE if f.gguf_type}
_TERNARY = ("TQ1_0", "TQ2_0")
_FLOAT = {"F32": torch.float32, "F16": torch.float16, "F64": torch.float64}

Weight = Union[QTensor, torch.Tensor]


class GGUFCheckpoint(Mapping):
    """Tensors of a GGUF file by name, plus its metadata.

    Values are QTensors (shape ``(N, K)``, the file's blocks untouched) or float tensors in
    PyTorch's dim order (GGUF lists dims innermost first; they are reversed here).
    """

    def __init__(self, path: str, tensors: dict[str, Weight], metadata: dict[str, Any],
                 ggml_types: dict[str, str], dequantized: list[str]):
        self.path = path
        self.tensors = tensors
        self.metadata = metadata
        self.ggml_types = ggml_types
        self.dequantized = dequantized

    def __getitem__(self, name: str) -> Weight:
        return self.tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def __repr__(self) -> str:
        kinds: dict[str, int] = {}
        for t in self.ggml_types.values():
            kinds[t] = kinds.get(t, 0) + 1
        return (f"GGUFCheckpoint({os.path.basename(self.path)!r}, arch={self.architecture!r}, "
                f"{len(self)} tensors {kinds})")


def _skip_value(r: BoundedReader, vtype: int, field: str, depth: int = 0) -> None:
    if vtype in _FIXED_VALUE_BYTES:
        r.skip(_FIXED_VALUE_BYTES[vtype], field)
    elif vtype == _STRING:
        r.skip(r.count("Q", f"{field} string length", 1), field)
    elif vtype == _ARRAY:
        if depth > 1:
            raise r.fail(f"{field}: arrays nested deeper than 2 levels")
        etype = r.unpack("I", f"{field} array type")
        if etype in _FIXED_VALUE_BYTES:
            n = r.count("Q", f"{field} array length", _FIXED_VALUE_BYTES[etype])
            r.skip(n * _FIXED_VALUE_BYTES[etype], field)
        elif etype in (_STRING, _ARRAY):
            n = r.count("Q", f"{field} array length", 8 if etype == _STRING else 12)
            for _ in range(n):
                _skip_value(r, etype, field, depth + 1)
        else:
            raise r.fail(f"{field}: unknown array element type {etype}")
    else:
        raise r.fail(f"{field}: unknown value type {vtype}")


def _read_string(r: BoundedReader, field: str) -> str:
    raw = r.take(r.count("Q", f"{field} length", 1), field)
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as e:
        raise r.fail(f"{field} is not valid UTF-8") from e


def scan_gguf_header(buf: memoryview | bytes, what: str = "GGUF file") -> list[dict]:
    """Walk a GGUF header and check every count, size and offset against the buffer length.

    Returns ``[{name, dims, type, offset, nbytes}]``; raises ValueError on anything inconsistent.
    """
    import gguf

    r = BoundedReader(buf, what)
    magic = bytes(r.take(4, "magic"))
    if magic != b"GGUF":
        raise r.fail(f"bad magic {magic!r}, expected b'GGUF'")
    version = r.unpack("I", "version")
    if version not in (2, 3):
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        hint = " (a big-endian file, not supported)" if swapped in (2, 3) else ""
        raise r.fail(f"unsupported GGUF version {version}{hint}; expected 2 or 3")
    n_tensors = r.count("Q", "tensor_count", 24)
    n_kv = r.count("Q", "kv_count", 13)
    alignment = 32
    for i in range(n_kv):
        key = _read_string(r, f"metadata key #{i}")
        vtype = r.unpack("I", f"type of {key!r}")
        if key == "general.alignment":
            if vtype != 4:
                raise r.fail("general.alignment must be a uint32")
            alignment = r.unpack("I", key)
            if alignment <= 0 or alignment & (alignment - 1):
                raise r.fail(f"general.alignment = {alignment} is not a power of two")
        else:
            _skip_value(r, vtype, f"metadata {key!r}")
    infos = []
    for i in range(n_tensors):
        name = _read_string(r, f"tensor #{i} name")
        n_dims = r.unpack("I", f"{name!r} n_dims")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise r.fail(f"tensor {name!r} has {n_dims} dims, expected 1..{_MAX_DIMS}")
        dims = [r.unpack("Q", f"{name!r} dim") for _ in range(n_dims)]
        ttype = r.unpack("I", f"{name!r} type")
        offset = r.unpack("Q", f"{name!r} offset")
        try:
            qtype = gguf.GGMLQuantizationType(ttype)
            block, type_bytes = gguf.GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise r.fail(f"tensor {name!r} has unknown ggml type {ttype}") from None
        n_el = 1
        for d in dims:
            if d == 0:
                raise r.fail(f"tensor {name!r} has a zero dim {dims}")
            n_el *= d
        if dims[0] % block:
            raise r.fail(f"tensor {name!r}: innermost dim {dims[0]} is not a multiple of "
                         f"{qtype.name}'s block size {block}")
        infos.append(dict(name=name, dims=dims, type=qtype.name, offset=offset,
                          nbytes=n_el // block * type_bytes))
    data_start = -(-r.pos // alignment) * alignment
    data_size = len(r.buf) - data_start
    seen = set()
    for t in infos:
        if t["name"] in seen:
            raise ValueError(f"{what}: duplicate tensor name {t['name']!r}")
        seen.add(t["name"])
        if t["offset"] % alignment:
            raise ValueError(f"{what}: tensor {t['name']!r} offset {t['offset']} is not aligned to {alignment}")
        if t["offset"] + t["nbytes"] > data_size:
            raise ValueError(f"{what}: tensor {t['name']!r} needs bytes {t['offset']}..{t['offset'] + t['nbytes']} "
                             f"of the data section but the file holds only {max(data_size, 0)} "
                             "(truncated or corrupt file)")
    return infos


def _metadata(reader) -> dict[str, Any]:
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            out[key] = field.contents()
        except (ValueError, IndexError, UnicodeDecodeError) as e:
            raise ValueError(f"metadata {key!r} cannot be decoded: {e}") from e
    return out


def _convert(name: str, dims: list[int], ggml_type: str, raw: np.ndarray) -> Weight:
    import gguf
    from ..interop import from_gguf_ternary

    K = dims[0]
    N = int(np.prod(dims[1:])) if len(dims) > 1 else 1
    torch_shape = tuple(reversed(dims))
    if ggml_type in _NATIVE:
        data = torch.from_numpy(np.array(raw, dtype=np.uint8).reshape(N, -1))
        return QTensor.from_bytes(data, _NATIVE[ggml_type], (N, K))
    if ggml_type in _TERNARY:
        return from_gguf_ternary(np.array(raw, dtype=np.uint8).tobytes(), ggml_type, (N, K))
    if ggml_type in _FLOAT:
        return torch.from_numpy(np.array(raw)).reshape(torch_shape).to(_FLOAT[ggml_type])
    if ggml_type == "BF16":
        bits = np.array(raw).view(np.uint16).astype(np.int32) << 16
        return torch.from_numpy(bits.view(np.float32)).reshape(torch_shape).to(torch.bfloat16)
    deq = gguf.quants.dequantize(np.array(raw), gguf.GGMLQuantizationType[ggml_type])
    return torch.from_numpy(np.ascontiguousarray(deq, dtype=np.float32)).reshape(torch_shape)


def load_gguf(path: str | os.PathLike) -> GGUFCheckpoint:
    """Read every tensor of a GGUF file (see the module docstring for what each type becomes).

    Raises ValueError for a malformed, truncated or corrupt file, naming the field at fault.
    """
    import gguf

    path = os.fspath(path)
    what = f"GGUF file {path!r}"
    with open(path, "rb") as f:
        buf = f.read()
    infos = scan_gguf_header(buf, what)
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # the scan should have caught it; keep the promise of a ValueError
        raise ValueError(f"{what}: the gguf package could not parse it: {e}") from e
    metadata = _metadata(reader)
    by_name = {t.name: t for t in reader.tensors}
    tensors: dict[str, Weight] = {}
    types: dict[str, str] = {}
    dequantized: list[str] = []
    for info in infos:
        name = info["name"]
        if name not in by_name:
            raise ValueError(f"{what}: tensor {name!r} missing from the gguf package's view")
        try:
            tensors[name] = _convert(name, info["dims"], info["type"], by_name[name].data)
        except ValueError as e:
            raise ValueError(f"{what}: tensor {name!r} ({info['type']}): {e}") from e
        types[name] = info["type"]
        if info["type"] not in _NATIVE and info["type"] not in _TERNARY and info["type"] not in _FLOAT \
                and info["type"] != "BF16":
            dequantized.append(name)
    return GGUFCheckpoint(path, tensors, metadata, types, dequantized)
