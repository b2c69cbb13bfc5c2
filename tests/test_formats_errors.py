"""Bad input: each problem is a ValueError that names it; random bytes never crash anything."""
import zlib

import numpy as np
import pytest
import torch

import torch_uqr as uqr
from torch_uqr.formats import get, block_geometry
from torch_uqr.formats.table import format_cases

CASES = format_cases()


def blocks_of(fmt, n_blocks, gen, g=None):
    """One row of ``n_blocks`` random valid blocks, as a writable numpy copy."""
    block, size = block_geometry(fmt, g)
    data = get(fmt).random_blocks(1, n_blocks * block, gen, **({"group_size": g} if g else {}))
    return data.numpy().copy().reshape(n_blocks, size)


def from_blocks(b, fmt, g=None):
    block, _ = block_geometry(fmt, g)
    return uqr.QTensor.from_bytes(b.reshape(1, -1), fmt, (1, b.shape[0] * block), group_size=g)


def test_unknown_format_and_bad_options():
    with pytest.raises(ValueError, match="unknown format 'q9_9'"):
        uqr.quantize(torch.zeros(1, 32), "q9_9")
    with pytest.raises(ValueError, match="group_size must be one of"):
        uqr.quantize(torch.zeros(1, 64), "mlx4", group_size=48)
    with pytest.raises(ValueError, match="group_size applies only to mlx4"):
        uqr.quantize(torch.zeros(1, 64), "q4_0", group_size=32)


@pytest.mark.parametrize("fmt,g", CASES)
def test_quantize_rejects_bad_weights(fmt, g):
    block, _ = block_geometry(fmt, g)
    with pytest.raises(ValueError, match=f"K={block + 16} is not a multiple of the block size {block}"):
        uqr.quantize(torch.zeros(2, block + 16), fmt, group_size=g)
    for bad in (float("nan"), float("inf")):
        w = torch.zeros(2, block)
        w[1, 3] = bad
        with pytest.raises(ValueError, match="NaN or Inf"):
            uqr.quantize(w, fmt, group_size=g)
    with pytest.raises(ValueError, match="2-D"):
        uqr.quantize(torch.zeros(block), fmt, group_size=g)
    with pytest.raises(ValueError, match="floating-point"):
        uqr.quantize(torch.zeros(1, block, dtype=torch.int32), fmt, group_size=g)
    if fmt != "mxfp4":  # mxfp4's E8M0 scale spans float32's whole range
        with pytest.raises(ValueError, match="too large for the format's fp16"):
            uqr.quantize(torch.full((1, block), 3e38), fmt, group_size=g)


@pytest.mark.parametrize("fmt,g", CASES)
def test_from_bytes_rejects_wrong_length_dtype_shape_and_nonfinite_scale(fmt, g, gen):
    block, size = block_geometry(fmt, g)
    good = blocks_of(fmt, 2, gen, g)
    from_blocks(good, fmt, g)
    with pytest.raises(ValueError, match=f"expected N\\*row_bytes = 1\\*{2 * size}"):
        uqr.QTensor.from_bytes(good.reshape(-1)[:-1], fmt, (1, 2 * block), group_size=g)
    with pytest.raises(ValueError, match="dtype"):
        uqr.QTensor.from_bytes(good.astype(np.int8), fmt, (1, 2 * block), group_size=g)
    with pytest.raises(ValueError, match="dtype"):
        uqr.QTensor.from_bytes(torch.from_numpy(good).float(), fmt, (1, 2 * block), group_size=g)
    with pytest.raises(ValueError, match="not a multiple of the block size"):
        uqr.QTensor.from_bytes(good, fmt, (1, 2 * block + 1), group_size=g)
    with pytest.raises(ValueError, match="expected"):
        uqr.QTensor.from_bytes(good, fmt, (2, 2 * block), group_size=g)
    if fmt == "mxfp4":  # no fp16 field; exponents whose weights overflow float32 are refused instead
        for e in (253, 255):
            bad = good.copy()
            bad[1, 0] = e
            with pytest.raises(ValueError, match=f"block 1 has exponent e = {e}"):
                from_blocks(bad, fmt, g)
        return
    at = FIRST_F16.get(fmt, 0)
    for value in (np.inf, -np.inf, np.nan):
        bad = good.copy()
        bad[1, at:at + 2] = np.frombuffer(np.float16([value]).tobytes(), np.uint8)
        with pytest.raises(ValueError, match="block 1 has a non-finite fp16"):
            from_blocks(bad, fmt, g)


# Byte offset of the first fp16 field where it is not at the start of the block.
FIRST_F16 = {"q3_k": 108, "q2_k": 80, "q6_k": 208}


def test_ternary_code_3_and_padding(gen):
    b = blocks_of("ternary", 3, gen)
    bad = b.copy()
    bad[2, 4 + 5] |= 0b11 << 2
    with pytest.raises(ValueError, match="block 2 contains code 3"):
        from_blocks(bad, "ternary")
    bad = b.copy()
    bad[1, 3] = 1
    with pytest.raises(ValueError, match="block 1 has non-zero _pad"):
        from_blocks(bad, "ternary")


def test_var_affine_rejections(gen):
    b = blocks_of("var_affine", 2, gen)
    b[:, 20:28] = 4            # depth 4 everywhere: exactly the 1024-bit budget
    from_blocks(b, "var_affine")
    for depth, message in ((2, "outside \\{3, 4, 5\\}"), (6, "outside \\{3, 4, 5\\}"), (0, "outside")):
        bad = b.copy()
        bad[1, 20 + 3] = depth
        with pytest.raises(ValueError, match=f"block 1 has a bit depth {message}"):
            from_blocks(bad, "var_affine")
    bad = b.copy()
    bad[0, 20:28] = [5, 5, 4, 4, 4, 4, 4, 4]
    with pytest.raises(ValueError, match="needs 1088 payload bits, over the 1024-bit budget"):
        from_blocks(bad, "var_affine")
    bad = b.copy()
    bad[1, 25] |= 0x40
    with pytest.raises(ValueError, match="reserved bits"):
        from_blocks(bad, "var_affine")
    bad = b.copy()
    bad[0, 29] = 7
    with pytest.raises(ValueError, match="block 0 has non-zero _pad"):
        from_blocks(bad, "var_affine")
    bad = b.copy()
    bad[1, 20:28] = [3, 4, 4, 4, 4, 4, 4, 4]   # 992 bits used: the last 4 payload bytes must be 0
    bad[1, 159] = 0
    from_blocks(bad, "var_affine")
    bad[1, 159] = 0x80
    with pytest.raises(ValueError, match="payload bits after the last code"):
        from_blocks(bad, "var_affine")


def test_exl3_padding(gen):
    b = blocks_of("exl3", 2, gen)
    b[1, 40] = 1
    with pytest.raises(ValueError, match="block 1 has non-zero _pad"):
        from_blocks(b, "exl3")


@pytest.mark.parametrize("fmt,g", CASES)
def test_fuzz_from_bytes_decodes_or_raises_value_error(fmt, g):
    """Seeded random bytes (plus bytes biased towards valid blocks): decode, or ValueError; nothing else."""
    block, size = block_geometry(fmt, g)
    rng = np.random.default_rng(zlib.crc32(f"{fmt}/{g}".encode()))
    accepted = 0
    for trial in range(60):
        raw = rng.integers(0, 256, size=(3, size), dtype=np.uint8)
        if trial % 2:
            # make about half the inputs mostly valid, so decoding is exercised, not only rejection
            raw[:, 0:4] = np.frombuffer(np.float16(rng.standard_normal(6) * 0.1).tobytes(), np.uint8).reshape(3, 4)
            if fmt == "var_affine":
                raw[:, 20:28] = rng.integers(3, 5, size=(3, 8))
                raw[:, 28:32] = 0
                for r in range(3):
                    raw[r, 32 + 4 * int(raw[r, 20:28].sum()):] = 0
            if fmt == "exl3":
                raw[:, 36:48] = 0
            if fmt == "ternary":
                raw[:, 2:4] = 0
                trits = rng.integers(0, 3, size=(3, 8, 4)).astype(np.uint8)
                raw[:, 4:12] = (trits << np.array([0, 2, 4, 6], np.uint8)).sum(-1)
        try:
            qt = uqr.QTensor.from_bytes(raw.reshape(-1), fmt, (1, 3 * block), group_size=g)
        except ValueError:
            continue
        y = uqr.dequantize(qt)
        assert y.shape == (1, 3 * block) and y.dtype == torch.float32 and torch.isfinite(y).all()
        accepted += 1
    assert accepted > 0


@pytest.mark.parametrize("fmt,g", CASES)
def test_hypothesis_from_bytes_decodes_or_raises_value_error(fmt, g):
    hypothesis = pytest.importorskip("hypothesis", reason="hypothesis adds shrinking fuzz to the seeded loop")
    st = hypothesis.strategies
    block, size = block_geometry(fmt, g)

    @hypothesis.settings(max_examples=40, deadline=None, derandomize=True, database=None)
    @hypothesis.given(st.binary(min_size=2 * size, max_size=2 * size))
    def check(raw):
        try:
            qt = uqr.QTensor.from_bytes(raw, fmt, (1, 2 * block), group_size=g)
        except ValueError:
            return
        assert torch.isfinite(uqr.dequantize(qt)).all()

    check()
