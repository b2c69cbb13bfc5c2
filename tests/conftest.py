"""Shared fixtures: a seeded generator, a relative-RMS metric, NaN-poisoned operator outputs."""
import pytest
import torch


@pytest.fixture
def gen() -> torch.Generator:
    """A fresh, seeded CPU generator per test, so every test sees new but reproducible data."""
    return torch.Generator().manual_seed(20261202)


@pytest.fixture
def rel_rms():
    """``rel_rms(approx, exact)``: RMS error relative to the RMS of ``exact``, in float64."""
    def metric(approx: torch.Tensor, exact: torch.Tensor) -> float:
        a, e = approx.double(), exact.double()
        return float(((a - e).pow(2).mean() / e.pow(2).mean()).sqrt())
    return metric


@pytest.fixture
def poisoned_outputs():
    """Every backend fills its fresh output with NaN before the kernels write it, so an element a
    kernel skips stays NaN and fails the comparison (``torch_uqr.ops.poison_outputs``)."""
    from torch_uqr import ops
    ops.poison_outputs(True)
    yield
    ops.poison_outputs(False)
