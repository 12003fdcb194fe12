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
"""
from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mgpu.sched.blocks import Block, Event, Slot

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
    blocks: tuple[Block, ...]
    slot: int
    start: float  # when it was submitted, or when the slot's task before it ended
    expected: float
    task: int
    queued: bool = False  # behind another task of its slot (``ahead``)


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
    """

    blocks: Sequence[Block]
    slots: Sequence[Slot]
    run: Callable[[Block, Slot], Any]
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
        self._speed = [1.0] * len(self.slots)  # measured / expected, per slot
        self._t0 = time.perf_counter()
        self._epoch = self.epochs_done
        self._tasks = 0
        self._base_cost: dict[tuple[int, int], float] = {}
        self._transfer_cost: dict[tuple[int, int], float] = {}
        self.plan = self._static_plan()

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
        """Run every block once; returns this epoch's events."""
        if self.client is None:
            from mgpu.distributed.cluster import current_client

            self.client = current_client()
        self._epoch += 1
        first = len(self.events)
        queues = [list(q) for q in self.plan]
        # each queue's expected seconds on its own slot, before the slot's speed factor
        queued = [sum(self._base(b, s) for b in q) for s, q in enumerate(queues)]
        running: dict[Any, _Running] = {}
        order: list[list[Any]] = [[] for _ in self.slots]  # each slot's futures, in order
        depth = [1 + max(0, int(self.ahead(sl))) if self.ahead is not None else 1
                 for sl in self.slots]
        # completions through a queue fed by the futures' done callbacks, which wakes this
        # loop at once (distributed's as_completed checks its queue outside its condition
        # and waits in 100 ms polls, so a completion can go unseen that long)
        finished: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # row or column stratum -> [the slot holding it, its tasks in flight that use it]
        rows_held: dict[int, list[int]] = {}
        cols_held: dict[int, list[int]] = {}

        def free(b: Block, s: int) -> bool:
            r, c = rows_held.get(b.row), cols_held.get(b.col)
            return (r is None or r[0] == s) and (c is None or c[0] == s)

        def hold(held: dict[int, list[int]], key: int, s: int) -> None:
            if key in held:
                held[key][1] += 1
            else:
                held[key] = [s, 1]

        def release(held: dict[int, list[int]], key: int) -> None:
            held[key][1] -= 1
            if not held[key][1]:
                del held[key]

        def pick(q: list[Block], s: int) -> Block | None:
            cands = [b for b in q if free(b, s)]
            if not cands:
                return None
            if self.deterministic:
                return cands[0]
            return min(cands, key=lambda b: self.updates[b.id])  # the first of the least

        def remaining(s: int, now: float) -> float:
            left = queued[s] * self._speed[s]
            for f in order[s]:
                r = running[f]
                left += r.expected if r.queued else max(0.0, r.expected - (now - r.start))
            return left

        def start(b: Block, s: int, kind: str, reason: str, owner: int) -> None:
            group = [b]
            limit = self.batch(self.slots[s]) if self.batch is not None and kind == "assign" \
                else 1
            rows = {b.row}
            for o in queues[owner]:
                if len(group) >= limit:
                    break
                if o is not b and o.col == b.col and o.row not in rows and free(o, s):
                    group.append(o)
                    rows.add(o.row)
            self._tasks += 1
            for k, o in enumerate(group):
                queues[owner].remove(o)
                queued[owner] -= self._base(o, owner)
                hold(rows_held, o.row, s)
                self._event(kind, o, s, reason if not k else
                            f"{reason}; after block {group[k - 1].id} in the same task",
                            self._tasks)
            hold(cols_held, b.col, s)
            fut = self.run(tuple(group), self.slots[s])
            running[fut] = _Running(tuple(group), s, time.perf_counter(),
                                    sum(self._cost(o, s) for o in group), self._tasks,
                                    queued=bool(order[s]))
            order[s].append(fut)
            fut.add_done_callback(finished.put)

        while any(queues) or running:
            now = time.perf_counter()
            for s in range(len(self.slots)):
                while len(order[s]) < depth[s]:
                    b = pick(queues[s], s)
                    if b is None:
                        break
                    start(b, s, "assign", "own queue" if not order[s] else
                          f"own queue, behind {len(order[s])} task(s) of this slot", s)
                if order[s] or self.deterministic:
                    continue
                victims = sorted((v for v in range(len(self.slots)) if v != s and queues[v]),
                                 key=lambda v: (-remaining(v, now), v))
                for v in victims:
                    b = pick(queues[v], s)
                    if b is None:
                        continue
                    need = self._transfer(b, s) + self._cost(b, s)
                    left = remaining(v, now)
                    if need < left:
                        start(b, s, "steal",
                              f"from {self.slots[v].name}: moving and running it here takes "
                              f"{need:.3g} s, {self.slots[v].name} has {left:.3g} s left", v)
                    break  # only the slot with the most remaining time is a victim
            if not running:
                raise RuntimeError("BlockScheduler stalled with blocks left and none runnable; "
                                   "this is a bug.")
            done = [finished.get()]
            while not finished.empty():
                done.append(finished.get())
            end = time.perf_counter()
            for fut in done:
                r = running.pop(fut)
                # a finished block's result stays on its worker (asking for it would copy
                # it here, a tenth of a second per block); a failed one stops the epoch
                if _failed(fut):
                    fut.result()  # raises the block's own error
                order[r.slot].remove(fut)
                for nxt in order[r.slot][:1]:  # the slot's next task starts now
                    if running[nxt].queued:
                        running[nxt].queued = False
                        running[nxt].start = end
                took = end - r.start
                base = r.expected / self._speed[r.slot] if self._speed[r.slot] else r.expected
                if base > 0:  # learn the slot's real speed against the model
                    self._speed[r.slot] = 0.5 * self._speed[r.slot] + 0.5 * took / base
                release(cols_held, r.blocks[0].col)
                for b in r.blocks:
                    release(rows_held, b.row)
                    self.updates[b.id] += 1
                    self._event("finish", b, r.slot, f"took {took:.3g} s" if len(r.blocks) == 1
                                else f"took {took:.3g} s for {len(r.blocks)} blocks in one task",
                                r.task)
        self._log(self.events[first:])
        return self.events[first:]
