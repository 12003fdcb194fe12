"""Scheduling of block jobs over Dask workers: the work-stealing block scheduler (and, to
come, the HSGD* cost model)."""
from __future__ import annotations

from mgpu.sched.scheduler import Block, BlockScheduler, Event, Slot

__all__ = ["Block", "BlockScheduler", "Event", "Slot"]
