"""A block scheduler over futures: static plan, then work stealing. It runs wherever its
loop is called: on the client over Dask futures, or beside the slots (matrix
factorisation runs it on a block host, :meth:`mgpu.mf.hosts.BlockHost.drive`).

Generic: blocks (a row and a column stratum, a size, an owner from the static plan), slots
(a GPU worker, or one thread of a CPU worker), a function that submits a block to a slot and
returns its future (a Dask future, or a ``concurrent.futures.Future`` such as a call to a
block host of :mod:`mgpu.mf.hosts`), and a cost model. Used by HSGD* and by any job cut into
blocks.

- A block is submitted to its slot's worker by ``run`` (a Dask task pinned there with
  ``workers=[...]``, ``allow_other_workers=False``, so Dask's own stealing stays out, or a
  call to an actor on that worker).
- Two running blocks never share a row or a column stratum (the SGD conflict rule).
- Among the free blocks a slot may take, the least updated goes first.
- A slot whose own queue has nothing free steals from the slot with the most expected
  remaining time, if moving and running the block there (``transfer + cost``) finishes before
  the victim would reach the end of its queue; the expected times are the cost model's,
  scaled per slot by how long its blocks really took so far.
- Every decision is an :class:`Event` with a reason, kept in :attr:`BlockScheduler.events` and
  logged to the Dask scheduler at the end of each epoch under the topics ``mgpu-assign`` and
  ``mgpu-steal`` (one message per epoch and topic: a logging round trip per block would cost
  as much as the block's own task).
  ``deterministic=True`` turns stealing off and fixes the order.
- A slot may run several of its own blocks in one task (``batch``): further free blocks of
  its queue in the column of the one it picked, run one after the other. They share that
  column, so they never run at once; the task's round trip is paid once, not per block,
  which matters for a GPU whose blocks take less time than a round trip.
- A slot may have tasks queued on its worker behind the one it runs (``ahead``). A queued
  block may share a stratum only with its own slot's tasks in flight; ``run`` makes each
  task wait for the segments the tasks before it leave (Dask futures as its arguments, or the
  versions a block host waits for), so it starts once those ended, without a round trip
  through this loop. Then "running" above means in flight: two
  slots' tasks in flight never share a stratum.
- The loop hears of completions through the futures' done callbacks and never fetches a
  finished block's result (that would copy its segments to the client); it asks a failed
  one for its error, which stops the epoch.

The decisions (which block next, whether and what to steal) are pure functions of
:mod:`mgpu.sched.steal`, tested without a cluster; an epoch's state (queues, tasks in flight,
held strata) lives on an :class:`_Epoch`, which feeds them and carries them out;
:meth:`BlockScheduler.story` reads back what happened to a block.
"""
from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mgpu.sched.blocks import Block, Event, Slot, story
from mgpu.sched.steal import Victim, choose_steal, is_free, pick, remaining_time

logger = logging.getLogger(__name__)

__all__ = ["Block", "BlockScheduler", "Event", "Slot"]


def _failed(fut: Any) -> bool:
    """Whether a finished future (Dask's, or a ``concurrent.futures.Future``) failed."""
    status = getattr(fut, "status", None)
    if isinstance(status, str):
        return status != "finished"
    return fut.cancelled() or fut.exception() is not None


@dataclass
class _Running:
    """A task in flight: its blocks, its slot and what the slot's speed is learnt from."""

    blocks: tuple[Block, ...]
    slot: int
    start: float  # when it was submitted, or when the slot's task before it ended
    expected: float
    task: int
    queued: bool = False  # behind another task of its slot (``ahead``)


class _Held:
    """Row or column strata held by tasks in flight: the slot holding each, and how many of
    its tasks use it (a slot's queued tasks may share a stratum with its running one)."""

    def __init__(self) -> None:
        self.holder: dict[int, int] = {}  # stratum -> slot
        self._count: dict[int, int] = {}  # stratum -> that slot's tasks in flight using it

    def hold(self, key: int, s: int) -> None:
        if key in self.holder:
            self._count[key] += 1
        else:
            self.holder[key] = s
            self._count[key] = 1

    def release(self, key: int) -> None:
        self._count[key] -= 1
        if not self._count[key]:
            del self._count[key], self.holder[key]


class _Epoch:
    """One epoch of a :class:`BlockScheduler`: its queues, tasks in flight and held strata.

    The decisions are :mod:`mgpu.sched.steal`'s pure functions; this object feeds them the
    epoch's state and carries them out (:meth:`fill`, :meth:`steal`, :meth:`submit`,
    :meth:`finish`). The scheduler keeps what outlives the epoch: the events, the update
    counts, the slots' measured speeds and the cost model's answers.
    """

    def __init__(self, sched: BlockScheduler) -> None:
        self.sched = sched
        self.queues = [list(q) for q in sched.plan]
        # each queue's expected seconds on its own slot, before the slot's speed factor
        self.queued = [sum(sched._base(b, s) for b in q) for s, q in enumerate(self.queues)]
        self.running: dict[Any, _Running] = {}
        self.order: list[list[Any]] = [[] for _ in sched.slots]  # each slot's futures, in order
        self.depth = [1 + max(0, int(sched.ahead(sl))) if sched.ahead is not None else 1
                      for sl in sched.slots]
        # completions through a queue fed by the futures' done callbacks, which wakes this
        # loop at once (distributed's as_completed checks its queue outside its condition
        # and waits in 100 ms polls, so a completion can go unseen that long)
        self.finished: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.rows = _Held()
        self.cols = _Held()

    def busy(self) -> bool:
        """Whether blocks are left to start or tasks to hear from."""
        return any(self.queues) or bool(self.running)

    def pick(self, q: list[Block], s: int) -> Block | None:
        """The block of ``q`` slot ``s`` takes next (least updated, or plan order)."""
        updates = None if self.sched.deterministic else self.sched.updates
        return pick(q, s, self.rows.holder, self.cols.holder, updates)

    def remaining(self, s: int, now: float) -> float:
        """Slot ``s``'s expected seconds left: its queue and its tasks in flight."""
        in_flight = [(r.expected, None if r.queued else r.start)
                     for r in (self.running[f] for f in self.order[s])]
        return remaining_time(self.queued[s], self.sched._speed[s], in_flight, now)

    def fill(self, s: int) -> None:
        """Slot ``s`` starts free blocks of its own queue until it has ``ahead`` tasks queued."""
        while len(self.order[s]) < self.depth[s]:
            b = self.pick(self.queues[s], s)
            if b is None:
                break
            self.submit(b, s, "assign", "own queue" if not self.order[s] else
                        f"own queue, behind {len(self.order[s])} task(s) of this slot", s)

    def steal(self, s: int, now: float) -> None:
        """Slot ``s``, dry, steals a block from the slot with the most time left, if worth it."""
        sched = self.sched
        victims = [Victim(v, sched.slots[v].name, self.remaining(v, now), self.queues[v])
                   for v in range(len(sched.slots)) if v != s and self.queues[v]]
        got = choose_steal(s, victims, self.rows.holder, self.cols.holder, sched.updates,
                           lambda b: sched._transfer(b, s), lambda b: sched._cost(b, s))
        if got.block is not None and got.victim is not None:
            self.submit(got.block, s, "steal", got.reason, got.victim.slot)
        else:  # no event: nothing happened, but a debug log says why
            logger.debug("%s steals nothing: %s", sched.slots[s].name, got.reason)

    def _group(self, b: Block, s: int, kind: str, owner: int) -> list[Block]:
        """``b`` and the blocks of its owner's queue that run after it in the same task:
        free, in its column, each in another row, up to the slot's ``batch``."""
        sched = self.sched
        group = [b]
        limit = sched.batch(sched.slots[s]) if sched.batch is not None and kind == "assign" \
            else 1
        rows = {b.row}
        for o in self.queues[owner]:
            if len(group) >= limit:
                break
            if o is not b and o.col == b.col and o.row not in rows and \
                    is_free(o, s, self.rows.holder, self.cols.holder):
                group.append(o)
                rows.add(o.row)
        return group

    def submit(self, b: Block, s: int, kind: str, reason: str, owner: int) -> None:
        """Start block ``b`` of ``owner``'s queue on slot ``s`` (with its ``batch``), as one
        task, and record why."""
        sched = self.sched
        group = self._group(b, s, kind, owner)
        sched._tasks += 1
        for k, o in enumerate(group):
            self.queues[owner].remove(o)
            self.queued[owner] -= sched._base(o, owner)
            self.rows.hold(o.row, s)
            sched._event(kind, o, s, reason if not k else
                         f"{reason}; after block {group[k - 1].id} in the same task",
                         sched._tasks)
        self.cols.hold(b.col, s)
        fut = sched.run(tuple(group), sched.slots[s])
        self.running[fut] = _Running(tuple(group), s, time.perf_counter(),
                                     sum(sched._cost(o, s) for o in group), sched._tasks,
                                     queued=bool(self.order[s]))
        self.order[s].append(fut)
        fut.add_done_callback(self.finished.put)

    def wait(self) -> tuple[list[Any], float]:
        """The futures that finished (at least one; blocks until then), and the time heard."""
        done = [self.finished.get()]
        while not self.finished.empty():
            done.append(self.finished.get())
        return done, time.perf_counter()

    def finish(self, fut: Any, end: float) -> None:
        """A task ended at ``end``: free its strata, learn its slot's speed, record it; its
        slot's next queued task starts now. A failed task raises its own error."""
        sched = self.sched
        r = self.running.pop(fut)
        # a finished block's result stays on its worker (asking for it would copy
        # it here, a tenth of a second per block); a failed one stops the epoch
        if _failed(fut):
            fut.result()  # raises the block's own error
        self.order[r.slot].remove(fut)
        for nxt in self.order[r.slot][:1]:  # the slot's next task starts now
            if self.running[nxt].queued:
                self.running[nxt].queued = False
                self.running[nxt].start = end
        took = end - r.start
        speed = sched._speed[r.slot]
        base = r.expected / speed if speed else r.expected
        if base > 0:  # learn the slot's real speed against the model
            sched._speed[r.slot] = 0.5 * speed + 0.5 * took / base
        self.cols.release(r.blocks[0].col)
        for b in r.blocks:
            self.rows.release(b.row)
            sched.updates[b.id] += 1
            sched._event("finish", b, r.slot, f"took {took:.3g} s" if len(r.blocks) == 1
                         else f"took {took:.3g} s for {len(r.blocks)} blocks in one task",
                         r.task)


@dataclass
class BlockScheduler:
    """Run every block once per epoch on the slots, static plan first, then stealing.

    Parameters
    ----------
    blocks : sequence of Block
    slots : sequence of Slot
    run : callable (tuple of Block, Slot) -> distributed.Future or concurrent.futures.Future
        Submits blocks to one slot (pinned to ``slot.worker``), to run one after the other in
        the given order, and returns the future of that task; without ``batch`` the tuple
        holds one block.
    cost : callable (Block, Slot) -> float, optional
        Expected seconds of a block on a slot; default proportional to the block's size.
        Asked once per block and slot (the measured speed of each slot scales it later).
    transfer : callable (Block, Slot) -> float, optional
        Seconds to move what a block needs to a slot that does not own it; default 0. Asked
        once per block and slot.
    deterministic : bool, default=False
        No stealing; each slot runs its own blocks in plan order.
    client : distributed.Client or mgpu.mf.hosts.Driver, optional
        Where events are logged (its ``log_event``, to the Dask scheduler); default the
        current client.
    batch : callable (Slot) -> int, optional
        The most blocks a slot runs in one task (default 1). Only blocks of the slot's own
        queue sharing the first one's column are added, so stealing still moves single blocks.
    ahead : callable (Slot) -> int, optional
        Tasks a slot may have queued behind the one it runs (default 0): they are submitted
        at once and start on the worker as soon as the one before ends, without waiting for
        the client to hear of it, which hides a round trip per task. A queued block may
        share a row or column only with the same slot's earlier tasks, so ``run`` must make
        each task wait for the segments the task that last updated them leaves (as futures,
        or as versions a block host waits for): those tasks then run one after the other. A
        slot steals only once it has nothing in flight.
    epochs_done : int, default=0
        Epochs run before this scheduler (a job whose blocks changed owners): its events are
        numbered after them.

    Attributes
    ----------
    plan : list of list of Block
        The static plan: each slot's queue, in the order it runs it.
    events : list of Event
        Every decision and completion so far, in order (:meth:`story` picks a block's).
    updates : dict of int to int
        Block id -> times it ran.
    """

    blocks: Sequence[Block]
    slots: Sequence[Slot]
    run: Callable[[tuple[Block, ...], Slot], Any]
    cost: Callable[[Block, Slot], float] | None = None
    transfer: Callable[[Block, Slot], float] | None = None
    deterministic: bool = False
    client: Any = None
    batch: Callable[[Slot], int] | None = None
    ahead: Callable[[Slot], int] | None = None
    epochs_done: int = 0
    events: list[Event] = field(default_factory=list)
    updates: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.slots:
            raise ValueError("The 'slots' parameter of BlockScheduler must name at least one slot.")
        ids = [b.id for b in self.blocks]
        if len(set(ids)) != len(ids):
            raise ValueError("The 'blocks' parameter of BlockScheduler has repeated block ids.")
        for b in self.blocks:
            if b.owner is not None and not 0 <= b.owner < len(self.slots):
                raise ValueError(f"Block {b.id} is owned by slot {b.owner}, but there are "
                                 f"{len(self.slots)} slots.")
        self.updates = {b.id: 0 for b in self.blocks}
        self._speed: list[float] = [1.0] * len(self.slots)  # measured / expected, per slot
        self._t0: float = time.perf_counter()
        self._epoch: int = self.epochs_done
        self._tasks: int = 0  # tasks submitted, over every epoch
        self._base_cost: dict[tuple[int, int], float] = {}
        self._transfer_cost: dict[tuple[int, int], float] = {}
        self.plan: list[list[Block]] = self._static_plan()

    # ------------------------------------------------------------------ model and plan
    def _base(self, b: Block, s: int) -> float:
        """The cost model's seconds of a block on a slot, asked once (the loop over an
        epoch's blocks asks again and again)."""
        key = (b.id, s)
        got = self._base_cost.get(key)
        if got is None:
            got = self._base_cost[key] = (self.cost(b, self.slots[s]) if self.cost is not None
                                          else float(b.size))
        return got

    def _cost(self, b: Block, s: int) -> float:
        return self._base(b, s) * self._speed[s]

    def _transfer(self, b: Block, s: int) -> float:
        key = (b.id, s)
        got = self._transfer_cost.get(key)
        if got is None:
            got = self._transfer_cost[key] = (self.transfer(b, self.slots[s])
                                              if self.transfer is not None else 0.0)
        return got

    def _static_plan(self) -> list[list[Block]]:
        """Owned blocks to their owners; the rest to the slot that would finish them first."""
        plan: list[list[Block]] = [[] for _ in self.slots]
        load = [0.0] * len(self.slots)
        for b in self.blocks:
            if b.owner is not None:
                plan[b.owner].append(b)
                load[b.owner] += self._cost(b, b.owner)
        free = sorted((b for b in self.blocks if b.owner is None),
                      key=lambda b: (-max(self._cost(b, s) for s in range(len(self.slots))), b.id))
        for b in free:
            s = min(range(len(self.slots)), key=lambda s: (load[s] + self._cost(b, s), s))
            plan[s].append(b)
            load[s] += self._cost(b, s)
        return plan

    # ------------------------------------------------------------------ events
    def _event(self, kind: str, b: Block, s: int, reason: str, task: int) -> None:
        ev = Event(time.perf_counter() - self._t0, kind, b.id, self.slots[s].name, reason,
                   self._epoch, task)
        self.events.append(ev)
        logger.debug("%s block %d on %s: %s", kind, b.id, self.slots[s].name, reason)

    def _log(self, events: list[Event]) -> None:
        """An epoch's assignments and steals to the Dask scheduler's event log, one message
        per topic."""
        for kind in ("assign", "steal"):
            got = [{"block": e.block, "slot": e.slot, "reason": e.reason, "t": e.t}
                   for e in events if e.kind == kind]
            if got:
                self.client.log_event(f"mgpu-{kind}", {"epoch": self._epoch, "events": got})

    # ------------------------------------------------------------------ one epoch
    def run_epoch(self) -> list[Event]:
        """Run every block once; returns this epoch's events.

        Each round, every slot starts free blocks of its own queue (up to its ``ahead``),
        and a slot left with nothing in flight steals (not in ``deterministic`` mode); then
        the loop waits for a task to finish. A failed task raises its own error.

        Returns
        -------
        list of Event
            The epoch's assignments, steals and finishes, in order; also appended to
            :attr:`events` and logged to the Dask scheduler.

        Raises
        ------
        RuntimeError
            If blocks are left and none can run (a bug).
        """
        if self.client is None:
            from mgpu.distributed.cluster import current_client

            self.client = current_client()
        self._epoch += 1
        first = len(self.events)
        run = _Epoch(self)
        while run.busy():
            now = time.perf_counter()
            for s in range(len(self.slots)):
                run.fill(s)
                if not run.order[s] and not self.deterministic:
                    run.steal(s, now)
            if not run.running:
                raise RuntimeError("BlockScheduler stalled with blocks left and none runnable; "
                                   "this is a bug.")
            done, end = run.wait()
            for fut in done:
                run.finish(fut, end)
        self._log(self.events[first:])
        return self.events[first:]

    def story(self, *blocks: Block | int) -> list[Event]:
        """What happened to the given blocks (or block ids), in order, over every epoch.

        Parameters
        ----------
        *blocks : Block or int

        Returns
        -------
        list of Event
            Their assignments, steals and finishes, as in :attr:`events`.
        """
        return story(self.events, *blocks)
