"""Tuning overrides of the CUDA launch plan: the A/B knobs, explicit and in-process.

The router (``dispatch.py``) decides every launch choice of the CUDA C++ kernels from the tables in
``configs.py`` and the device's properties, and passes it to the C++ ops as arguments. The fields
below override single rules; the defaults (every field ``None``) give the measured defaults.
``override`` sets them for a ``with`` block (per thread / asyncio task, through a context
variable), so a test or benchmark compares two plans in one process::

    from torch_uqr.backends.cuda import tuning
    with tuning.override(pdl=False, split16_splits=3):
        y = torch_uqr.gemm(x, qt)

Fields:

* ``pdl``: launch the kernels as programmatic dependents on sm_90 (default on; False: never).
* ``smem_cap``: small-M / int8 kernels pad shared memory so a grid of at most 2 CTAs an SM spreads
  evenly over the SMs (default on).
* ``split16``: 9-16 activation rows run the mid-M kernel with K split over CTAs (default on; False:
  the small-M kernel, as at 1-8 rows).
* ``split16_splits``: force that many K splits at 9-16 rows (clamped to K's stages; stream-K off).
* ``streamk``: stream-K at 9-16 rows: None = where the power-of-two split leaves more than
  configs.STREAMK_MAX_EMPTY of the CTA slots empty, True = wherever it can run, False = never.
* ``streamk_per_sm``: stream-K grid of this many CTAs an SM (default configs.STREAMK_PER_SM);
  setting it takes stream-K wherever it can run, as ``streamk=True`` does.
* ``streamk_ctas``: stream-K grid of exactly this many CTAs (at most half the stages); as above.
* ``streamk_wide_regs``: the stream-K launch's build at 128 registers (2 CTAs an SM) rather than 85
  (3): None = for configs.STREAMK_WIDE_REGS_FORMATS, True = every format, False = none.
* ``int8_cols``: one activation row of q4_0 / q4_k runs the int8 block-column kernel (default on).
* ``int8_xring``: without it, one row stages x through the weight ring: None = where the grid has
  fewer than configs.INT8_XRING_CTAS_PER_SM CTAs an SM, True / False = always / never.
* ``int8_xpipe``: otherwise x is read a stage ahead into registers (default on).
* ``wgmma_bm``: the Hopper kernel's column tile, 64 or 128 (128 only where its stage fits).
* ``wgmma_ctas``: 1 or 2 CTAs an SM for the Hopper kernel's 64-row tiles (2 only where they fit).
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, fields, replace
from typing import Iterator, Optional

import torch


@dataclass(frozen=True)
class Tuning:
    """One set of overrides (None: the rule). Hashable: the router caches plans by it."""
    pdl: Optional[bool] = None
    smem_cap: Optional[bool] = None
    split16: Optional[bool] = None
    split16_splits: Optional[int] = None
    streamk: Optional[bool] = None
    streamk_per_sm: Optional[int] = None
    streamk_ctas: Optional[int] = None
    streamk_wide_regs: Optional[bool] = None
    int8_cols: Optional[bool] = None
    int8_xring: Optional[bool] = None
    int8_xpipe: Optional[bool] = None
    wgmma_bm: Optional[int] = None
    wgmma_ctas: Optional[int] = None

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            if f.name in _INT_FIELDS:
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ValueError(f"tuning: {f.name}: expected None or a positive int, got {v!r}")
            elif not isinstance(v, bool):
                raise ValueError(f"tuning: {f.name}: expected None or a bool, got {v!r}")
        if self.wgmma_bm not in (None, 64, 128):
            raise ValueError(f"tuning: wgmma_bm: expected None, 64 or 128, got {self.wgmma_bm!r}")
        if self.wgmma_ctas not in (None, 1, 2):
            raise ValueError(f"tuning: wgmma_ctas: expected None, 1 or 2, got {self.wgmma_ctas!r}")


_INT_FIELDS = ("split16_splits", "streamk_per_sm", "streamk_ctas", "wgmma_bm", "wgmma_ctas")
DEFAULT = Tuning()
_current: contextvars.ContextVar[Tuning] = contextvars.ContextVar("uqr_cuda_tuning", default=DEFAULT)


# Each distinct Tuning gets a number for the C++ kernel of uqr::gemm, which caches the router's plan
# per call shape and tuning (csrc/cuda/qmma_binding.cpp). Its key is per thread, as the context
# variable is, so one thread's override never changes another's plans (asyncio tasks sharing a
# thread share the key of the innermost override).
_keys: dict[Tuning, int] = {DEFAULT: 0}


def _tell_cpp(t: Tuning) -> None:
    try:
        op = torch.ops.uqr._cuda_set_tuning_key
    except (AttributeError, RuntimeError):  # no CUDA C++ in this build: the router runs every call
        return
    op(_keys.setdefault(t, len(_keys)))


def current() -> Tuning:
    """The overrides in force here (``DEFAULT`` outside any ``override`` block)."""
    return _current.get()


@contextlib.contextmanager
def override(**knobs) -> Iterator[Tuning]:
    """Override launch-plan rules inside the ``with`` block (nested blocks add to the outer one's
    overrides; a knob passed as None goes back to the rule). Yields the overrides in force."""
    names = {f.name for f in fields(Tuning)}
    unknown = sorted(set(knobs) - names)
    if unknown:
        raise TypeError(f"tuning.override: unknown knob(s) {unknown}; expected some of {sorted(names)}")
    token = _current.set(replace(_current.get(), **knobs))
    _tell_cpp(_current.get())
    try:
        yield _current.get()
    finally:
        _current.reset(token)
        _tell_cpp(_current.get())
