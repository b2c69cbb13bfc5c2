"""torch_uqr.threads: the thread count follows the cores other processes leave free."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from torch_uqr.threads import CpuSample, ThreadGovernor, _parse, others_busy_cores, read_sample

STAT = """cpu  400 0 100 1500 0 0 0 0 0 0
cpu0 300 0 50 650 0 0 0 0 0 0
cpu1 100 0 50 850 0 0 0 0 0 0
intr 1 2 3
"""
# The command name may hold spaces and parentheses; utime 7 and stime 5 follow the 11 fields after it.
SELF = "1234 (py (x) y) S 1 2 3 4 5 6 7 8 9 10 7 5 0 0 20 0 3 0"


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_parse_proc_text() -> None:
    s = _parse(STAT, SELF)
    assert s == CpuSample(busy=500, total=2000, own=12, cores=2)
    s0 = _parse(STAT, SELF, cpus={0})
    assert s0 == CpuSample(busy=350, total=1000, own=12, cores=1), "only the cores of the affinity count"


def test_others_busy_cores_subtracts_this_process() -> None:
    a = CpuSample(busy=1000, total=4000, own=100, cores=2)
    # 200 ticks of wall time per core (400 over both): 300 busy, 100 of them ours -> one core busy
    b = CpuSample(busy=1300, total=4400, own=200, cores=2)
    assert others_busy_cores(a, b) == pytest.approx(1.0)
    assert others_busy_cores(a, a) == 0.0
    assert others_busy_cores(a, CpuSample(busy=1300, total=4400, own=500, cores=2)) == 0.0, "never negative"


class FakeClock:
    """A sampler whose machine time moves by 100 ticks a core per sample, ``others`` cores busy."""

    def __init__(self, cores: int) -> None:
        self.cores, self.others, self.s = cores, 0.0, CpuSample(0, 0, 0, cores)

    def __call__(self) -> CpuSample:
        t = 100 * self.cores
        self.s = CpuSample(self.s.busy + int(100 * self.others), self.s.total + t, self.s.own, self.cores)
        return self.s


def test_governor_follows_free_cores(monkeypatch) -> None:
    clock = FakeClock(4)
    gov = ThreadGovernor(max_threads=3, interval_s=0.0, sampler=clock)
    assert gov.threads == 3 and torch.get_num_threads() == 3
    clock.others = 1.0
    assert gov.step() == 3, "3 free cores: all 3 asked for"
    clock.others = 2.0
    assert gov.step() == 2 and torch.get_num_threads() == 2
    clock.others = 3.6
    assert gov.step() == 1, "never below one thread"
    clock.others = 2.5
    assert gov.step() == 1, "a core half used by others is not free"
    clock.others = 0.0
    assert gov.step() == 3, "back up when the others stop, never above max_threads"


def test_governor_waits_for_the_interval() -> None:
    clock = FakeClock(2)
    gov = ThreadGovernor(max_threads=2, interval_s=3600.0, sampler=clock)
    clock.others = 2.0
    assert gov.step() == 2, "no new sample before the interval"


def test_governor_without_proc_keeps_its_count() -> None:
    gov = ThreadGovernor(max_threads=2, interval_s=0.0, sampler=lambda: None)
    assert gov.step() == 2
    with pytest.raises(ValueError, match="max_threads"):
        ThreadGovernor(max_threads=-1, sampler=lambda: None)


@pytest.mark.skipif(read_sample() is None or len(os.sched_getaffinity(0)) < 2, reason="needs Linux /proc and 2 cores")
def test_governor_sees_a_busy_core_on_this_machine() -> None:
    """Another process spinning on this machine takes a thread away."""
    cores = len(os.sched_getaffinity(0))
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        gov = ThreadGovernor(max_threads=cores, interval_s=0.3)
        time.sleep(0.6)
        assert gov.step() <= cores - 1
    finally:
        spin.kill()
        spin.wait()
