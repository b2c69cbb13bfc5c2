"""load_gguf on small synthetic GGUF files: values, and fuzzing with truncation and bit flips."""
import os
import random

import gguf
import numpy as np
import pytest
import torch

import torch_uqr
from torch_uqr.loaders.gguf import scan_gguf_header

T = gguf.GGMLQuantizationType


def _random_blocks(rng, qtype, n_rows, k):
    """Random bytes for `qtype` with every fp16 scale field set to a finite value."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_rows, k // block, size), dtype=np.uint8)
    halves = {T.Q4_K: (0, 2), T.Q6_K: (size - 2,)}[qtype]
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
                               ("tq1", T.TQ1_0, (3, 256)), ("tq2", T.TQ2_0, (2, 256))]:
        f = rng.standard_normal(shape).astype(np.float32)
        w.add_tensor(name, gguf.quants.quantize(f, qtype), raw_dtype=qtype)
    for name, qtype, shape in [("q4k", T.Q4_K, (3, 256)), ("q6k", T.Q6_K, (2, 256))]:
        w.add_tensor(name, _random_blocks(rng, qtype, *shape), raw_dtype=qtype)
    floats["norm"] = rng.standard_normal(7).astype(np.float32)
    floats["f16"] = rng.standard_normal((3, 5)).astype(np.float16)
    for name, arr in floats.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return floats


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    floats = write_gguf(path)
    return path, floats


def test_values_match_the_gguf_package(tiny_gguf):
    path, floats = tiny_gguf
    ck = torch_uqr.load_gguf(path)
    reader = gguf.GGUFReader(str(path))
    native = {"q40": "q4_0", "q41": "q4_1", "q80": "q8_0", "q4k": "q4_k", "tq1": "ternary", "tq2": "ternary"}
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
    assert ck.dequantized == ["q6k"]  # the one non-native quantized type is listed, not silent
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
