"""BitNet import: Hugging Face packed ternary weights and both weight_scale conventions."""
import numpy as np
import pytest
import torch

import torch_uqr as uqr


def hf_pack(trits: np.ndarray) -> np.ndarray:
    """Pack like the HF BitNet checkpoints: row i*ceil(N/4)+r goes to bits 2i..2i+1 of packed row r."""
    N, K = trits.shape
    rows = -(-N // 4)
    padded = np.ones((4 * rows, K), np.uint8)          # padding rows hold value 0 (code 1)
    padded[:N] = trits + 1
    packed = np.zeros((rows, K), np.uint8)
    for i in range(4):
        packed |= padded[i * rows:(i + 1) * rows] << (2 * i)
    return packed


def straightforward_unpack(packed: np.ndarray, N: int) -> np.ndarray:
    """Element by element, the way the format is described, independent of the importer."""
    rows, K = packed.shape
    out = np.zeros((N, K), np.int64)
    for n in range(N):
        i, r = divmod(n, rows)
        for k in range(K):
            out[n, k] = int((packed[r, k] >> (2 * i)) & 3) - 1
    return out


@pytest.mark.parametrize("N", [1, 6, 7, 8])
@pytest.mark.parametrize("convention", ["divide", "multiply"])
def test_from_bitnet_matches_straightforward_unpacking(N, convention, gen):
    K = 64
    trits = torch.randint(-1, 2, (N, K), generator=gen).numpy()
    packed = hf_pack(trits)
    assert np.array_equal(straightforward_unpack(packed, N), trits)
    scale = np.float32(0.625)
    qt = uqr.from_bitnet(packed, np.array([scale]), N, convention=convention)
    assert qt.fmt == "ternary" and qt.shape == (N, K)
    factor = 1 / scale if convention == "divide" else scale
    expect = straightforward_unpack(packed, N) * float(np.float16(factor))
    np.testing.assert_array_equal(uqr.dequantize(qt).numpy().astype(np.float64), expect)


def test_from_bitnet_torch_bf16_scale_and_per_row_scales(gen):
    N, K = 5, 96
    trits = torch.randint(-1, 2, (N, K), generator=gen).numpy()
    packed = torch.from_numpy(hf_pack(trits))
    scale = torch.tensor(1.5, dtype=torch.bfloat16)
    qt = uqr.from_bitnet(packed, scale, N, convention="multiply")
    np.testing.assert_array_equal(uqr.dequantize(qt).numpy(), trits * 1.5)
    rows = torch.arange(1, N + 1, dtype=torch.float32) / 4
    qt = uqr.from_bitnet(packed, rows, N, convention="multiply")
    np.testing.assert_array_equal(uqr.dequantize(qt).numpy(), trits * rows.numpy()[:, None])


def test_from_bitnet_errors(gen):
    packed = hf_pack(np.zeros((4, 32), np.int64))
    with pytest.raises(ValueError, match="convention"):
        uqr.from_bitnet(packed, 1.0, 4, convention="scale")
    with pytest.raises(ValueError, match="ceil"):
        uqr.from_bitnet(packed, 1.0, 5)
    with pytest.raises(ValueError, match="multiple of the block"):
        uqr.from_bitnet(hf_pack(np.zeros((4, 48), np.int64)), 1.0, 4)
    with pytest.raises(ValueError, match="uint8"):
        uqr.from_bitnet(packed.astype(np.int16), 1.0, 4)
    with pytest.raises(ValueError, match="non-zero"):
        uqr.from_bitnet(packed, 0.0, 4, convention="divide")
    bad = packed.copy()
    bad[0, 3] = 0b11 << 4
    with pytest.raises(ValueError, match=r"row 2, column 3 holds code 3"):
        uqr.from_bitnet(bad, 1.0, 4)
    with pytest.raises(ValueError, match="fit fp16"):
        uqr.from_bitnet(packed, 1e-9, 4, convention="divide")
