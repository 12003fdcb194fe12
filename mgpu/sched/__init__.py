"""Scheduling of block jobs over Dask workers: the work-stealing block scheduler and the
HSGD* cost model (pure functions).

- :mod:`mgpu.sched.blocks`: what the scheduler works on and records (:class:`Block`,
  :class:`Slot`, :class:`Event`) and ``story``, a block's events in order;
- :mod:`mgpu.sched.steal`: its decisions, pure (which block next, whether and what to steal);
- :mod:`mgpu.sched.scheduler`: :class:`BlockScheduler`, which runs epochs over futures;
- :mod:`mgpu.sched.cost`: the HSGD* cost curves and the CPU/GPU split.
"""
from __future__ import annotations

from mgpu.sched.cost import (Curve, calibrate, fit_gpu_curve, fit_linear, fit_piecewise, split,
                             threshold)
from mgpu.sched.scheduler import Block, BlockScheduler, Event, Slot

__all__ = ["Block", "BlockScheduler", "Curve", "Event", "Slot", "calibrate", "fit_gpu_curve",
           "fit_linear", "fit_piecewise", "split", "threshold"]
