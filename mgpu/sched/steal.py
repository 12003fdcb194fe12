"""The block scheduler's decisions as pure functions: which free block a slot takes next,
how much time a slot has left, and whether a slot that ran dry steals, and what.

No futures, no clocks, no Dask: the inputs are the queues, the strata held by the tasks in
flight, each block's update count and the expected seconds; :class:`mgpu.sched.BlockScheduler`
feeds them from a running epoch, a test from plain values.

- A block is *free* for a slot when no other slot's task in flight holds its row or its column
  stratum (:func:`is_free`): two slots' running blocks never share one (the SGD conflict rule).
- Among the free blocks of a queue, the least updated goes first; ties keep the queue's order
  (:func:`pick`).
- A slot that ran dry looks at the slot with the most expected remaining time that has a block
  free for it (ties: the lower slot index) and steals that block if moving and running it
  here, ``transfer + cost``, takes less than the time that slot has left (:func:`time_saved`
  is positive); otherwise it steals nothing (:func:`choose_steal`). Only that one slot is a
  victim: the others would finish sooner.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from mgpu.sched.blocks import Block

__all__ = ["Steal", "Victim", "choose_steal", "is_free", "pick", "remaining_time",
           "time_saved"]


def is_free(block: Block, slot: int, rows: Mapping[int, int], cols: Mapping[int, int]) -> bool:
    """Whether ``slot`` may start ``block``: no other slot holds its row or column stratum.

    Parameters
    ----------
    block : Block
    slot : int
        The index of the slot that would run it.
    rows, cols : mapping of int to int
        Row (column) stratum -> the index of the slot whose tasks in flight hold it.

    Returns
    -------
    bool

    Examples
    --------
    >>> from mgpu.sched.blocks import Block
    >>> is_free(Block(0, row=2, col=5), 1, rows={2: 1}, cols={})
    True
    >>> is_free(Block(0, row=2, col=5), 1, rows={}, cols={5: 0})
    False
    """
    r, c = rows.get(block.row), cols.get(block.col)
    return (r is None or r == slot) and (c is None or c == slot)


def pick(queue: Sequence[Block], slot: int, rows: Mapping[int, int], cols: Mapping[int, int],
         updates: Mapping[int, int] | None = None) -> Block | None:
    """The block of ``queue`` that ``slot`` takes next, or None when none is free for it.

    Parameters
    ----------
    queue : sequence of Block
        Blocks not yet started this epoch, in plan order.
    slot : int
        The index of the slot that would run it.
    rows, cols : mapping of int to int
        Row (column) stratum -> the index of the slot whose tasks in flight hold it.
    updates : mapping of int to int, optional
        Block id -> times it ran so far. Given: the least updated free block, the first of
        them in queue order on a tie. None (the scheduler's ``deterministic`` mode): the first
        free block in queue order.

    Returns
    -------
    Block or None

    Examples
    --------
    >>> from mgpu.sched.blocks import Block
    >>> q = [Block(0, 0, 0), Block(1, 1, 1), Block(2, 2, 2)]
    >>> pick(q, 0, rows={}, cols={0: 1}, updates={0: 0, 1: 2, 2: 1}).id
    2
    >>> pick(q, 0, rows={}, cols={0: 1}).id
    1
    """
    cands = [b for b in queue if is_free(b, slot, rows, cols)]
    if not cands:
        return None
    if updates is None:
        return cands[0]
    return min(cands, key=lambda b: updates[b.id])  # min keeps the first of the least


def remaining_time(queued: float, speed: float, in_flight: Sequence[tuple[float, float | None]],
                   now: float) -> float:
    """Expected seconds until a slot ends its queue and its tasks in flight.

    Parameters
    ----------
    queued : float
        The cost model's seconds of the slot's queued blocks on the slot.
    speed : float
        The slot's measured seconds per expected second (scales ``queued``).
    in_flight : sequence of (float, float or None)
        The slot's tasks in flight, in order: their expected seconds (already scaled) and when
        each started, or None for one queued behind another task (all of it is left).
    now : float
        The time ``started`` is measured on.

    Returns
    -------
    float

    Examples
    --------
    >>> remaining_time(4.0, 0.5, [(3.0, 10.0), (1.0, None)], now=11.0)
    5.0
    >>> remaining_time(0.0, 1.0, [(1.0, 10.0)], now=12.0)  # overdue: nothing left
    0.0
    """
    left = queued * speed
    for expected, started in in_flight:
        left += expected if started is None else max(0.0, expected - (now - started))
    return left


def time_saved(transfer: float, cost: float, left: float) -> float:
    """Seconds a steal saves: the victim's ``left`` less moving and running the block here.

    Positive: worth stealing. The pure cost of a steal, as distributed's
    ``steal_time_ratio`` is for its work stealing.

    Parameters
    ----------
    transfer : float
        Seconds to move what the block needs to the thief (``bytes / bandwidth + latency``).
    cost : float
        Expected seconds of the block on the thief.
    left : float
        Expected seconds the victim has left (:func:`remaining_time`).

    Returns
    -------
    float

    Examples
    --------
    >>> time_saved(transfer=0.5, cost=1.0, left=4.0)
    2.5
    >>> time_saved(transfer=3.0, cost=1.0, left=4.0) > 0
    False
    """
    return left - (transfer + cost)


@dataclass(frozen=True)
class Victim:
    """A slot a thief may steal from.

    Attributes
    ----------
    slot : int
        Its index.
    name : str
        Its name, for the reason.
    remaining : float
        Its expected seconds left (:func:`remaining_time`).
    queue : sequence of Block
        Its blocks not yet started, in plan order.
    """

    slot: int
    name: str
    remaining: float
    queue: Sequence[Block]


@dataclass(frozen=True)
class Steal:
    """A steal decision: the block to move (None: nothing) and why.

    Attributes
    ----------
    block : Block or None
        The block the thief takes, or None.
    victim : Victim or None
        The slot it comes from, or that was looked at and kept its blocks; None when no slot
        had a block free for the thief.
    reason : str
        For a steal, the reason its event carries.
    need : float
        Seconds to move and run the block on the thief (0 when no block was weighed).
    """

    block: Block | None
    victim: Victim | None
    reason: str
    need: float = 0.0


def choose_steal(thief: int, victims: Sequence[Victim], rows: Mapping[int, int],
                 cols: Mapping[int, int], updates: Mapping[int, int],
                 transfer: Callable[[Block], float], cost: Callable[[Block], float]) -> Steal:
    """What a slot that ran dry steals, if anything, and why.

    The victims are tried from the most expected remaining time down (ties: the lower slot
    index); the first with a block free for the thief (:func:`pick`, least updated first)
    decides alone: its block moves if :func:`time_saved` is positive, else nothing does.

    Parameters
    ----------
    thief : int
        The index of the slot that ran dry.
    victims : sequence of Victim
        The slots (the thief and slots with empty queues are passed over).
    rows, cols : mapping of int to int
        Row (column) stratum -> the index of the slot whose tasks in flight hold it.
    updates : mapping of int to int
        Block id -> times it ran so far.
    transfer, cost : callable (Block) -> float
        Seconds to move a block to the thief, and to run it there. Asked only for the block
        weighed, transfer first.

    Returns
    -------
    Steal
        ``block`` None when nothing is stolen: no slot has queued blocks, every queued block
        shares a stratum with another slot's task in flight, or moving costs more than it saves.

    Examples
    --------
    >>> from mgpu.sched.blocks import Block
    >>> slow = Victim(1, "cpu", remaining=6.0, queue=[Block(3, 3, 3), Block(4, 4, 4)])
    >>> got = choose_steal(0, [slow], {}, {}, {3: 1, 4: 0}, lambda b: 0.5, lambda b: 1.0)
    >>> got.block.id, got.reason
    (4, 'from cpu: moving and running it here takes 1.5 s, cpu has 6 s left')
    >>> choose_steal(0, [slow], {}, {}, {3: 1, 4: 0}, lambda b: 9.0, lambda b: 1.0).block is None
    True
    """
    order = sorted((v for v in victims if v.slot != thief and v.queue),
                   key=lambda v: (-v.remaining, v.slot))
    if not order:
        return Steal(None, None, "no other slot has blocks queued")
    for v in order:
        b = pick(v.queue, thief, rows, cols, updates)
        if b is None:
            continue
        move, run = transfer(b), cost(b)
        need = move + run
        if time_saved(move, run, v.remaining) > 0:
            return Steal(b, v, f"from {v.name}: moving and running it here takes {need:.3g} s, "
                               f"{v.name} has {v.remaining:.3g} s left", need)
        return Steal(None, v, f"not block {b.id} from {v.name}: moving and running it here "
                              f"takes {need:.3g} s, {v.name} has only {v.remaining:.3g} s left",
                     need)
    return Steal(None, None, "every queued block shares a row or a column with another slot's "
                             "task in flight")
