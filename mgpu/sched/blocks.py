"""What the block scheduler works on and what it records: blocks, slots and events.

Plain frozen records, no Dask: :mod:`mgpu.sched.steal` decides on them without a cluster,
:mod:`mgpu.sched.scheduler` runs them, and :func:`story` reads a run back.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Block", "Event", "Slot", "story"]


@dataclass(frozen=True)
class Block:
    """One unit of work: its strata, its size (e.g. ratings) and the slot that owns it.

    Attributes
    ----------
    id : int
        Unique among the blocks of one scheduler.
    row, col : int
        The row and the column stratum; two running blocks never share either.
    size : float, default=1.0
        The block's amount of work (ratings, nonzeros); the default cost is proportional to it.
    owner : int or None, default=None
        Index into the slots of the static plan; None lets the plan choose.
    """

    id: int
    row: int
    col: int
    size: float = 1.0
    owner: int | None = None  # index into the slots; None: the static plan chooses


@dataclass(frozen=True)
class Slot:
    """Somewhere a block runs: a GPU worker, or one thread of a CPU worker.

    Attributes
    ----------
    name : str
        Unique among the slots; events name the slot by it.
    worker : str
        The address of the Dask worker (or block host) the slot's tasks are pinned to.
    kind : str, default="cpu"
        ``"cpu"`` or ``"gpu"``, as a cost model tells slots apart.
    """

    name: str
    worker: str
    kind: str = "cpu"


@dataclass(frozen=True)
class Event:
    """A decision or a completion, with the reason for it.

    Attributes
    ----------
    t : float
        Seconds since the scheduler started.
    kind : str
        ``"assign"`` (from the slot's own queue), ``"steal"`` (from another slot's queue) or
        ``"finish"``.
    block : int
        The block's id.
    slot : str
        The name of the slot that runs it.
    reason : str
        Why, in words (the victim and the times compared, for a steal).
    epoch : int, default=0
        The epoch, counted from 1 (after the scheduler's ``epochs_done``).
    task : int, default=0
        The task that runs the block; blocks run in one task (``batch``) share it.
    """

    t: float  # seconds since the scheduler started
    kind: str  # "assign", "steal", "finish"
    block: int
    slot: str
    reason: str
    epoch: int = 0
    task: int = 0  # blocks run in one task (``batch``) share it


def story(events: Iterable[Event], *blocks: Block | int) -> list[Event]:
    """The events that concern the given blocks, in the order they happened.

    Parameters
    ----------
    events : iterable of Event
        A run's events, e.g. :attr:`mgpu.sched.BlockScheduler.events`.
    *blocks : Block or int
        The blocks, or their ids.

    Returns
    -------
    list of Event
        Every event of one of those blocks (its assignment or steal, its finish, in every
        epoch), in the order of ``events``.

    Examples
    --------
    >>> from mgpu.sched.blocks import Block, Event, story
    >>> events = [Event(0.0, "assign", 1, "gpu", "own queue", 1, 1),
    ...           Event(0.1, "assign", 2, "cpu", "own queue", 1, 2),
    ...           Event(0.5, "finish", 1, "gpu", "took 0.5 s", 1, 1)]
    >>> [(e.kind, e.slot) for e in story(events, Block(1, 0, 0))]
    [('assign', 'gpu'), ('finish', 'gpu')]
    >>> [e.block for e in story(events, 2, 1)]
    [1, 2, 1]
    """
    ids = {b.id if isinstance(b, Block) else int(b) for b in blocks}
    return [e for e in events if e.block in ids]
