"""QuantLinear and quantize_model: router forward vs a float64 reference, layouts, state dicts."""
import pytest
import torch
from torch import nn

import torch_uqr
from torch_uqr.nn import QuantLinear, load_quantized, save_quantized


def _ref(x, qt, bias=None, k=None):
    w = torch_uqr.dequantize(qt).double()
    if k is not None:
        w = w[:, :k]
    y = x.double() @ w.T
    return y + bias.double() if bias is not None else y


@pytest.mark.parametrize("fmt,K", [("q4_0", 96), ("q8_0", 160), ("q4_k", 256), ("mlx4", 96),
                                   ("var_affine", 256), ("exl3", 256), ("ternary", 64)])
def test_forward_matches_float64(fmt, K):
    g = torch.Generator().manual_seed(hash(fmt) % 1000)
    opts = {"group_size": 32} if fmt == "mlx4" else {}
    qt = torch_uqr.quantize(torch.randn(40, K, generator=g), fmt, **opts)
    bias = torch.randn(40, generator=g)
    m = QuantLinear.from_qtensor(qt, bias)
    x = torch.randn(2, 7, K, generator=g)
    y = m(x)
    assert y.shape == (2, 7, 40) and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), _ref(x, qt, bias), rtol=1e-4, atol=1e-4)


def test_direct_head_layouts():
    g = torch.Generator().manual_seed(1)
    H, D, M = 3, 32, 5
    qt = torch_uqr.quantize(torch.randn(H * D, 64, generator=g), "q4_1")
    bias = torch.randn(H * D, generator=g)
    x = torch.randn(2, M, 64, generator=g)
    plain = QuantLinear.from_qtensor(qt, bias)(x)
    heads = QuantLinear.from_qtensor(qt, bias, out_heads=H)(x)
    assert heads.shape == (2, H, M, D)
    torch.testing.assert_close(heads, plain.view(2, M, H, D).transpose(1, 2))
    o_qt = torch_uqr.quantize(torch.randn(24, H * D, generator=g), "q8_0")
    o = QuantLinear.from_qtensor(o_qt, in_heads=True)(heads)
    torch.testing.assert_close(o.double(), _ref(plain, o_qt), rtol=1e-4, atol=1e-4)


def test_from_linear_pads_k_when_asked():
    lin = nn.Linear(80, 24)
    with pytest.raises(ValueError):
        QuantLinear.from_linear(lin, "q4_k")
    m = QuantLinear.from_linear(lin, "q4_k", pad=True)
    assert (m.in_features, m.packed_in_features, m.out_features) == (80, 256, 24)
    x = torch.randn(4, 80)
    torch.testing.assert_close(m(x).double(), _ref(x, m.qtensor, lin.bias, k=80), rtol=1e-4, atol=1e-4)
    assert "padded_to=256" in repr(m)
    with pytest.raises(ValueError, match="in_heads"):
        QuantLinear(m.qtensor, in_features=80, in_heads=True)


def test_state_dict_round_trip_through_safetensors(tmp_path):
    src = QuantLinear.from_linear(nn.Linear(64, 48), "mlx4", group_size=32)
    dst = QuantLinear.from_linear(nn.Linear(32, 16, bias=False), "q8_0")  # another format and size
    save_quantized(src, str(tmp_path / "m.safetensors"))
    load_quantized(dst, str(tmp_path / "m.safetensors"))
    assert dst.fmt == "mlx4" and dst.group_size == 32 and torch.equal(dst.weight, src.weight)
    assert torch.equal(dst.bias, src.bias)
    x = torch.randn(3, 64)
    assert torch.equal(dst(x), src(x))


def test_repr_dtype_and_errors():
    m = QuantLinear.from_linear(nn.Linear(64, 32), "q4_0")
    r = repr(m)
    assert "fmt=q4_0" in r and "in_features=64" in r and "out_features=32" in r and "bpw=4.50" in r
    m.to(torch.float16)
    assert m.weight.dtype == torch.uint8 and m.bias.dtype == torch.float16
    assert m(torch.randn(2, 64, dtype=torch.float16)).dtype == torch.float16
    qt = torch_uqr.quantize(torch.randn(32, 64), "q4_0")
    with pytest.raises(ValueError, match="bias"):
        QuantLinear(qt, torch.zeros(31))
    with pytest.raises(ValueError, match="out_heads"):
        QuantLinear(qt, out_heads=5)
    with pytest.raises(TypeError):
        QuantLinear.from_linear(nn.Conv1d(1, 1, 1), "q4_0")


def test_quantize_model_swaps_skips_and_reports():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 32), nn.Linear(32, 8))
    x = torch.randn(5, 256)
    ref = model(x)
    s = torch_uqr.quantize_model(model, "q4_k", skip=["3"], fallback="q8_0", progress=False, verbose=False)
    assert isinstance(model[0], QuantLinear) and isinstance(model[2], QuantLinear)
    assert isinstance(model[3], nn.Linear) and s.skipped == ["3"]
    assert s.formats == {"0": "q4_k", "2": "q8_0"} and list(s.fallbacks) == ["2"]  # 64 % 256 != 0
    assert s.share_in_fmt == 256 * 64 / (256 * 64 + 64 * 32)
    assert s.bytes_before == 4 * (256 * 64 + 64 * 32)
    assert s.bytes_after == model[0].weight.numel() + model[2].weight.numel()
    assert "1 layers: q8_0 instead of q4_k" in str(s)
    torch.testing.assert_close(model(x), ref, rtol=0.05, atol=0.05)
    model2 = nn.Sequential(nn.Linear(48, 8))
    s2 = torch_uqr.quantize_model(model2, "q4_0", progress=False, verbose=False)  # default: pad
    assert model2[0].packed_in_features == 64 and s2.share_in_fmt == 1.0
    with pytest.raises(ValueError, match="block size"):
        torch_uqr.quantize_model(nn.Sequential(nn.Linear(48, 8)), "q4_0", fallback="error",
                                 progress=False, verbose=False)


def _state(m):
    return {k: v.clone() for k, v in m.state_dict().items()}


def test_state_dict_is_validated_like_the_constructor():
    src = QuantLinear.from_linear(nn.Linear(64, 32), "q4_0")
    dst = QuantLinear.from_linear(nn.Linear(64, 32), "q4_0")
    before = _state(dst)
    cases = {
        "bias must be a float tensor of shape \\(32,\\)": {"bias": torch.zeros(1)},
        "bias must be a float tensor of shape \\(32,\\) \\(out_features\\), got torch.float32 \\(33,\\)": {"bias": torch.zeros(33)},
        "q4_0: data has 1152 bytes, expected": {"weight_shape": torch.tensor([16, 64, 0, 64])},
        "K=48 is not a multiple": {"weight_shape": torch.tensor([32, 48, 0, 48])},
        "in_features must be in 1..64": {"weight_shape": torch.tensor([32, 64, 0, 65])},
        "ASCII format name": {"weight_format": torch.tensor([0xC3, 0xA9], dtype=torch.uint8)},
        "unknown format 'zz'": {"weight_format": torch.tensor(list(b"zz"), dtype=torch.uint8)},
        "weight_shape must be an int64 tensor": {"weight_shape": torch.tensor([32, 64])},
        "has no group size": {"weight_shape": torch.tensor([32, 64, 32, 64])},
        "non-finite fp16 scale": {"weight": torch.full((32, 36), 0x7E, dtype=torch.uint8)},
    }
    for match, change in cases.items():
        sd = _state(src)
        sd.update(change)
        with pytest.raises(ValueError, match=match):
            dst.load_state_dict(sd)
        for k, v in before.items():  # a refused state dict leaves the module as it was
            assert torch.equal(dst.state_dict()[k], v), (match, k)
    dst.load_state_dict(_state(src))
    x = torch.randn(2, 64)
    assert torch.equal(dst(x), src(x))


def test_weight_changed_in_place_after_a_forward_is_validated_again():
    m = QuantLinear.from_linear(nn.Linear(64, 32), "q4_0")
    x = torch.randn(1, 64)
    m(x)
    m.weight[3, 0:2] = torch.tensor([0x00, 0x7E], dtype=torch.uint8)  # fp16 NaN scale, same storage
    with pytest.raises(ValueError, match="non-finite"):
        m(x)
    m.weight[3, 0:2] = torch.tensor([0x00, 0x3C], dtype=torch.uint8)  # 1.0: valid again
    m(x)
    view = m.weight.view(-1)
    view[0:2] = torch.tensor([0x00, 0x7C], dtype=torch.uint8)  # +Inf through a view
    with pytest.raises(ValueError, match="non-finite"):
        m(x)


def test_from_bytes_owns_its_bytes():
    qt = torch_uqr.quantize(torch.randn(4, 64), "q8_0")
    for src in (qt.data.clone(), qt.data.numpy().copy()):
        own = torch_uqr.QTensor.from_bytes(src, "q8_0", (4, 64))
        expect = own.data.clone()
        src[0, 0:2] = torch.tensor([0x00, 0x7E]) if isinstance(src, torch.Tensor) else [0x00, 0x7E]
        assert torch.equal(own.data, expect)  # the caller's later write does not reach the QTensor
