"""Shared fixtures for the format tests: a seeded generator and a relative-RMS metric."""
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
