"""load_gguf on small synthetic GGUF files: values, bounded cost on pathological files, and fuzzing
(truncation, bit flips, typed mutations of counts, lengths, types and offsets)."""
import os
import random
import struct
import time
import tracemalloc

import gguf
import numpy as np
import pytest
import torch

import torch_uqr
from torch_uqr.loaders.gguf import scan_gguf_header
from tiny_gguf_models import nvfp4_blocks

T = gguf.GGMLQuantizationType


def _random_blocks(rng, qtype, n_rows, k):
    """Random bytes for `qtype` with every fp16 scale field set to a finite value."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_rows, k // block, size), dtype=np.uint8)
    halves = {T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (size - 2,)}[qtype]
    for off in halves:
        raw[..., off:off + 2] = np.float16(rng.uniform(0.001, 0.01, raw.shape[:2])).view(np.uint8).reshape(
            *raw.shape[:2], 2)
    return raw.reshape(n_rows, -1)


def write_gguf(path, seed=0):
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_string("general.name", "tiny")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    floats = {}
    for name, qtype, shape in [("q40", T.Q4_0, (5, 64)), ("q41", T.Q4_1, (3, 96)), ("q80", T.Q8_0, (4, 32)),
                               ("q50", T.Q5_0, (3, 64)), ("q51", T.Q5_1, (2, 96)),
                               ("tq1", T.TQ1_0, (3, 256)), ("tq2", T.TQ2_0, (2, 256))]:
        f = rng.standard_normal(shape).astype(np.float32)
        w.add_tensor(name, gguf.quants.quantize(f, qtype), raw_dtype=qtype)
    for name, qtype, shape in [("q4k", T.Q4_K, (3, 256)), ("q6k", T.Q6_K, (2, 512)), ("q5k", T.Q5_K, (2, 256))]:
        w.add_tensor(name, _random_blocks(rng, qtype, *shape), raw_dtype=qtype)
    w.add_tensor("nvfp4", nvfp4_blocks((2, 128)), raw_dtype=T.NVFP4)  # a type with no packed format here
    floats["norm"] = rng.standard_normal(7).astype(np.float32)
    floats["f16"] = rng.standard_normal((3, 5)).astype(np.float16)
    _write_all(w, floats)
    return floats


def _write_all(w, arrays):
    """Add plain numpy ``arrays`` to GGUFWriter ``w`` and write the file."""
    for name, arr in arrays.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    floats = write_gguf(path)
    return path, floats


def test_values_match_the_gguf_package(tiny_gguf):
    path, floats = tiny_gguf
    ck = torch_uqr.load_gguf(path)
    reader = gguf.GGUFReader(str(path))
    native = {"q40": "q4_0", "q41": "q4_1", "q80": "q8_0", "q4k": "q4_k", "q50": "q5_0", "q51": "q5_1",
              "q6k": "q6_k", "q5k": "q5_k", "tq1": "ternary", "tq2": "ternary"}
    for t in reader.tensors:
        got = ck[t.name]
        expect = gguf.quants.dequantize(t.data, t.tensor_type)
        if t.name in native:
            assert isinstance(got, torch_uqr.QTensor) and got.fmt == native[t.name]
            assert got.shape == tuple(reversed([int(d) for d in t.shape]))
            if not t.name.startswith("tq"):  # ternary is repacked into 32-weight blocks
                assert np.array_equal(got.data.numpy(), np.asarray(t.data))  # bytes untouched
            assert torch.equal(torch_uqr.dequantize(got), torch.from_numpy(expect.astype(np.float32)))
        else:
            assert isinstance(got, torch.Tensor)
            assert np.array_equal(got.float().numpy(), expect.astype(np.float32).reshape(got.shape))
    assert ck.dequantized == ["nvfp4"]  # the one non-native quantized type is listed, not silent
    assert ck["f16"].dtype == torch.float16 and ck["f16"].shape == (3, 5)
    assert ck.metadata["general.name"] == "tiny" and ck.metadata["tokenizer.ggml.tokens"] == ["a", "b", "c"]
    assert ck.architecture == "llama"


def _load_outcome(path):
    try:
        return torch_uqr.load_gguf(path)
    except ValueError as e:
        assert str(e)  # a message, naming the file
        return None


def test_truncated_files_raise_value_error(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    data = path.read_bytes()
    bad = tmp_path / "cut.gguf"
    cuts = sorted(set(list(range(0, 64)) + list(range(64, len(data), max(1, len(data) // 60)))))
    for cut in cuts:
        bad.write_bytes(data[:cut])
        with pytest.raises(ValueError):
            torch_uqr.load_gguf(bad)


def test_bit_flips_load_or_raise_value_error(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    data = bytearray(path.read_bytes())
    rng = random.Random(1234)
    bad = tmp_path / "flip.gguf"
    outcomes = {"ok": 0, "error": 0}
    for i in range(250):
        b = bytearray(data)
        # most flips land in the header, where counts and offsets live
        pos = rng.randrange(0, 400) if i % 4 else rng.randrange(len(b))
        b[pos] ^= 1 << rng.randrange(8)
        bad.write_bytes(bytes(b))
        outcomes["ok" if _load_outcome(bad) is not None else "error"] += 1
    assert outcomes["error"] > 20 and outcomes["ok"] > 5, outcomes


def test_huge_counts_are_refused_before_allocating(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    data = bytearray(path.read_bytes())
    for off in (8, 16):  # tensor_count, kv_count
        b = bytearray(data)
        b[off:off + 8] = (2**62).to_bytes(8, "little")
        bad = tmp_path / f"huge{off}.gguf"
        bad.write_bytes(bytes(b))
        with pytest.raises(ValueError, match="cannot fit"):
            torch_uqr.load_gguf(bad)


def test_bad_magic_and_version(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGML" + bytes(60))
    with pytest.raises(ValueError, match="magic"):
        torch_uqr.load_gguf(bad)
    bad.write_bytes(b"GGUF" + (7).to_bytes(4, "little") + bytes(60))
    with pytest.raises(ValueError, match="version 7"):
        torch_uqr.load_gguf(bad)


# ---- hand-built files: pathological sizes, integer tensors, unsupported types, bad ranges ------------

def _s(b):
    return struct.pack("<Q", len(b)) + b


def _kv(key, vtype, payload):
    return _s(key) + struct.pack("<I", vtype) + payload


def _tinfo(name, dims, ttype, offset):
    return (_s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<IQ", ttype, offset))


def _gguf(kvs, tinfos, data, alignment=32):
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tinfos), len(kvs)) + b"".join(kvs) + b"".join(tinfos)
    return head + bytes(-len(head) % alignment) + data


_ARCH = _kv(b"general.architecture", 8, _s(b"llama"))
_Q40_BLOCK = struct.pack("<e", 0.5) + bytes(range(16))  # one valid q4_0 block


def _write(tmp_path, name, data):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _timed_load(path):
    # CPU time of the process, not wall time: a bound on the work done, which other jobs on a
    # shared machine cannot stretch.
    t = time.process_time()
    try:
        out = torch_uqr.load_gguf(path)
    except ValueError as e:
        out = e
    return out, time.process_time() - t


# Generous: these take well under a second of CPU, and minutes with a reader that materializes
# every metadata item or tensor info.
_BOUND_S = 5.0


def test_a_million_empty_strings_cost_nothing_until_read(tmp_path):
    n = 1_000_000
    arr = _kv(b"tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, n) + bytes(8 * n))
    path = _write(tmp_path, "strings.gguf", _gguf([_ARCH, arr], [_tinfo(b"w", [32, 1], 2, 0)], _Q40_BLOCK))
    ck, dt = _timed_load(path)
    assert isinstance(ck, torch_uqr.loaders.GGUFCheckpoint), ck
    assert dt < _BOUND_S, dt
    tracemalloc.start()  # (slows the header walk down several times, so not timed)
    try:
        torch_uqr.load_gguf(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10e6, peak  # nothing is kept per array item
    assert ck.architecture == "llama" and len(ck.metadata) == 2
    tokens = ck.metadata["tokenizer.ggml.tokens"]  # decoded on access only
    assert len(tokens) == n and tokens[0] == "" and tokens[-1] == ""


def test_many_metadata_keys_load_in_bounded_time(tmp_path):
    n = 300_000
    kvs = [_ARCH] + [_kv(b"k%d" % i, 0, bytes([i & 255])) for i in range(n)]
    path = _write(tmp_path, "keys.gguf", _gguf(kvs, [_tinfo(b"w", [32, 1], 2, 0)], _Q40_BLOCK))
    ck, dt = _timed_load(path)
    assert isinstance(ck, torch_uqr.loaders.GGUFCheckpoint), ck
    assert dt < _BOUND_S, dt
    assert len(ck.metadata) == n + 1 and ck.metadata["k258"] == 2


def test_duplicate_metadata_keys_are_refused(tmp_path):
    kvs = [_ARCH] + [_kv(b"a", 0, b"\x01")] * 2
    path = _write(tmp_path, "dup.gguf", _gguf(kvs, [], b""))
    with pytest.raises(ValueError, match="duplicate metadata key 'a'"):
        torch_uqr.load_gguf(path)


def test_tensors_sharing_one_block_are_refused_quickly(tmp_path):
    n = 100_000
    tinfos = [_tinfo(b"t%d" % i, [32, 1], 2, 0) for i in range(n)]
    path = _write(tmp_path, "shared.gguf", _gguf([_ARCH], tinfos, _Q40_BLOCK))
    err, dt = _timed_load(path)
    assert isinstance(err, ValueError) and "overlap" in str(err), err
    assert dt < _BOUND_S, dt


@pytest.mark.parametrize("offsets,data,match", [
    ((0, 0), _Q40_BLOCK * 2, "overlap"),             # the same block twice
    ((0, 32), _Q40_BLOCK, "needs bytes 32..50"),      # second tensor past the end of the file
    ((0, 1 << 62), _Q40_BLOCK, "needs bytes"),        # absurd offset
    ((0, 16), _Q40_BLOCK * 2, "not aligned"),         # misaligned
])
def test_bad_tensor_ranges_are_refused(tmp_path, offsets, data, match):
    tinfos = [_tinfo(b"a", [32, 1], 2, offsets[0]), _tinfo(b"b", [32, 1], 2, offsets[1])]
    path = _write(tmp_path, "ranges.gguf", _gguf([_ARCH], tinfos, data))
    with pytest.raises(ValueError, match=match):
        torch_uqr.load_gguf(path)


def test_integer_and_float_tensors_keep_their_dtype(tmp_path):
    rng = np.random.default_rng(3)
    arrays = {"i8": rng.integers(-128, 128, (3, 5), dtype=np.int8),
              "i16": rng.integers(-2**15, 2**15, (4,), dtype=np.int16),
              "i32": rng.integers(-2**31, 2**31, (2, 3), dtype=np.int32),
              "i64": rng.integers(-2**62, 2**62, (2, 2, 2), dtype=np.int64),
              "f64": rng.standard_normal((3, 2)),
              "f32": rng.standard_normal(7).astype(np.float32)}
    _write_all(gguf.GGUFWriter(str(tmp_path / "ints.gguf"), "llama"), arrays)
    ck = torch_uqr.load_gguf(tmp_path / "ints.gguf")
    for name, a in arrays.items():
        got = ck[name]
        assert got.dtype == torch.from_numpy(a).dtype, name
        assert np.array_equal(got.numpy(), a), name
    assert ck.ggml_types["i8"] == "I8" and ck.dequantized == []


def test_unsupported_ggml_types_name_the_tensor_and_type(tmp_path):
    # Q8_K is a legal ggml type that neither this package nor gguf can decode; 99 is no type at all.
    block = struct.pack("<f", 1.0) + bytes(256 + 32)
    path = _write(tmp_path, "q8k.gguf", _gguf([_ARCH], [_tinfo(b"blk.0.w", [256, 1], 15, 0)], block))
    with pytest.raises(ValueError, match=r"'blk\.0\.w'.*Q8_K.*not supported"):
        torch_uqr.load_gguf(path)
    path = _write(tmp_path, "t99.gguf", _gguf([_ARCH], [_tinfo(b"blk.1.w", [32, 1], 99, 0)], _Q40_BLOCK))
    with pytest.raises(ValueError, match=r"'blk\.1\.w'.*unknown ggml type 99"):
        torch_uqr.load_gguf(path)


def test_packed_tensors_are_private_views_of_the_file(tiny_gguf):
    path, _ = tiny_gguf
    before = path.read_bytes()
    ck = torch_uqr.load_gguf(path)
    info = ck.raw_tensor_info
    a, b = ck["q40"].data, ck["q41"].data
    # no copy: the distance between two tensors in memory is their distance in the file
    assert b.data_ptr() - a.data_ptr() == info["q41"]["offset"] - info["q40"]["offset"]
    assert ck["norm"].data_ptr() - a.data_ptr() == info["norm"]["offset"] - info["q40"]["offset"]
    a.fill_(0)  # copy-on-write: the process sees the write, the file never does
    assert path.read_bytes() == before
    assert set(ck.tokenizer_metadata()) == {"tokenizer.ggml.tokens"}


# ---- structure-aware fuzzing: typed mutations of counts, lengths, types and offsets ----------------

def _fields(data):
    """(position, width, kind) of every count, length, type and offset field of a GGUF header."""
    out = []
    pos = 8

    def u(width, kind):
        nonlocal pos
        out.append((pos, width, kind))
        v = int.from_bytes(data[pos:pos + width], "little")
        pos += width
        return v

    def value(vtype):
        nonlocal pos
        if vtype == 8:
            n = u(8, "length")  # (not `pos += u(...)`: u moves pos)
            pos += n
        elif vtype == 9:
            etype = u(4, "type")
            for _ in range(u(8, "count")):
                value(etype)
        else:
            pos += {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}[vtype]

    n_tensors, n_kv = u(8, "count"), u(8, "count")
    for _ in range(n_kv):
        n = u(8, "length")
        pos += n
        value(u(4, "type"))
    for _ in range(n_tensors):
        n = u(8, "length")
        pos += n
        for _ in range(u(4, "count")):
            u(8, "dim")
        u(4, "ggml_type")
        u(8, "offset")
    return out


def _typed_values(kind, width, old, rng):
    top = (1 << (8 * width)) - 1
    common = [0, 1, old + 1, max(old - 1, 0), top, top >> 1, 1 << (8 * width - 1), rng.randrange(top)]
    if kind == "type":  # every metadata value type, and a few that do not exist
        return common + list(range(14))
    if kind == "ggml_type":
        return common + [int(t) for t in T] + [31, 36, 99]
    if kind == "offset":
        return common + [old + 32, old - 32 if old >= 32 else 32, 16, 1 << 40]
    if kind in ("length", "count", "dim"):
        return common + [old * 2, old + 8, 2, 3, 1 << 32, 1 << 62]
    return common


def test_structured_mutations_load_or_raise_value_error(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    data = path.read_bytes()
    fields = _fields(data)
    assert {k for _, _, k in fields} >= {"count", "length", "type", "ggml_type", "dim", "offset"}
    rng = random.Random(2024)
    bad = tmp_path / "mutated.gguf"
    outcomes = {"ok": 0, "error": 0}
    slowest = 0.0
    for pos, width, kind in fields:
        old = int.from_bytes(data[pos:pos + width], "little")
        for v in set(_typed_values(kind, width, old, rng)):
            v &= (1 << (8 * width)) - 1
            if v == old:
                continue
            b = bytearray(data)
            b[pos:pos + width] = v.to_bytes(width, "little")
            bad.write_bytes(bytes(b))
            t = time.process_time()
            try:
                ck = torch_uqr.load_gguf(bad)
                try:  # metadata is decoded on access: that must hold up too
                    dict(ck.metadata)
                except ValueError:
                    pass
                outcomes["ok"] += 1
            except ValueError as e:
                assert str(e)
                outcomes["error"] += 1
            slowest = max(slowest, time.process_time() - t)
    assert outcomes["error"] > 100 and outcomes["ok"] > 10, outcomes
    assert slowest < _BOUND_S, slowest
