"""Load a GGUF file keeping its quantized blocks as they are.

Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q5_K / Q6_K tensors become QTensors over the file's own
bytes (our formats are byte-identical to ggml's), TQ1_0 / TQ2_0 become ``ternary`` QTensors, float and integer tensors
keep their dtype (F32/F16/BF16/F64, I8/I16/I32/I64), and any other ggml type that the ``gguf``
package can decode is dequantized to float32 (listed in ``GGUFCheckpoint.dequantized`` so it is
never silent). A type nothing here can read raises ``ValueError`` naming the tensor and the type.

The file is read through our own bounds-checked header walker rather than ``gguf.GGUFReader``:
that reader builds numpy objects for every metadata item (millions for a tokenizer array, so an
8 MB file of empty strings took minutes and gigabytes) and trusts counts and offsets. Here the
cost of a load is one pass over the header (a few instructions per item, nothing kept per array
element) plus the tensor bytes themselves:

* the file is memory-mapped privately (copy-on-write); packed tensors are views of that map, not
  copies, so their pages are read from the page cache on first use and shared with it;
* metadata values are decoded from the map only when asked for (``ckpt.metadata[key]``), so
  tokenizer arrays cost nothing unless used;
* every count, length, type, offset and size is checked against the file before it is used;
  tensors must lie inside the data section, be aligned, and not overlap one another.
"""
from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Mapping
from typing import Any, Iterator, Union

import numpy as np
import torch

from ..formats import table as format_table
from ..qtensor import QTensor

__all__ = ["GGUFCheckpoint", "GGUFMetadata", "load_gguf", "scan_gguf_header"]

_STRING, _ARRAY = 8, 9
# GGUF metadata value types -> struct code of the fixed-size ones (strings and arrays vary).
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_SCALAR_BYTES = {t: struct.calcsize("<" + c) for t, c in _SCALAR.items()}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8",
          11: "<i8", 12: "<f8"}
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MIN_TENSOR_INFO = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one dim, type, offset
_MIN_KV = 8 + 4 + 1                   # key length, value type, a one-byte value
_NATIVE = {f.gguf_type: f.name for f in format_table.TABLE if f.gguf_type}
_TERNARY = ("TQ1_0", "TQ2_0")
# Types kept as plain tensors of their own dtype (viewed from the map, not converted).
_PLAIN = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
          "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64}
# n_dims -> the dims, type and offset that follow it in a tensor info.
_TENSOR_TAIL = {n: struct.Struct(f"<{n}QIQ") for n in range(1, _MAX_DIMS + 1)}
_U32 = struct.Struct("<I").unpack_from
_U64 = struct.Struct("<Q").unpack_from

Weight = Union[QTensor, torch.Tensor]


def _ggml_types() -> dict[int, tuple[str, int, int]]:
    """ggml type id -> (name, weights per block, bytes per block), from the ``gguf`` package."""
    import gguf

    return {int(t): (t.name, *gguf.GGML_QUANT_SIZES[t]) for t in gguf.GGMLQuantizationType
            if t in gguf.GGML_QUANT_SIZES}


class _Cursor:
    """Position in a buffer of known size; every read checks the bytes left first."""

    __slots__ = ("buf", "end", "pos", "what")

    def __init__(self, buf, end: int, what: str):
        self.buf, self.end, self.pos, self.what = buf, end, 0, what

    def fail(self, msg: str) -> ValueError:
        return ValueError(f"{self.what}: {msg} (at byte {self.pos})")

    def need(self, n: int, field: str) -> None:
        if n > self.end - self.pos:
            raise self.fail(f"{field} needs {n} bytes but only {self.end - self.pos} remain "
                            "(truncated or corrupt file)")

    def u32(self, field: str) -> int:
        self.need(4, field)
        (v,) = _U32(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, field: str) -> int:
        self.need(8, field)
        (v,) = _U64(self.buf, self.pos)
        self.pos += 8
        return v

    def count(self, field: str, min_item_bytes: int) -> int:
        """A uint64 count, checked to leave room for that many items of at least min_item_bytes."""
        n = self.u64(field)
        if n * min_item_bytes > self.end - self.pos:
            raise self.fail(f"{field} = {n} cannot fit in the {self.end - self.pos} bytes left")
        return n

    def string(self, field: str) -> str:
        n = self.u64(f"{field} length")
        self.need(n, field)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{field} is not valid UTF-8") from None

    def skip_strings(self, n: int, field: str) -> None:
        """Skip n strings: the only per-item loop of the header walk, so kept to its minimum."""
        buf, pos, last = self.buf, self.pos, self.end - 8
        for _ in range(n):
            if pos > last:
                break
            pos += 8 + _U64(buf, pos)[0]
        else:
            if pos <= self.end:
                self.pos = pos
                return
        self.pos = min(pos, self.end)
        raise self.fail(f"{field}: array of {n} strings runs past the end of the file")

    def skip_value(self, vtype: int, field: str, depth: int = 0) -> None:
        if vtype in _SCALAR_BYTES:
            self.need(_SCALAR_BYTES[vtype], field)
            self.pos += _SCALAR_BYTES[vtype]
        elif vtype == _STRING:
            n = self.u64(f"{field} string length")
            self.need(n, field)
            self.pos += n
        elif vtype == _ARRAY:
            if depth > 1:
                raise self.fail(f"{field}: arrays nested deeper than 2 levels")
            etype = self.u32(f"{field} array type")
            if etype in _SCALAR_BYTES:
                n = self.count(f"{field} array length", _SCALAR_BYTES[etype])
                self.pos += n * _SCALAR_BYTES[etype]
            elif etype == _STRING:
                self.skip_strings(self.count(f"{field} array length", 8), field)
            elif etype == _ARRAY:
                for _ in range(self.count(f"{field} array length", 12)):
                    self.skip_value(_ARRAY, field, depth + 1)
            else:
                raise self.fail(f"{field}: unknown array element type {etype}")
        else:
            raise self.fail(f"{field}: unknown value type {vtype}")


def _decode_value(c: _Cursor, vtype: int, key: str) -> Any:
    """The value at c.pos (already bounds-checked by the header walk) as a Python object."""
    if vtype in _SCALAR:
        v = struct.unpack_from("<" + _SCALAR[vtype], c.buf, c.pos)[0]
        c.pos += _SCALAR_BYTES[vtype]
        return v
    if vtype == _STRING:
        try:
            return c.string(f"metadata {key!r}")
        except ValueError as e:
            raise ValueError(f"metadata {key!r} cannot be decoded: {e}") from None
    etype, n = _U32(c.buf, c.pos)[0], _U64(c.buf, c.pos + 4)[0]
    c.pos += 12
    if etype in _NUMPY:
        a = np.frombuffer(c.buf, dtype=_NUMPY[etype], count=n, offset=c.pos)
        c.pos += a.nbytes
        return a.tolist()
    return [_decode_value(c, etype, key) for _ in range(n)]


class GGUFMetadata(Mapping):
    """The key/value metadata of a GGUF file, decoded from the file's memory map on access.

    ``metadata[key]`` returns ints, floats, bools, strs and lists of them, as the ``gguf``
    package's ``contents()`` does; nothing is decoded until asked for and nothing is cached, so a
    50,000-entry tokenizer array costs nothing unless read (bind it to a name if you need it
    repeatedly). Keys iterate in file order.
    """

    def __init__(self, buf, end: int, positions: dict[str, int], what: str):
        self._buf, self._end, self._pos, self._what = buf, end, positions, what

    def __getitem__(self, key: str) -> Any:
        pos = self._pos[key]  # of the value type field
        c = _Cursor(self._buf, self._end, self._what)
        c.pos = pos + 4
        return _decode_value(c, _U32(self._buf, pos)[0], key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._pos)

    def __len__(self) -> int:
        return len(self._pos)

    def __contains__(self, key: object) -> bool:
        return key in self._pos

    def __repr__(self) -> str:
        return f"GGUFMetadata({len(self)} keys)"


class GGUFCheckpoint(Mapping):
    """Tensors of a GGUF file by name, plus its metadata.

    Values are QTensors (shape ``(N, K)``, the file's blocks untouched) or plain tensors in
    PyTorch's dim order (GGUF lists dims innermost first; they are reversed here).

    Attributes:
        path: the file.
        metadata: a :class:`GGUFMetadata` (a read-only Mapping, values decoded on access).
        ggml_types: tensor name -> ggml type name as stored (``"Q4_1"``, ``"F32"``, ...).
        dequantized: names of tensors whose ggml type had to be expanded to float32.
        raw_tensor_info: tensor name -> ``{dims, type, offset, nbytes}`` as stored (dims innermost
            first, offset from the start of the data section).
    """

    def __init__(self, path: str, tensors: dict[str, Weight], metadata: Mapping[str, Any],
                 ggml_types: dict[str, str], dequantized: list[str],
                 raw_tensor_info: dict[str, dict] | None = None):
        self.path = path
        self.tensors = tensors
        self.metadata = metadata
        self.ggml_types = ggml_types
        self.dequantized = dequantized
        self.raw_tensor_info = raw_tensor_info or {}

    def __getitem__(self, name: str) -> Weight:
        return self.tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def tokenizer_metadata(self) -> dict[str, Any]:
        """Every ``tokenizer.*`` metadata value, decoded now (the vocabulary arrays included)."""
        return {k: self.metadata[k] for k in self.metadata if k.startswith("tokenizer.")}

    def __repr__(self) -> str:
        kinds: dict[str, int] = {}
        for t in self.ggml_types.values():
            kinds[t] = kinds.get(t, 0) + 1
        return (f"GGUFCheckpoint({os.path.basename(self.path)!r}, arch={self.architecture!r}, "
                f"{len(self)} tensors {kinds})")


def _walk_header(buf, end: int, what: str) -> tuple[dict[str, int], list[dict], int]:
    """Check the whole header against the buffer: (metadata value positions, tensor infos, data start).

    Tensor infos are ``{name, dims, type, offset, nbytes}`` with ``offset`` relative to the data
    section; every tensor lies inside the buffer, is aligned and overlaps no other one.
    """
    c = _Cursor(buf, end, what)
    c.need(4, "magic")
    magic = bytes(buf[0:4])
    if magic != b"GGUF":
        raise c.fail(f"bad magic {magic!r}, expected b'GGUF'")
    c.pos = 4
    version = c.u32("version")
    if version not in (2, 3):
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        hint = " (a big-endian file, not supported)" if swapped in (2, 3) else ""
        raise c.fail(f"unsupported GGUF version {version}{hint}; expected 2 or 3")
    n_tensors = c.count("tensor_count", _MIN_TENSOR_INFO)
    n_kv = c.count("kv_count", _MIN_KV)
    positions: dict[str, int] = {}
    alignment = 32
    buf, end_ = c.buf, c.end
    for i in range(n_kv):
        # A file may hold ~300,000 keys: the common case (a valid key and a scalar value) is read
        # with as few Python calls as possible; anything else goes through the checked readers.
        pos = c.pos
        if pos + 8 <= end_:
            n = _U64(buf, pos)[0]
            if n <= end_ - pos - 12:
                try:
                    key = bytes(buf[pos + 8:pos + 8 + n]).decode("utf-8")
                except UnicodeDecodeError:
                    key = None
                if key is not None and key not in positions and key != "general.alignment":
                    size = _SCALAR_BYTES.get(_U32(buf, pos + 8 + n)[0])
                    if size is not None and pos + 12 + n + size <= end_:
                        positions[key] = pos + 8 + n
                        c.pos = pos + 12 + n + size
                        continue
        key = c.string(f"metadata key #{i}")
        if key in positions:
            raise c.fail(f"duplicate metadata key {key!r}")
        positions[key] = c.pos
        vtype = c.u32(f"type of {key!r}")
        if key == "general.alignment":
            if vtype != 4:
                raise c.fail("general.alignment must be a uint32")
            alignment = c.u32(key)
            if alignment <= 0 or alignment & (alignment - 1):
                raise c.fail(f"general.alignment = {alignment} is not a power of two")
        else:
            c.skip_value(vtype, f"metadata {key!r}")
    types = _ggml_types()
    infos = []
    names = set()
    for i in range(n_tensors):
        # The fields after the name are read with one struct per dim count: a file may hold
        # ~100,000 tensor infos, so this loop does as few Python calls per tensor as it can.
        pos = c.pos
        name = None
        if pos + 8 <= end_:
            n = _U64(buf, pos)[0]
            if n <= end_ - pos - 12:
                try:
                    name = bytes(buf[pos + 8:pos + 8 + n]).decode("utf-8")
                    c.pos = pos + 8 + n
                except UnicodeDecodeError:
                    pass
        if name is None:
            name = c.string(f"tensor #{i} name")
        if name in names:
            raise c.fail(f"duplicate tensor name {name!r}")
        names.add(name)
        n_dims = c.u32(f"{name!r} n_dims")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise c.fail(f"tensor {name!r} has {n_dims} dims, expected 1..{_MAX_DIMS}")
        fields = _TENSOR_TAIL[n_dims]
        if fields.size > end_ - c.pos:
            c.need(fields.size, f"{name!r} dims, type and offset")
        *dims, ttype, offset = fields.unpack_from(buf, c.pos)
        c.pos += fields.size
        if ttype not in types:
            raise c.fail(f"tensor {name!r} has unknown ggml type {ttype}")
        tname, block, type_bytes = types[ttype]
        if 0 in dims:
            raise c.fail(f"tensor {name!r} has a zero dim {dims}")
        if dims[0] % block:
            raise c.fail(f"tensor {name!r}: innermost dim {dims[0]} is not a multiple of "
                         f"{tname}'s block size {block}")
        n_el = dims[0]
        for d in dims[1:]:
            n_el *= d
        infos.append(dict(name=name, dims=dims, type=tname, offset=offset, nbytes=n_el // block * type_bytes))
    data_start = -(-c.pos // alignment) * alignment
    data_size = max(end - data_start, 0)
    prev = None
    for t in sorted(infos, key=lambda t: t["offset"]):
        if t["offset"] % alignment:
            raise ValueError(f"{what}: tensor {t['name']!r} offset {t['offset']} is not aligned to {alignment}")
        if t["offset"] + t["nbytes"] > data_size:
            raise ValueError(f"{what}: tensor {t['name']!r} needs bytes {t['offset']}..{t['offset'] + t['nbytes']} "
                             f"of the data section but the file holds only {data_size} "
                             "(truncated or corrupt file)")
        if prev is not None and t["offset"] < prev["offset"] + prev["nbytes"]:
            raise ValueError(f"{what}: tensors {prev['name']!r} (bytes {prev['offset']}.."
                             f"{prev['offset'] + prev['nbytes']}) and {t['name']!r} (bytes {t['offset']}.."
                             f"{t['offset'] + t['nbytes']}) overlap")
        prev = t
    return positions, infos, data_start


def scan_gguf_header(buf: memoryview | bytes, what: str = "GGUF file") -> list[dict]:
    """Walk a GGUF header and check every count, size and offset against the buffer length.

    Returns ``[{name, dims, type, offset, nbytes}]`` (offsets relative to the data section);
    raises ValueError on anything inconsistent, overlapping tensors included.
    """
    return _walk_header(buf, len(buf), what)[1]


def _map(path: str, what: str) -> mmap.mmap:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise ValueError(f"{what}: the file is empty")
        # Private, copy-on-write: tensors viewing the map may be written to, and no write ever
        # reaches the file.
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)


def _convert(mm: mmap.mmap, start: int, info: dict) -> Weight:
    """One tensor: a view of the map where the bytes are used as they are, else a conversion."""
    import gguf
    from ..interop import from_gguf_ternary

    dims, ggml_type, nbytes = info["dims"], info["type"], info["nbytes"]
    K = dims[0]
    N = int(np.prod(dims[1:], dtype=object)) if len(dims) > 1 else 1
    torch_shape = tuple(reversed(dims))
    if ggml_type in _PLAIN:
        dtype = _PLAIN[ggml_type]
        if start % dtype.itemsize == 0:
            return torch.frombuffer(mm, dtype=dtype, count=nbytes // dtype.itemsize, offset=start).view(torch_shape)
        # An alignment below the element size (general.alignment = 1 or 2): copy into aligned memory.
        raw = torch.frombuffer(mm, dtype=torch.uint8, count=nbytes, offset=start)
        return raw.clone().view(dtype).view(torch_shape)
    raw = torch.frombuffer(mm, dtype=torch.uint8, count=nbytes, offset=start)
    if ggml_type in _NATIVE:
        # The map is private to this checkpoint, so the view is owned as from_bytes would own a copy.
        return QTensor._validated(raw, _NATIVE[ggml_type], (N, K))
    if ggml_type in _TERNARY:
        return from_gguf_ternary(raw, ggml_type, (N, K))
    qtype = gguf.GGMLQuantizationType[ggml_type]
    try:
        with np.errstate(all="ignore"):  # non-finite scales decode to NaN/Inf, as the file says
            deq = gguf.quants.dequantize(raw.numpy(), qtype)
    except NotImplementedError:
        raise ValueError(f"ggml type {ggml_type} is not supported (neither kept packed nor decodable "
                         "by the gguf package)") from None
    return torch.from_numpy(np.ascontiguousarray(deq, dtype=np.float32)).reshape(torch_shape)


def load_gguf(path: str | os.PathLike) -> GGUFCheckpoint:
    """Read every tensor of a GGUF file (see the module docstring for what each type becomes).

    Time and memory are bounded by the tensor bytes: packed and plain tensors are views of a
    private copy-on-write memory map of the file (writes to them stay in this process; do not
    truncate or rewrite the file while they are in use), and metadata is decoded on access
    (:class:`GGUFMetadata`; :meth:`GGUFCheckpoint.tokenizer_metadata` decodes the tokenizer).

    Raises ValueError for a malformed, truncated or corrupt file (naming the field at fault),
    overlapping or out-of-file tensor ranges, and a tensor of a ggml type that can be neither
    kept nor decoded (naming the tensor and the type).
    """
    path = os.fspath(path)
    what = f"GGUF file {path!r}"
    mm = _map(path, what)
    positions, infos, data_start = _walk_header(mm, len(mm), what)
    tensors: dict[str, Weight] = {}
    types: dict[str, str] = {}
    dequantized: list[str] = []
    for info in infos:
        name = info["name"]
        try:
            tensors[name] = _convert(mm, data_start + info["offset"], info)
        except ValueError as e:
            raise ValueError(f"{what}: tensor {name!r} ({info['type']}): {e}") from e
        types[name] = info["type"]
        if info["type"] not in _NATIVE and info["type"] not in _TERNARY and info["type"] not in _PLAIN:
            dequantized.append(name)
    raw_info = {t["name"]: {k: t[k] for k in ("dims", "type", "offset", "nbytes")} for t in infos}
    return GGUFCheckpoint(path, tensors, GGUFMetadata(mm, len(mm), positions, what), types, dequantized,
                          raw_info)
