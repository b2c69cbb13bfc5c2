"""load_mlx / load_bitnet on small synthetic checkpoints, checked against straightforward unpacking."""
import json
import random

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import torch_uqr
from torch_uqr.formats.table import family


MLX_BITS = [f.code_bits for f in family("mlx")]


def _pack_lsb_first(q: np.ndarray, bits: int) -> np.ndarray:
    """Codes [N, K] of ``bits`` bits as MLX's uint32 words: element k at bits [bits k, bits k + bits)
    of the row's little-endian bit stream."""
    N, K = q.shape
    stream = ((q[:, :, None] >> np.arange(bits, dtype=np.uint32)) & 1).reshape(N, K * bits).astype(np.uint64)
    words = stream.reshape(N, -1, 32) << np.arange(32, dtype=np.uint64)
    return words.sum(-1).astype(np.uint32)


def _mlx_checkpoint(folder, N=6, K=128, g=32, seed=0, bits=4, config_bits=None, extra_config=None):
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 1 << bits, size=(N, K), dtype=np.uint32)
    wq = _pack_lsb_first(q, bits)
    # negative scales too, as MLX's own quantizer produces them
    scales = rng.uniform(-0.05, 0.05, size=(N, K // g)).astype(np.float16)
    biases = rng.uniform(-0.5, 0.5, size=(N, K // g)).astype(np.float16)
    expect = scales.astype(np.float32).repeat(g, 1) * q + biases.astype(np.float32).repeat(g, 1)
    tensors = {"layers.0.proj.weight": torch.from_numpy(wq.view(np.int32)).view(torch.uint32),
               "layers.0.proj.scales": torch.from_numpy(scales), "layers.0.proj.biases": torch.from_numpy(biases),
               "norm.weight": torch.from_numpy(rng.standard_normal(K).astype(np.float32))}
    save_file(tensors, str(folder / "model.safetensors"))
    quant = {"group_size": g, "bits": bits if config_bits is None else config_bits, **(extra_config or {})}
    (folder / "config.json").write_text(json.dumps({"quantization": quant}))
    return expect, tensors


def test_mlx_triples_become_mlx4_qtensors(tmp_path):
    expect, tensors = _mlx_checkpoint(tmp_path)
    out = torch_uqr.load_mlx(tmp_path)
    assert set(out) == {"layers.0.proj.weight", "norm.weight"}
    qt = out["layers.0.proj.weight"]
    assert qt.fmt == "mlx4" and qt.shape == (6, 128) and qt.group_size == 32
    assert torch.equal(torch_uqr.dequantize(qt), torch.from_numpy(expect))
    assert torch.equal(out["norm.weight"], tensors["norm.weight"])
    # the same file without config.json: the group size comes from the shapes
    (tmp_path / "config.json").unlink()
    assert torch_uqr.load_mlx(tmp_path / "model.safetensors")["layers.0.proj.weight"].group_size == 32


@pytest.mark.parametrize("bits", MLX_BITS)
@pytest.mark.parametrize("g", [32, 128])
def test_mlx_config_bits_pick_the_format(tmp_path, bits, g):
    expect, _ = _mlx_checkpoint(tmp_path, K=256, g=g, bits=bits, seed=bits)
    qt = torch_uqr.load_mlx(tmp_path)["layers.0.proj.weight"]
    assert qt.fmt == f"mlx{bits}" and qt.shape == (6, 256) and qt.group_size == g
    assert torch.equal(torch_uqr.dequantize(qt), torch.from_numpy(expect))


def test_mlx_mixed_precision_config(tmp_path):
    # mlx_lm's mixed recipes keep a {group_size, bits} entry under the layer's name.
    expect, _ = _mlx_checkpoint(tmp_path, bits=6, config_bits=4,
                                extra_config={"layers.0.proj": {"group_size": 32, "bits": 6}})
    qt = torch_uqr.load_mlx(tmp_path)["layers.0.proj.weight"]
    assert qt.fmt == "mlx6" and torch.equal(torch_uqr.dequantize(qt), torch.from_numpy(expect))


def test_mlx_rejects_wrong_bit_widths_and_broken_triples(tmp_path):
    _mlx_checkpoint(tmp_path, bits=4, config_bits=8)  # the words are 4-bit codes, the config says 8
    with pytest.raises(ValueError, match="does not match bits"):
        torch_uqr.load_mlx(tmp_path)
    _mlx_checkpoint(tmp_path, bits=4, config_bits=7)
    with pytest.raises(ValueError, match="bits=7 has no format"):
        torch_uqr.load_mlx(tmp_path)
    _, tensors = _mlx_checkpoint(tmp_path)
    del tensors["layers.0.proj.biases"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="biases"):
        torch_uqr.load_mlx(tmp_path)


def _bitnet_checkpoint(folder, N=10, K=64, seed=0, linear_class="bitlinear"):
    rng = np.random.default_rng(seed)
    R = -(-N // 4)
    trits = rng.integers(-1, 2, size=(4 * R, K))
    trits[N:] = 0
    packed = np.zeros((R, K), dtype=np.uint8)
    for i in range(4):  # bits 2i..2i+1 of packed row r hold row i*R + r, as value + 1
        packed |= ((trits[i * R:(i + 1) * R] + 1).astype(np.uint8) << (2 * i))
    scale = np.array([2.5], dtype=np.float32)
    save_file({"model.layers.0.mlp.down_proj.weight": torch.from_numpy(packed),
               "model.layers.0.mlp.down_proj.weight_scale": torch.from_numpy(scale),
               "model.norm.weight": torch.ones(K)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "bitnet",
                                                                            "linear_class": linear_class}}))
    return trits[:N].astype(np.float32), float(scale[0])


@pytest.mark.parametrize("linear_class", ["bitlinear", "autobitlinear"])
def test_bitnet_weights_become_ternary(tmp_path, linear_class):
    trits, scale = _bitnet_checkpoint(tmp_path, linear_class=linear_class)
    out = torch_uqr.load_bitnet(tmp_path, out_features={"model.layers.0.mlp.down_proj.weight": 10})
    qt = out["model.layers.0.mlp.down_proj.weight"]
    assert qt.fmt == "ternary" and qt.shape == (10, 64)
    factor = 1 / scale if linear_class == "bitlinear" else scale
    assert torch.equal(torch_uqr.dequantize(qt), torch.from_numpy(trits) * np.float16(factor).item())
    assert "model.norm.weight" in out and "model.layers.0.mlp.down_proj.weight_scale" not in out
    # default N = 4 * packed rows = 12 (the two padding rows decode to zero)
    assert torch_uqr.load_bitnet(tmp_path)["model.layers.0.mlp.down_proj.weight"].shape == (12, 64)
    with pytest.raises(ValueError, match="convention"):
        torch_uqr.load_bitnet(tmp_path, convention="times")


@pytest.mark.parametrize("loader,make", [("load_mlx", _mlx_checkpoint), ("load_bitnet", _bitnet_checkpoint)])
def test_truncated_and_bit_flipped_files(tmp_path, loader, make):
    make(tmp_path)
    load = getattr(torch_uqr, loader)
    good = (tmp_path / "model.safetensors").read_bytes()
    path = tmp_path / "model.safetensors"
    for cut in list(range(0, 40, 3)) + list(range(40, len(good), max(1, len(good) // 25))):
        path.write_bytes(good[:cut])
        with pytest.raises(ValueError):
            load(tmp_path)
    rng = random.Random(7)
    results = {"ok": 0, "error": 0}
    for i in range(120):
        b = bytearray(good)
        pos = rng.randrange(0, min(len(b), 300)) if i % 3 else rng.randrange(len(b))
        b[pos] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(b))
        try:
            load(tmp_path)
            results["ok"] += 1
        except ValueError:
            results["error"] += 1
    assert results["error"] > 10 and results["ok"] > 5, results


def test_empty_tensors_are_refused_not_loaded_as_k0(tmp_path):
    """An empty weight must not become a QTensor with K = 0 (or N = 0)."""
    empty = torch.zeros((6, 0), dtype=torch.int32).view(torch.uint32)
    save_file({"l.weight": empty, "l.scales": torch.zeros((6, 0), dtype=torch.float16),
               "l.biases": torch.zeros((6, 0), dtype=torch.float16)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"quantization": {"group_size": 32, "bits": 4}}))
    with pytest.raises(ValueError, match="empty"):
        torch_uqr.load_mlx(tmp_path)
    for packed in (torch.zeros((3, 0), dtype=torch.uint8), torch.zeros((0, 32), dtype=torch.uint8)):
        save_file({"l.weight": packed, "l.weight_scale": torch.ones(1)}, str(tmp_path / "model.safetensors"))
        (tmp_path / "config.json").write_text("{}")
        with pytest.raises(ValueError, match="K=0|out_features"):
            torch_uqr.load_bitnet(tmp_path)
