"""SPMD jobs over Dask: one long-running task per worker, a communicator between them.

The design of cuML's multi-GPU estimators (raft-dask's ``Comms``): Dask places the data; then
:func:`spmd` starts **one task per worker** holding tiles of the first collection, in one
submission; those tasks form a communicator (:mod:`mgpu.distributed.comms`: NCCL between GPU
workers, a host implementation between CPU workers), and each runs the job's function on its
local tiles, exchanging what the loop needs with collectives on its own buffers. The client
waits once per job, not once per step, and follows progress through Dask events.

- Communicators are cached per set of workers (and kind): the second job on the same workers
  reuses the links and the NCCL communicator; a job on another set, or after a failure, makes
  a new one.
- Every collective has a timeout (``mgpu.spmd.timeout``) and names the worker that did not
  arrive; a worker that dies ends the job on every rank with an error naming it.
- Checkpoints: ``comm.checkpoint(iteration, states)`` keeps each tile's state on the host of
  its worker and of the next rank's. When a worker is lost, :func:`spmd` (up to
  ``mgpu.spmd.restarts`` times) finds the latest iteration that every tile's state survived
  at, places the lost worker's tiles on the workers that remain (Dask remakes them from the
  tasks that hold them), and starts the function again with ``comm.resumed`` set. A worker
  lost after its rank returned, before the client fetched the result, counts as lost too.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Any

import dask.array as da
import distributed
import numpy as np
from dask.utils import parse_timedelta

from mgpu import config
from mgpu.backends import is_gpu_array, to_host
from mgpu.distributed.cluster import CLIENT, current_client, workers_now
from mgpu.distributed.collection import block_futures
from mgpu.distributed.comms import (
    CollectiveError,
    CollectiveMismatch,
    CollectiveTimeout,
    VERDICT,
    HostComm,
    NcclComm,
    WorkerLost,
    listen,
    mesh,
    send_obj,
)
from mgpu.distributed.tiles import RowTiles
from mgpu.ops.validation import Interval, IsCallable, MatchesPattern, check_param

logger = logging.getLogger(__name__)

__all__ = ["CollectiveError", "CollectiveMismatch", "CollectiveTimeout", "Comm", "Part",
           "WorkerLost", "spmd"]


@dataclass(frozen=True)
class Part:
    """One tile of a collection, as the rank holding it sees it.

    Attributes
    ----------
    index : int
        The tile's number (its place among the collection's row tiles).
    rows : slice
        The tile's rows of the whole matrix.
    data : object
        The tile itself (scipy/cupyx CSR, or a numpy/cupy block).
    """

    index: int
    rows: slice
    data: Any


# ------------------------------------------------------------------ state on each worker

# keyed by (communicator id, worker address): workers of a threaded cluster share a process
_LISTENERS: dict[tuple[str, str], Any] = {}
_COMMS: dict[tuple[str, str], Any] = {}
# (job key, worker address) -> {tile: {iteration: state}}; the last two iterations kept
_CHECKPOINTS: dict[tuple[str, str], dict[int, dict[int, dict[str, np.ndarray]]]] = {}
_LOCK = threading.Lock()


def _host_of(address: str) -> str:
    try:
        host = distributed.comm.get_address_host(address)
    except Exception:  # an address without a host (inproc): the workers share this machine
        return "127.0.0.1"
    return host if host and not address.startswith("inproc") else "127.0.0.1"


def _open(comm_id: str, dask_worker: Any = None) -> tuple[str, int]:
    """Run on each worker (``client.run``) before a new communicator's first job."""
    host = _host_of(dask_worker.address)
    s = listen(host)
    with _LOCK:
        _LISTENERS[(comm_id, dask_worker.address)] = s
    return host, s.getsockname()[1]


def _forget(comm_id: str, dask_worker: Any = None) -> None:
    """Close this worker's communicator ``comm_id`` and its listener."""
    key = (comm_id, dask_worker.address)
    with _LOCK:
        comm, listener = _COMMS.pop(key, None), _LISTENERS.pop(key, None)
    for c in (comm, listener):
        if c is not None:
            try:
                c.close()
            except Exception:  # already closed by a failure
                logger.debug("closing %s failed", key, exc_info=True)


def _checkpoint_index(job_key: str, dask_worker: Any = None) -> dict[int, list[int]]:
    held = _CHECKPOINTS.get((job_key, dask_worker.address), {})
    return {tile: sorted(its) for tile, its in held.items()}


def _checkpoint_take(job_key: str, iteration: int, tiles: list[int],
                     dask_worker: Any = None) -> dict[int, dict[str, np.ndarray]]:
    held = _CHECKPOINTS.get((job_key, dask_worker.address), {})
    return {t: held[t][iteration] for t in tiles if iteration in held.get(t, {})}


def _checkpoint_drop(job_key: str, dask_worker: Any = None) -> None:
    _CHECKPOINTS.pop((job_key, dask_worker.address), None)


def _keep(job_key: str, address: str, iteration: int,
          states: dict[int, dict[str, np.ndarray]]) -> None:
    with _LOCK:
        held = _CHECKPOINTS.setdefault((job_key, address), {})
        for tile, state in states.items():
            its = held.setdefault(tile, {})
            its[iteration] = state
            for old in sorted(its)[:-2]:
                del its[old]


class Comm:
    """What the job's function gets: its rank's communicator, progress and checkpoints.

    The collectives are those of the communicator (:class:`~mgpu.distributed.comms.HostComm`
    on CPU workers, :class:`~mgpu.distributed.comms.NcclComm` on GPU workers): ``allreduce``,
    ``allgather``, ``broadcast``, ``sendrecv``, ``barrier`` on arrays of ``xp``, and
    ``gather_obj``, ``bcast_obj``, ``allgather_obj``, ``allreduce_obj``, ``sendrecv_obj`` for
    small Python objects over the host channel.

    Attributes
    ----------
    rank, size : int
    workers : list of str
        The workers' addresses, in rank order.
    xp : module
        numpy or cupy: the array module of the collectives.
    resumed : tuple or None
        ``(iteration, {tile: state})`` when the job was started again after a lost worker:
        the latest checkpoint every tile survived, for this rank's tiles; None otherwise.
    """

    def __init__(self, inner: Any, job: _Job, resumed: Any):
        self._inner, self._job = inner, job
        self.rank, self.size, self.workers = inner.rank, inner.size, inner.workers
        self.xp = inner.xp
        self.resumed = resumed
        self.reports = 0
        self._host = inner.host if isinstance(inner, NcclComm) else inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def report(self, record: dict[str, Any]) -> None:
        """Send a progress record (numbers and strings) to the client's ``progress``
        callback; only rank 0's are sent, without waiting for anything."""
        if self.rank != 0 or self._job.topic is None:
            return
        clean = {k: (v.item() if hasattr(v, "item") else v) for k, v in record.items()}
        # distributed adds the worker's address to a dict it logs: wrap the record
        distributed.get_worker().log_event(self._job.topic, {"record": clean})
        self.reports += 1

    def checkpoint(self, iteration: int, states: dict[int, dict[str, Any]]) -> None:
        """Keep ``states`` (tile → {name: array}) of this iteration, on this worker's host
        and on the next rank's, for a restart after a lost worker. Every rank calls it at
        the same iteration (it is a collective)."""
        host = {int(t): {k: np.array(to_host(v)) for k, v in s.items()}
                for t, s in states.items()}
        address = distributed.get_worker().address
        _keep(self._job.key, address, iteration, host)
        if self.size > 1:
            prev = self._host.sendrecv_obj(host, (self.rank + 1) % self.size,
                                           (self.rank - 1) % self.size)
            _keep(self._job.key, address, iteration, prev)


class _Stale(CollectiveError):
    """A worker lacks the cached communicator: the client makes a new one and runs again."""


@dataclass
class _Job:
    fn: Callable[..., Any]
    args: tuple
    kind: str
    comm_id: str
    key: str
    workers: list[str]
    addresses: list[tuple[str, int]]
    timeout: float
    connect_timeout: float
    topic: str | None
    layout: list[list[list[tuple[int, slice]]]] = field(default_factory=list)


def _communicator(job: _Job, rank: int, address: str) -> Any:
    key = (job.comm_id, address)
    with _LOCK:
        comm = _COMMS.get(key)
        listener = _LISTENERS.pop(key, None)
    if comm is None:
        if listener is None:
            raise _Stale(f"worker {address} has no communicator {job.comm_id} (it was "
                         "restarted, or closed it after a failed job)", address)
        try:
            links = mesh(job.comm_id, rank, job.addresses, listener, job.connect_timeout)
        finally:
            listener.close()
        host = HostComm(rank, len(job.workers), job.workers, links, job.timeout)
        comm = NcclComm(host) if job.kind == "nccl" else host
        with _LOCK:
            _COMMS[key] = comm
    (comm.host if isinstance(comm, NcclComm) else comm).timeout = job.timeout
    return comm


def _rank_task(job: _Job, rank: int, resumed: Any, *blocks: Any) -> dict[str, Any]:
    """One rank of a job: its communicator, its tiles as Parts, the function."""
    address = distributed.get_worker().address
    comm = _communicator(job, rank, address)
    parts, it = [], iter(blocks)
    for layout in job.layout[rank]:
        parts.append([Part(i, rows, next(it)) for i, rows in layout])
    ctx = Comm(comm, job, None if resumed is None else (resumed.iteration, resumed.states))
    try:
        out = job.fn(ctx, *parts, *job.args)
    except BaseException as exc:
        # the other ranks wait in a collective for this one: tell them, then forget the links
        if not isinstance(exc, CollectiveError):
            _tell_others(ctx._host, f"rank {rank} (worker {address}) failed: "
                                    f"{type(exc).__name__}: {exc}", address)
        _forget(job.comm_id, distributed.get_worker())
        raise
    return {"result": out, "reports": ctx.reports}


def _tell_others(host: HostComm, message: str, address: str) -> None:
    for r, s in list(host._links.items()):
        try:
            send_obj(s, ("mgpu-abort", "failed", message, address), VERDICT)
        except Exception:  # that peer is gone too
            logger.debug("could not tell rank %d", r, exc_info=True)


# ----------------------------------------------------------------------------- the client

_NAME = MatchesPattern(r"[A-Za-z0-9_-]{1,64}", "a name of 1 to 64 letters, digits, '-', '_'")

# per client: (kind, workers) -> communicator id, and a lock so two jobs never share one
_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class _Tiles:
    """A collection as row tiles: each tile's future and rows."""

    blocks: list[Any]
    rows: list[slice]
    gpu: bool


def _check_collection(x: Any, j: int) -> None:
    """Refuse what spmd cannot lay out by rows, before anything is submitted."""
    if isinstance(x, RowTiles):  # placed already, by rows
        return
    if not isinstance(x, da.Array):
        raise TypeError(f"The 'collections' parameter of spmd must hold dask arrays cut by "
                        f"rows or RowTiles. Got {type(x).__name__} at {j} instead.")
    if x.ndim not in (1, 2) or (x.ndim == 2 and x.numblocks[1] != 1):
        raise ValueError(f"The 'collections' parameter of spmd must hold arrays cut by rows "
                         f"only (one chunk of columns). Got chunks {x.chunks} at {j} instead: "
                         "rechunk it with x.rechunk({1: -1}).")
    if any(np.isnan(c) for c in x.chunks[0]):
        raise ValueError(f"The 'collections' parameter of spmd holds an array of unknown "
                         f"chunk sizes at {j}: call x.compute_chunk_sizes() first.")


def _tiles_of(x: Any, client: Any) -> _Tiles:
    # a RowTiles keeps its placement; a dask array is placed (persisted) as it is
    if isinstance(x, RowTiles):
        return _Tiles(list(x.blocks), [x.rows(i) for i in range(len(x))], x.gpu)
    futures = block_futures(x, client)
    bounds = np.concatenate([[0], np.cumsum(x.chunks[0])]).astype(np.int64)
    blocks = [futures[(i,) if x.ndim == 1 else (i, 0)] for i in range(x.numblocks[0])]
    rows = [slice(int(bounds[i]), int(bounds[i + 1])) for i in range(len(blocks))]
    return _Tiles(blocks, rows, is_gpu_array(x._meta))  # GPU tiles: a GPU job (NCCL)


def _owners(blocks: list[Any], client: Any, alive: Sequence[str]) -> list[str]:
    """Each tile's worker: where it is (a tile held by several, copied there by some task
    that read it, goes to the one of them with the fewest tiles so far, so that a copy
    never takes a rank's tiles away from it), or (lost with its worker, never placed) the
    live worker with the fewest tiles."""
    where = client.who_has(blocks)
    held = [sorted(w for w in where.get(f.key, ()) if w in alive) for f in blocks]
    owners: list[str | None] = [h[0] if len(h) == 1 else None for h in held]
    for i, h in enumerate(held):
        if len(h) > 1:
            owners[i] = min(h, key=lambda a: (owners.count(a), a))
    for i, w in enumerate(owners):
        if w is None:
            counts = {a: owners.count(a) for a in alive}
            owners[i] = min(alive, key=lambda a: (counts[a], a))
    return owners  # type: ignore[return-value]


def _communicator_id(client: Any, kind: str, workers: list[str]
                     ) -> tuple[str, list[tuple[str, int]] | None, threading.Lock]:
    """The cached communicator of these workers, or a new one (its listeners opened on the
    workers: ``addresses``; None for a cached one)."""
    cache = _CACHE.setdefault(client, {})
    entry = cache.get((kind, tuple(workers)))
    if entry is not None:
        return entry[0], None, entry[1]
    comm_id = f"mgpu-comm-{uuid.uuid4().hex}"
    opened = client.run(_open, comm_id, workers=list(workers))
    addresses = [tuple(opened[w]) for w in workers]
    lock = threading.Lock()
    cache[(kind, tuple(workers))] = (comm_id, lock)
    return comm_id, addresses, lock  # type: ignore[return-value]


def _drop_communicator(client: Any, kind: str, workers: list[str], comm_id: str) -> None:
    _CACHE.get(client, {}).pop((kind, tuple(workers)), None)
    alive = set(workers_now(client))
    try:
        client.run(_forget, comm_id, workers=[w for w in workers if w in alive])
    except Exception:  # a worker left meanwhile: its links closed with it
        logger.debug("forgetting %s failed", comm_id, exc_info=True)


def _seconds(value: Any) -> float:
    return float(parse_timedelta(value, "s"))


def spmd(fn: Callable[..., Any], *collections: Any, args: tuple = (), client: Any = None,
         name: str = "spmd", progress: Callable[[dict[str, Any]], None] | None = None,
         timeout: float | None = None, restarts: int | None = None) -> list[Any]:
    """Run ``fn`` once on every worker holding tiles of ``collections[0]``, with a
    communicator between them; wait once for all of them.

    Each worker calls ``fn(comm, *parts, *args)``: ``comm`` is its rank's :class:`Comm`
    (collectives on device buffers through NCCL between GPU workers, over a host channel
    between CPU workers; progress; checkpoints), and ``parts[j]`` the list of
    :class:`Part` of collection ``j`` it holds, in tile order. Tile ``i`` of every
    collection goes to the worker of tile ``i`` of the first; ranks follow their first
    tile's order (rank 0 holds tile 0).

    Parameters
    ----------
    fn : callable
        ``fn(comm, *parts, *args)``; it must call the same collectives in the same order on
        every rank. Its return values come back in rank order.
    *collections : dask arrays cut by rows only, or RowTiles
        Every collection has the same number of row tiles. Sparse tiles are scipy CSR on
        CPU workers and cupyx CSR on GPU workers (:func:`mgpu.from_scipy`).
    args : tuple
        Passed to ``fn`` after the parts, the same on every rank.
    client : distributed.Client, optional
        Default: the current one (:func:`mgpu.connect`).
    name : str, default="spmd"
        The job's name in its task keys (``mgpu-<name>-…``).
    progress : callable, optional
        Called on the client with every record rank 0 passes to ``comm.report``, in order,
        in the thread that called spmd (so it may call the cluster itself).
    timeout : float, optional
        Seconds every collective waits for the ranks (default ``mgpu.spmd.timeout``).
    restarts : int, optional
        Times a job whose worker was lost is started again from its last checkpoint
        (default ``mgpu.spmd.restarts``).

    Returns
    -------
    list
        ``fn``'s return value on every rank, in rank order.

    Raises
    ------
    CollectiveTimeout
        When a rank did not arrive at a collective in time (it names the worker).
    WorkerLost
        When a worker died and no restart was left, or no checkpoint had survived.
    CollectiveMismatch
        When ranks called different collectives.
    ValueError, TypeError
        For collections spmd cannot lay out (cut by columns, unknown chunks, unequal tile
        counts, GPU and CPU tiles together), before anything is submitted.

    Examples
    --------
    >>> def total(comm, parts):
    ...     local = sum(float(p.data.sum()) for p in parts)
    ...     return float(comm.allreduce(comm.xp.asarray([local]))[0])
    >>> # spmd(total, mgpu.from_scipy(S, 4)) -> [S.sum()] * number of workers
    """
    check_param(fn, "fn", "spmd", IsCallable())
    check_param(client, "client", "spmd", [CLIENT, None])
    check_param(progress, "progress", "spmd", [IsCallable(), None])
    check_param(timeout, "timeout", "spmd", [Interval(Real, 0, None, closed="neither"), None])
    check_param(restarts, "restarts", "spmd", [Interval(Integral, 0, None), None])
    check_param(name, "name", "spmd", _NAME, " (letters, digits, '-' and '_': it goes into "
                "task keys)")
    if not isinstance(args, tuple):
        raise TypeError(f"The 'args' parameter of spmd must be a tuple. Got "
                        f"{type(args).__name__} instead.")
    if not collections:
        raise ValueError("The 'collections' parameter of spmd needs at least one collection "
                         "to lay the ranks out by: a dask array cut by rows, or a RowTiles.")
    for j, x in enumerate(collections):
        _check_collection(x, j)
    client = client or current_client()
    if client is None:
        raise ValueError("There is no cluster to run spmd on: call mgpu.connect() first, "
                         "or pass client=.")
    tiles = [_tiles_of(x, client) for x in collections]
    counts = {len(t.blocks) for t in tiles}
    if len(counts) != 1:
        raise ValueError(f"The 'collections' parameter of spmd must hold collections of as "
                         f"many row tiles. Got {[len(t.blocks) for t in tiles]} instead.")
    kinds = {t.gpu for t in tiles if t.blocks}
    if len(kinds) > 1:
        raise TypeError("The 'collections' parameter of spmd holds GPU and CPU tiles "
                        "together: put them all on GPU workers or all on CPU workers.")
    timeout = _seconds(config.get("spmd.timeout")) if timeout is None else float(timeout)
    restarts = int(config.get("spmd.restarts")) if restarts is None else restarts
    run = _Run(fn, args, tiles, client, name, progress, timeout,
               "nccl" if kinds == {True} else "host")
    return run.start(restarts)


@dataclass
class _Resume:
    """A restarted rank's checkpoint: the iteration, and its tiles' states."""

    iteration: int
    states: dict[int, dict[str, np.ndarray]]


# errors after which a job may start again from its checkpoint: a worker or a link is gone
_LOST = (WorkerLost, CollectiveTimeout, distributed.scheduler.KilledWorker,
         distributed.comm.CommClosedError)


def _blame(error: BaseException) -> int:
    """The error to raise of those the ranks raised: the function's own first, then ranks
    that called different collectives, then a named worker, then the rest (the others'
    news of it)."""
    if not isinstance(error, CollectiveError):
        return 0
    if isinstance(error, _Stale):  # started again on a new communicator
        return 1
    if isinstance(error, CollectiveMismatch):
        return 2
    return 3 if error.worker is not None else 4


class _Run:
    """One :func:`spmd` job, through its restarts."""

    def __init__(self, fn: Callable[..., Any], args: tuple, tiles: list[_Tiles], client: Any,
                 name: str, progress: Callable[[dict[str, Any]], None] | None,
                 timeout: float, kind: str):
        self.fn, self.args, self.tiles, self.client = fn, args, tiles, client
        self.name, self.progress, self.timeout, self.kind = name, progress, timeout, kind
        self.key = f"mgpu-{name}-{uuid.uuid4().hex}"
        self.connect_timeout = _seconds(config.get("spmd.connect-timeout"))
        self.received = 0
        self.records: queue.SimpleQueue = queue.SimpleQueue()
        self.workers: list[str] = []

    def _alive(self) -> list[str]:
        return sorted(workers_now(self.client))

    def start(self, restarts: int) -> list[Any]:
        resumed: tuple[int, dict] | None = None
        attempt = 0
        try:
            fresh = False
            while True:
                try:
                    return self._once(attempt, resumed)
                except _Stale:
                    # the cache entry is dropped with the failed job: one more try, anew
                    if fresh:
                        raise
                    fresh = True
                except _LOST as exc:
                    # only a worker that left the cluster makes a restart worth it
                    if attempt >= restarts or not set(self.workers) - set(self._alive()):
                        raise
                    attempt += 1
                    resumed = self._latest_checkpoint(exc)
                    logger.warning("%s: %s; starting again from iteration %d on %d worker(s)",
                                   self.name, exc, resumed[0], len(self._alive()))
        finally:
            try:
                self.client.run(_checkpoint_drop, self.key)
            except Exception:  # a worker left meanwhile
                logger.debug("dropping checkpoints failed", exc_info=True)

    def _latest_checkpoint(self, exc: BaseException) -> tuple[int, dict]:
        """The latest iteration whose state survived for every tile, and those states."""
        index = self.client.run(_checkpoint_index, self.key, workers=self._alive())
        n = len(self.tiles[0].blocks)
        common: set[int] | None = None
        for t in range(n):
            its = {it for held in index.values() for it in held.get(t, ())}
            common = its if common is None else common & its
        if not common:
            raise WorkerLost(f"{exc}; no checkpoint survived for every tile, so the job "
                             f"cannot start again (checkpoint more often: "
                             f"mgpu.spmd.checkpoint-every).",
                             getattr(exc, "worker", None)) from exc
        it = max(common)
        states: dict[int, dict[str, np.ndarray]] = {}
        for w, held in index.items():
            need = [t for t, its in held.items() if it in its and t not in states]
            if need:
                states.update(self.client.run(_checkpoint_take, self.key, it, need,
                                              workers=[w])[w])
        return it, states

    def _handler(self, event: tuple[float, dict[str, Any]]) -> None:
        # on the client's event loop, where the callback could not call the cluster: the
        # records are handed to the thread that waits for the job
        self.records.put(event[1]["record"])

    def _deliver(self) -> None:
        while True:
            try:
                record = self.records.get_nowait()
            except queue.Empty:
                return
            self.received += 1
            if self.progress is not None:
                try:
                    self.progress(record)
                except Exception:  # a progress bar must not end the job
                    logger.exception("the progress callback of %s failed", self.name)

    def _once(self, attempt: int, resumed: tuple[int, dict] | None) -> list[Any]:
        client, tiles = self.client, self.tiles
        owners = _owners(tiles[0].blocks, client, self._alive())
        workers = list(dict.fromkeys(owners))  # rank order: each worker's first tile
        self.workers = workers
        rank_of = {w: r for r, w in enumerate(workers)}
        mine: list[list[int]] = [[] for _ in workers]
        for i, w in enumerate(owners):
            mine[rank_of[w]].append(i)
        comm_id, addresses, lock = _communicator_id(client, self.kind, workers)
        topic = f"{self.key}-progress" if self.progress is not None else None
        job = _Job(self.fn, self.args, self.kind, comm_id, self.key, workers,
                   addresses or [], self.timeout, self.connect_timeout, topic,
                   [[[(i, t.rows[i]) for i in mine[r]] for t in tiles]
                    for r in range(len(workers))])
        with lock:
            if topic is not None:
                client.subscribe_topic(topic, self._handler)
            try:
                futures = []
                for r, w in enumerate(workers):
                    payload = None
                    if resumed is not None:
                        payload = client.scatter(
                            _Resume(resumed[0], {i: resumed[1][i] for i in mine[r]}),
                            workers=[w], hash=False)
                    blocks = [t.blocks[i] for t in tiles for i in mine[r]]
                    futures.append(client.submit(
                        _rank_task, job, r, payload, *blocks, key=f"{self.key}-{attempt}-{r}",
                        workers=[w], allow_other_workers=False, pure=False))
                out = self._wait(futures, workers, comm_id)
                if topic is not None:
                    self._wait_for_reports(out[0]["reports"])
            finally:
                if topic is not None:
                    client.unsubscribe_topic(topic)
        return [o["result"] for o in out]

    def _wait(self, futures: list[Any], workers: list[str], comm_id: str) -> list[Any]:
        pending = list(futures)
        gone: list[str] = []
        check = time.monotonic() + 1.0
        # a rank pinned to a worker that left never runs again, and a finished rank's result
        # leaves with its worker ("lost"): neither ends by itself, and no other rank need
        # fail when the loss comes after their last collective
        while pending and not any(f.status in ("error", "lost") for f in futures):
            try:
                pending = list(distributed.wait(pending, timeout=0.1,
                                                return_when="FIRST_COMPLETED").not_done)
            except TimeoutError:
                pass
            self._deliver()
            if pending and time.monotonic() > check:
                check = time.monotonic() + 1.0
                gone = self._gone([w for f, w in zip(futures, workers, strict=True)
                                   if f in pending])
                if gone:
                    break
        if not gone and all(f.status == "finished" for f in futures):
            out = self._results(futures, workers)
            if out is not None:
                return out
        # the other ranks hear the verdict at their next collective: give them that long,
        # but not a rank whose worker is gone (its task waits for it for ever)
        deadline = time.monotonic() + min(self.timeout, 30.0) + 5
        while time.monotonic() < deadline:
            alive = set(self._alive())
            waiting = [f for f, w in zip(futures, workers, strict=True)
                       if not f.done() and w in alive]
            if not waiting:
                break
            try:
                distributed.wait(waiting, timeout=0.5, return_when="FIRST_COMPLETED")
            except TimeoutError:
                pass
        errors: list[BaseException] = [f.exception() for f in futures if f.status == "error"]
        if not errors:  # no rank failed: a rank's worker left, with its task or its result
            gone = gone or self._gone(workers) or [
                w for f, w in zip(futures, workers, strict=True) if f.status != "finished"]
            errors = [WorkerLost(f"rank {workers.index(w)} (worker {w}) ended without a "
                                 "result the client could fetch: its worker left the cluster "
                                 "with the task or its result, so that worker is gone.", w)
                      for w in gone]
        for f in futures:
            f.cancel()
        _drop_communicator(self.client, self.kind, workers, comm_id)
        raise min(errors, key=_blame)

    def _gone(self, workers: list[str]) -> list[str]:
        """Those of ``workers`` that are no longer in the cluster."""
        alive = set(self._alive())
        return [w for w in workers if w not in alive]

    def _results(self, futures: list[Any], workers: list[str]) -> list[Any] | None:
        """The finished ranks' results; None when one left with its worker before it was
        fetched (a fetch of a lost result waits for it to be made again, which a rank
        pinned to a worker that left never is)."""
        out = []
        for f, w in zip(futures, workers, strict=True):
            step = 1.0
            while True:
                try:
                    out.append(f.result(timeout=step))
                    break
                except TimeoutError:
                    if f.status == "error" or self._gone([w]):
                        return None
                    step = min(2 * step, 60.0)  # a large result: a longer fetch, not a loss
        return out

    def _wait_for_reports(self, sent: int) -> None:
        deadline = time.monotonic() + 10
        self._deliver()
        while self.received < sent and time.monotonic() < deadline:
            time.sleep(0.01)
            self._deliver()
        if self.received < sent:
            logger.warning("%s: %d of %d progress records did not arrive", self.name,
                           sent - self.received, sent)
