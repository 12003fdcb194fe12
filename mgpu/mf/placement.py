"""Where a fit's blocks run: its slots, the host that drives the block scheduler, the
ratings in the order the hosts keep them, the job the block scheduler runs there, and the
:class:`Placement` a fit keeps between epochs.

The job's functions (:func:`job_start`, :func:`job_epoch`, :func:`job_reown`) run on the
driving host (:meth:`mgpu.mf.hosts.BlockHost.drive`); the rest runs on the client.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from mgpu import config
from mgpu.mf.modes import MODES
from mgpu.mf.planning import Ownership
from mgpu.mf.segments import SegmentMap
from mgpu.mf.sgd import libmf_order
from mgpu.mf.staging import time_alone_block

__all__ = ["Job", "Placement", "by_block", "driving_worker", "job_epoch", "job_reown",
           "job_start", "measure_gpus_alone", "slots_for"]


@dataclasses.dataclass
class Placement:
    """A division's blocks placed on the cluster, as a fit keeps them between epochs.

    Attributes
    ----------
    owned : mgpu.mf.planning.Ownership
        The blocks with their owners now, and the slots; :attr:`reown` gives the next.
    drive : callable
        ``drive(fn, *args)``: ``fn(driver, *args)`` run on the driving host
        (:meth:`mgpu.mf.hosts.BlockHost.drive`), as a ``concurrent.futures.Future``.
    rows, cols : list of ndarray
        Each row stratum's users, each column stratum's items.
    side_times : callable
        An epoch's events -> each kind of slot's busy seconds, ratings and predicted
        seconds (:func:`mgpu.mf.planning.side_times` on this division).
    reown : callable
        ``reown(blocks, epochs_done)``: the same blocks with new owners, scheduled so from
        the next epoch (a GPU that now owns a block has its ratings staged); returns their
        :class:`~mgpu.mf.planning.Ownership`.
    """

    owned: Ownership
    drive: Callable[..., Any]
    rows: list[np.ndarray]
    cols: list[np.ndarray]
    side_times: Callable[[list[Any]], dict[str, float]]
    reown: Callable[[tuple[Any, ...], int], Ownership]


def slots_for(client: Any, mode: str) -> list[Any]:
    """The block scheduler's slots for a mode on ``client``'s cluster.

    Parameters
    ----------
    client : distributed.Client
    mode : str
        A name in :data:`mgpu.mf.modes.MODES`.

    Returns
    -------
    list of mgpu.sched.Slot
        Every thread of every worker (a CPU-only mode), every GPU worker (a GPU-only mode),
        or the GPU workers and then the threads of the CPU workers (both); a GPU worker's
        slot is named ``<address>#gpu``, a thread's ``<address>#<thread>``.

    Raises
    ------
    ValueError
        A mode that uses GPUs on a cluster without GPU workers.
    """
    from mgpu.distributed.cluster import describe_workers
    from mgpu.sched import Slot

    spec = MODES[mode]
    infos = describe_workers(client)
    has_gpu = {a: bool(i.get("gpu")) and "error" not in i["gpu"] for a, i in infos.items()}
    threads = [Slot(f"{a}#{t}", a, "cpu") for a, i in infos.items()
               for t in range(i.get("nthreads") or 1) if not spec.gpu or not has_gpu[a]]
    gpus = [Slot(f"{a}#gpu", a, "gpu") for a in infos if has_gpu[a]]
    if not spec.gpu:
        return threads
    if not gpus:
        raise ValueError(f"mode={mode!r} needs GPU workers; the cluster has none "
                         "(mgpu.connect() starts them where GPUs are visible).")
    return gpus + threads if spec.cpu else gpus


def measure_gpus_alone(client: Any, gpu_worker: str, div: Any, n_g: int, u: np.ndarray,
                       i: np.ndarray, r: np.ndarray, k: int, gpu_kw: dict[str, Any],
                       overhead: float) -> dict[str, float]:
    """An epoch of the GPUs alone on their division, priced by timing one of its blocks.

    The division's largest block (a random share of its ratings, at most
    ``mgpu.mf.calibration-ratings``) is timed on a GPU worker
    (:func:`mgpu.mf.staging.time_alone_block`); every GPU runs its share of the ratings at
    that rate, and a call per column of its blocks, each copying its segments back and
    paying ``overhead``.

    Parameters
    ----------
    client : distributed.Client
    gpu_worker : str
        The GPU worker that times the block.
    div : mgpu.mf.division.Division
        The GPUs-alone division (the gpu mode's).
    n_g : int
        GPU slots.
    u, i, r : ndarray of shape (n_ratings,)
        The training ratings' users, items and values.
    k : int
    gpu_kw : dict
        The GPU's keywords of :func:`mgpu.mf.sgd.sgd_block`.
    overhead : float
        A call's seconds beyond its run, the CPU slots idle.

    Returns
    -------
    dict
        ``per_rating_s``, ``copy_s``, ``overhead_s`` and the epoch's ``epoch_s``.
    """
    big = max(div.blocks, key=lambda blk: blk.size)
    members_u = np.flatnonzero(div.user_stratum == big.row)
    members_i = np.flatnonzero(div.item_stratum == big.col)
    local_u = np.zeros(div.user_stratum.size, dtype=np.int64)
    local_i = np.zeros(div.item_stratum.size, dtype=np.int64)
    local_u[members_u] = np.arange(members_u.size)
    local_i[members_i] = np.arange(members_i.size)
    sel = np.flatnonzero(div.block_of(u, i) == big.id)
    most = int(config.get("mf.calibration-ratings"))
    if sel.size > most:
        sel = np.sort(np.random.default_rng(sel.size).choice(sel, most, replace=False))
    got = client.submit(time_alone_block, local_u[u[sel]], local_i[i[sel]], r[sel],
                        members_u.size, members_i.size, k, "float64", gpu_kw,
                        workers=[gpu_worker], allow_other_workers=False, pure=False).result()
    calls = div.n_cols  # a GPU's blocks of a column run in one call
    got["overhead_s"] = overhead
    got["epoch_s"] = (got["per_rating_s"] * r.size / n_g
                      + calls * (got["copy_s"] + overhead))
    return got


def driving_worker(slots: list[Any]) -> str:
    """The worker whose host runs the block scheduler: the one with the most slots, a CPU
    worker on a tie (its slots' calls, many and each the length of a short block, are
    the ones a message between processes would cost the most).

    Parameters
    ----------
    slots : list of mgpu.sched.Slot

    Returns
    -------
    str
        A worker's address.

    Examples
    --------
    >>> from mgpu.sched import Slot
    >>> driving_worker([Slot("g#gpu", "g", "gpu"), Slot("c#0", "c", "cpu")])
    'c'
    """
    count: dict[str, int] = {}
    for s in slots:
        count[s.worker] = count.get(s.worker, 0) + 1
    kind = {s.worker: s.kind for s in slots}
    return max(count, key=lambda w: (count[w], kind[w] == "cpu"))


def by_block(users: np.ndarray, items: np.ndarray, block: np.ndarray, n_users: int,
             n_items: int) -> np.ndarray:
    """The ratings' positions grouped by block id, ascending, each block's in LIBMF's order
    (:func:`mgpu.mf.sgd.libmf_order`: by user, then item, with more users than items), the
    order a CPU host visits them in. Ratings as a CSR matrix gives them, by user, are
    already in it: then only the block ids are sorted.

    Parameters
    ----------
    users, items : ndarray of shape (n_ratings,)
    block : ndarray of shape (n_ratings,)
        Each rating's block id.
    n_users, n_items : int

    Returns
    -------
    ndarray of shape (n_ratings,)
        Positions into the ratings.

    Examples
    --------
    >>> by_block(np.array([1, 0, 1, 0]), np.array([0, 1, 1, 0]), np.array([1, 0, 1, 0]), 3, 2)
    array([3, 1, 0, 2])
    """
    by_user = n_users > n_items
    major, minor = (users, items) if by_user else (items, users)
    key = major * max(n_items if by_user else n_users, 1) + minor  # only to see if sorted
    if key.size > 1 and bool((key[1:] < key[:-1]).any()):
        within = libmf_order(users, items, by_user)
        return within[np.argsort(block[within], kind="stable")]
    return np.argsort(block, kind="stable")


@dataclasses.dataclass
class Job:
    """The block scheduler's side of a fit, kept by the driving host
    (:meth:`mgpu.mf.hosts.BlockHost.drive`): the calls it sends (which version of each
    segment a block needs and where it will be), the cost model's seconds of a block on a
    slot, what moving a block to another worker costs, and where each block's ratings
    are."""

    slots: list[Any]
    segmap: SegmentMap
    origin: dict[int, str]  # the host that keeps a block's ratings for whoever runs it
    where: dict[int, str]  # the worker of a block's owner
    row_sizes: list[int]
    col_sizes: list[int]
    predict: dict[str, Callable[..., float]]
    per_task: dict[str, int]
    ahead: dict[str, int]
    deterministic: bool
    lr: float
    reg: float
    k: int
    itemsize: int
    dtype: str
    bandwidth: float
    latency: float
    seed: int
    sched: Any = None
    driver: Any = None  # the host's Driver, while an epoch runs there
    calls: int = 0

    def run(self, group: tuple[Any, ...], slot: Any) -> Any:
        p = [self.segmap.use(("p", b.row), slot.worker) for b in group]
        q = self.segmap.use(("q", group[0].col), slot.worker)
        sources = {b.id: self.origin[b.id] for b in group if self.origin[b.id] != slot.worker}
        self.calls += 1
        return self.driver.call(slot.worker, "run", [b.id for b in group], [x[0] for x in p],
                                q[0], [x[1] for x in p], q[1], self.lr, self.reg,
                                self.seed + self.calls, sources, self.dtype)

    def transfer(self, block: Any, slot: Any) -> float:
        """Moving a block's ratings and segments to a slot on another worker."""
        if self.where[block.id] == slot.worker:
            return 0.0
        nbytes = 24 * block.size + (self.row_sizes[block.row] + self.col_sizes[block.col]) \
            * self.k * self.itemsize * 2
        return nbytes / self.bandwidth + self.latency

    def cost(self, block: Any, slot: Any) -> float:
        return self.predict[slot.kind](block.size, self.per_task[slot.kind])

    def batch(self, slot: Any) -> int:
        return self.per_task[slot.kind]

    def queued(self, slot: Any) -> int:
        return self.ahead[slot.kind]

    def scheduler(self, blocks: tuple[Any, ...], epochs_done: int) -> Any:
        from mgpu.sched import BlockScheduler

        return BlockScheduler(blocks, self.slots, self.run,
                              cost=self.cost if self.predict else None,
                              transfer=self.transfer, deterministic=self.deterministic,
                              client=self.driver, batch=self.batch, ahead=self.queued,
                              epochs_done=epochs_done)


def job_start(driver: Any, job: Job, blocks: tuple[Any, ...]) -> None:
    """On the driving host: keep the job, its scheduler made for ``blocks``."""
    job.driver = driver
    job.sched = job.scheduler(blocks, 0)
    driver.state["job"] = job


def job_epoch(driver: Any) -> tuple[list[Any], dict[str, dict[Any, int]],
                                    dict[str, list[dict[str, float]]]]:
    """On the driving host: one epoch of the job's blocks; returns its events, where each
    segment's latest version is (host -> {key: version}) and where each host's calls spent
    their time (host -> :meth:`mgpu.mf.hosts.BlockHost.call_times`)."""
    job = driver.state["job"]
    job.driver = job.sched.client = driver
    events = job.sched.run_epoch()
    hosts = sorted({s.worker for s in job.slots})
    times = [driver.call(w, "call_times") for w in hosts]
    return events, job.segmap.latest(), {w: f.result() for w, f in zip(hosts, times)}


def job_reown(driver: Any, blocks: tuple[Any, ...], epochs_done: int, where: dict[int, str],
              gpu_batch: int) -> None:
    """On the driving host: the job's blocks with new owners (on ``where``'s workers, a
    GPU's call taking ``gpu_batch`` of them), a scheduler for them from the next epoch."""
    job = driver.state["job"]
    job.driver = driver
    job.where.update(where)
    job.per_task["gpu"] = gpu_batch
    job.sched = job.scheduler(blocks, epochs_done)
