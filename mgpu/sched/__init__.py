"""Scheduling of block jobs over Dask workers: the work-stealing block scheduler and the
HSGD* cost model (pure functions)."""
from __future__ import annotations

from mgpu.sched.cost import (Curve, calibrate, fit_gpu_curve, fit_linear, fit_piecewise, split,
                             threshold)
from mgpu.sched.scheduler import Block, BlockScheduler, Event, Slot

__all__ = ["Block", "BlockScheduler", "Curve", "Event", "Slot", "calibrate", "fit_gpu_curve",
           "fit_linear", "fit_piecewise", "split", "threshold"]
