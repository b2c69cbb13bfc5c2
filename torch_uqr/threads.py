"""CPU threads that use the cores other processes leave free.

torch's CPU thread pool (OpenMP) spin-waits at the end of every parallel region. When a model asks
for every core and another process keeps one of them busy, the pool thread that shares that core
is descheduled in the middle of a region while its partners spin waiting for it, and decoding, a
few hundred short regions per token, slows by an order of magnitude (docs/perf/cpu-zen2.md,
"Decode on a loaded machine"). llama.cpp leaves the thread count to the user; here
``ThreadGovernor`` samples the kernel's CPU accounting between decode steps and keeps torch's
thread count at the cores the rest of the machine leaves idle, never above the count asked for.

Linux only (``/proc/stat``); elsewhere the governor keeps the count it was given.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

__all__ = ["CpuSample", "ThreadGovernor", "others_busy_cores", "read_sample"]


@dataclass(frozen=True)
class CpuSample:
    """Cumulative CPU time in clock ticks: of the whole machine (busy, all) and of this process."""
    busy: int
    total: int
    own: int
    cores: int


def _fields(line: str) -> tuple[int, int]:
    """(busy, idle) ticks of one /proc/stat cpu line: user nice system idle iowait irq softirq steal
    (guest time is already inside user)."""
    f = [int(v) for v in line.split()[1:9]]
    idle = f[3] + (f[4] if len(f) > 4 else 0)
    return sum(f) - idle, idle


def _parse(stat_text: str, self_stat_text: str, cpus: Optional[set[int]] = None) -> CpuSample:
    """A sample from the text of /proc/stat and /proc/self/stat, over the cores in ``cpus`` (the
    process's affinity; None: the whole machine)."""
    per_cpu = {int(ln.split()[0][3:]): _fields(ln) for ln in stat_text.splitlines()
               if ln.startswith("cpu") and ln[3:4].isdigit()}
    mine = [per_cpu[c] for c in sorted(per_cpu) if cpus is None or c in cpus] or list(per_cpu.values())
    busy, idle = sum(b for b, _ in mine), sum(i for _, i in mine)
    # /proc/self/stat: the command name (field 2) may hold spaces; utime and stime are fields 14, 15.
    rest = self_stat_text[self_stat_text.rindex(")") + 2:].split()
    own = int(rest[11]) + int(rest[12])
    return CpuSample(busy=busy, total=busy + idle, own=own, cores=max(len(mine), 1))


def read_sample() -> Optional[CpuSample]:
    """The machine's and this process's CPU time now, or None where /proc is not readable."""
    try:
        with open("/proc/stat") as a, open("/proc/self/stat") as b:
            cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
            return _parse(a.read(), b.read(), cpus)
    except (OSError, ValueError, IndexError):
        return None


def others_busy_cores(before: CpuSample, after: CpuSample) -> float:
    """Cores kept busy by every other process between two samples (0 when no time passed)."""
    total = after.total - before.total
    if total <= 0:
        return 0.0
    others = (after.busy - before.busy) - (after.own - before.own)
    return max(0.0, others / total * after.cores)


class ThreadGovernor:
    """Keeps ``torch.set_num_threads`` at the cores other processes leave free.

    Args:
        max_threads: the most threads to use (default: torch's count when the governor starts).
        interval_s: the least time between two samples (the kernel counts CPU time in ticks of
            10 ms or less, so shorter windows are noise).
        sampler: where samples come from (tests pass their own; default :func:`read_sample`).

    Call :meth:`step` between decode steps: it is a clock read except once per interval, when it
    reads ``/proc`` and may change the thread count. A core counts as free when others use less
    than three quarters of it.
    """

    def __init__(self, max_threads: Optional[int] = None, interval_s: float = 0.2,
                 sampler: Callable[[], Optional[CpuSample]] = read_sample):
        self.max_threads = int(max_threads or torch.get_num_threads())
        if self.max_threads < 1:
            raise ValueError(f"max_threads: expected >= 1, got {max_threads!r}")
        self.interval_s = float(interval_s)
        self._sampler = sampler
        self._last = sampler()
        self._t = time.monotonic()
        self.threads = self.max_threads
        torch.set_num_threads(self.threads)

    def step(self) -> int:
        """Re-sample when the interval has passed; returns the thread count in force."""
        now = time.monotonic()
        if self._last is None or now - self._t < self.interval_s:
            return self.threads
        cur = self._sampler()
        if cur is None:
            return self.threads
        free = cur.cores - others_busy_cores(self._last, cur)
        self._last, self._t = cur, now
        want = max(1, min(self.max_threads, math.floor(free + 0.25)))
        if want != self.threads:
            self.threads = want
            torch.set_num_threads(want)
        return self.threads
