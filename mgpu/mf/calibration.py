"""Calibrating HSGD*'s cost model on the cluster's own workers, and caching the result.

A sample of ratings is cut into growing prefixes S1, S1+S2, … (each twice the last), and one
block call's steps are timed on each, a few repeats averaged, where blocks really run. The
sample is one column stratum of the division HSGD* will make
(:func:`mgpu.mf.division.columns`),
its ratings ordered by user, the users shuffled (:func:`block_window`), so that each prefix
is a block as the division cuts them: the ratings of a row stratum of shuffled users in a
column stratum, with factor segments of every user of the row and every item of the column.
A prefix of ratings shuffled over the whole matrix is not: it meets a new user at nearly
every rating, so its user segment and its working set are several
times a real block's of as many ratings, and it runs about twice as slow a rating as the
division's blocks do, which would price HSGD*'s CPU side far too slow.

Timed on a CPU worker: the whole CPU block (one thread: the shuffle and the numba pass, in
place on the factor segments as a block host runs it); on a GPU worker: the transfers (the
item segment to the device, both segments back; the user segment stays on the device
between the blocks of a GPU's own rows) apart from the kernel (``kernels/sgd.cu``).

Every call also costs its slot time outside its own run: the round trip from the call to
its sender hearing it ended (the sender is the host that runs the block scheduler,
:meth:`mgpu.mf.hosts.BlockHost.drive`), and the copies of segments between workers. Idle,
that is a few milliseconds; in an epoch, with every slot, the workers and the client all
busy, it grows to the order of a small block's own run, which is why blocks are calls to
block hosts (:mod:`mgpu.mf.hosts`) sent from the CPU worker's own host rather than a Dask
task each. It is measured as an epoch has it
(:func:`_task_overheads`): every slot runs block calls back to back, as the block
scheduler runs them, and a call's overhead is the time its slot was busy with it, counted
as HSGD*'s side times count it, less the call's own run on its worker. The same calls time
the CPU's runs with the GPU and the calls at work beside them, against the curve's at
their size (``cpu_load``), which is recorded and not applied: that one size's ratio varies
more from one calibration to the next than the epochs' CPU blocks vary around the curve,
so scaling the curve by it predicts the CPU side worse than leaving it unscaled.

:class:`Calibration` keeps the measurements and fits the curves of :mod:`mgpu.sched.cost`
from them, as HSGD* does (CPU piecewise linear through the sizes measured; GPU transfer
``n/(a·sqrt(ln n)+b)`` and kernel ``n/(a·ln n+b)`` below τ, linear above) or as Qilin's
linear model does (one straight line per device).

One difference from the thesis: a GPU slot runs one block at a time and its copies and kernel
run on one stream, so a block's GPU time is transfer **plus** kernel, not the larger of the
two (the thesis overlaps them on streams).
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mgpu import config
from mgpu.mf.staging import host_copy, run_staged, stage_block
from mgpu.sched.cost import Curve, fit_gpu_curve, fit_linear, fit_piecewise
from mgpu.sched.cost import calibrate as prefix_times

logger = logging.getLogger(__name__)

__all__ = ["Calibration", "MODELS", "Window", "block_window", "calibrate", "cached",
           "prefix_sizes"]

MODELS = ("hsgd*", "linear")


def prefix_sizes(n: int, smallest: int = 1024) -> list[int]:
    """Prefix lengths smallest, 2·smallest, … up to n (n itself last).

    >>> prefix_sizes(5000)
    [1024, 2048, 4096, 5000]
    """
    if n < 2:
        raise ValueError(f"Calibration needs at least 2 ratings. Got {n}.")
    smallest = max(1, min(smallest, n // 2))
    out = []
    s = smallest
    while s < n:
        out.append(s)
        s *= 2
    return out + [n]


@dataclass
class Window:
    """Ratings of one column stratum: their positions in the ratings given, their ids in it
    (users numbered in a random order of all users, items < ``n_items``, ordered by user),
    and its number of items and ratings per user; ``by_user``: the matrix has more users
    than items, so a CPU host visits a block's ratings by user, then item (else by item,
    then user: :func:`mgpu.mf.sgd.libmf_order`)."""

    take: np.ndarray
    users: np.ndarray
    items: np.ndarray
    n_items: int
    per_user: float
    by_user: bool = True

    @property
    def block(self) -> tuple[int, float]:
        """Its items and ratings per user, as a calibration records them."""
        return self.n_items, round(self.per_user, 3)

    def segment_rows(self, n: int) -> int:
        """The users of the first n ratings' block: every user up to the last one's."""
        return int(self.users[n - 1]) + 1 if n else 0


def block_window(users: np.ndarray, items: np.ndarray, shape: tuple[int, int],
                 cols: int = 1, want: int = 1 << 16, seed: int = 0) -> Window:
    """The ratings of one of ``cols`` column strata (shuffled items, cut at 1/cols of the
    ratings) of a ``shape`` matrix, fewer (wider) strata while it holds fewer than ``want``
    ratings, ordered by user, the users in a random order.

    A prefix of these ratings is a block as HSGD*'s division cuts one, at any share α:
    a row stratum of shuffled users (every one of them, rated in this column or not) times
    a column stratum, with the matrix's ratings per user per stratum.

    >>> u, i = np.repeat(np.arange(100), 10), np.tile(np.arange(10), 100)
    >>> w = block_window(u, i, (100, 10), cols=2, want=100)
    >>> w.n_items, w.take.size, w.per_user, w.segment_rows(50)
    (5, 500, 5.0, 10)
    >>> block_window(u, i, (100, 10), cols=2, want=600).take.size  # one stratum of 10
    1000
    """
    m, n = shape
    cols = max(1, int(cols))
    rng = np.random.default_rng(seed)
    rank = np.empty(m, dtype=np.int64)
    rank[rng.permutation(m)] = np.arange(m)
    pi = rng.permutation(n)
    cum = np.cumsum(np.bincount(items, minlength=n)[pi])
    while True:
        # as the division cuts its columns: the shortest prefix of the shuffled items that
        # holds 1/cols of the ratings
        wi = pi[:min(int(np.searchsorted(cum, cum[-1] / cols)) + 1, n)] if n else pi
        li = np.full(n, -1, dtype=np.int64)
        li[wi] = np.arange(wi.size)
        inside = np.flatnonzero(li[items] >= 0)
        if inside.size >= want or cols == 1:
            break
        cols = max(1, cols // 2)
    take = inside[np.argsort(rank[users[inside]], kind="stable")]
    return Window(take, rank[users[take]], li[items[take]], int(wi.size),
                  take.size / max(m, 1), m > n)


@dataclass
class Calibration:
    """Measured seconds of one block call's steps against its number of ratings.

    ``cpu_s``: a CPU block on one thread; ``transfer_s`` and ``kernel_s``: a GPU block's
    copies and its kernel; ``overhead_cpu_s`` / ``overhead_gpu_s``: a call's cost to a CPU /
    GPU slot outside its own run, with every slot busy (:func:`_task_overheads`; ``probe``:
    the ratings of the blocks it ran, 0 in a calibration from before it was measured so),
    and ``overhead_gpu_alone_s`` the GPU's with no CPU slot at work; ``block``: the sampled
    column stratum's items and ratings per user (:class:`Window`); ``calls``: what ran the
    blocks, "driven" (calls to block hosts, :mod:`mgpu.mf.hosts`, sent from the CPU
    worker's host as a fit sends them) or, in a calibration from before, "hosts" (the same
    calls sent from the client) or a Dask task per block; ``cpu_load``: a CPU block's run
    with every slot busy as in an epoch (the GPU's too) over its run in ``cpu_s`` at the
    probe's size, recorded and not applied (0: not measured, in a calibration from
    before); ``cpu_order``: how the CPU blocks visited their ratings, "libmf" (in the order
    a fit keeps them, :func:`mgpu.mf.sgd.libmf_order`) or, in a calibration from before,
    "random" (a new permutation each pass); ``segments``: whether the hosts of the
    overhead probe shared their segments (``"shared"``, as a fit's hosts of one node do,
    :func:`mgpu.mf.hosts.share_segments`) or each kept its own (``"separate"``: a segment
    crossing between workers was copied), "" in a calibration from before it was
    recorded, whose probe kept them separate. ``key`` names what was measured (the GPU and
    CPU models, k, dtype, the GPU options: scheme, conflict bound, warps; ``block``), so a cached
    calibration is reused only for the same.
    """

    key: str
    sizes: list[float]
    cpu_s: list[float] = field(default_factory=list)
    transfer_s: list[float] = field(default_factory=list)
    kernel_s: list[float] = field(default_factory=list)
    overhead_cpu_s: float = 0.0
    overhead_gpu_s: float = 0.0
    measured: str = ""
    block: list[float] = field(default_factory=list)
    probe: int = 0
    overhead_gpu_alone_s: float = 0.0
    calls: str = "tasks"
    cpu_load: float = 0.0
    cpu_order: str = "random"
    segments: str = ""

    # ------------------------------------------------------------------ fitted curves
    def curves(self, model: str = "hsgd*") -> dict[str, Curve]:
        """The fitted curves of a model: "cpu" and, with GPU data, "transfer" and "kernel"
        (HSGD*) or one "gpu" line (Qilin's linear model)."""
        if model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}. Got {model!r}.")
        n = np.asarray(self.sizes, float)
        out: dict[str, Curve] = {}
        if self.cpu_s:
            fit = fit_linear if model == "linear" else fit_piecewise
            out["cpu"] = fit(n, np.asarray(self.cpu_s))
        if self.kernel_s:
            if model == "linear":
                out["gpu"] = fit_linear(n, np.asarray(self.transfer_s) + np.asarray(self.kernel_s))
            else:
                out["transfer"] = fit_gpu_curve(n, np.asarray(self.transfer_s), "sqrtlog")
                out["kernel"] = fit_gpu_curve(n, np.asarray(self.kernel_s), "log")
        return out

    def predictor(self, kind: str, model: str = "hsgd*", floor: float = 0.0
                  ) -> Callable[..., float]:
        """``f(n, per_task=1, load=1.0)``: seconds a block of n ratings is expected to take
        on a slot of ``kind`` ("cpu" or "gpu"), with its share of its task's overhead when
        ``per_task`` blocks run in one task; 0 for an empty block. ``load``: the share of
        the calibrated CPU slots at work beside a GPU, whose task overhead goes from the one
        measured alone (0) to the one measured with every slot busy (1). ``floor`` (GPU):
        seconds per rating the kernel takes at least, a rate measured on a real block of the
        job (:func:`mgpu.mf.placement.measure_gpus_alone`); the curves, fitted on smaller
        prefixes, can extrapolate faster than the GPU runs."""
        c = self.curves(model)
        if kind == "cpu":
            if "cpu" not in c:
                raise ValueError("This calibration has no CPU measurements.")
            line, ovh = c["cpu"], self.overhead_cpu_s
            return lambda n, per_task=1, load=1.0: (0.0 if n <= 0 else max(line(n), 0.0)
                                                    + ovh / per_task)
        if kind != "gpu":
            raise ValueError(f"kind must be 'cpu' or 'gpu'. Got {kind!r}.")
        if "kernel" not in c and "gpu" not in c:
            raise ValueError("This calibration has no GPU measurements.")
        busy, alone = self.overhead_gpu_s, self.overhead_gpu_alone_s

        def ovh(load: float) -> float:
            return alone + (busy - alone) * min(max(load, 0.0), 1.0)

        if model == "linear":
            line = c["gpu"]
            return lambda n, per_task=1, load=1.0: (0.0 if n <= 0 else max(line(n), floor * n)
                                                    + ovh(load) / per_task)
        tr, ke = c["transfer"], c["kernel"]
        return lambda n, per_task=1, load=1.0: (0.0 if n <= 0 else max(tr(n), 0.0)
                                                + max(ke(n), floor * n) + ovh(load) / per_task)

    def describe(self) -> str:
        """The measurements and both models' curves, as text."""
        block = (f"; blocks of {int(self.block[0]):,} items, {self.block[1]:.3g} ratings per "
                 "user" if self.block else "")
        lines = [f"calibration {self.key} ({self.measured}{block})",
                 f"a task's overhead, every slot busy with blocks of {self.probe:,} ratings: "
                 f"CPU slot {self.overhead_cpu_s * 1e3:.2f} ms, GPU slot "
                 f"{self.overhead_gpu_s * 1e3:.2f} ms (alone "
                 f"{self.overhead_gpu_alone_s * 1e3:.2f} ms; segments "
                 f"{'shared' if self.segments == 'shared' else 'not shared'} between "
                 "hosts); a CPU block's run then "
                 f"{self.cpu_load:.3f}× the curve's (not applied)",
                 "ratings     | CPU block s | GPU transfer s | GPU kernel s"]
        for j, n in enumerate(self.sizes):
            cols = [self.cpu_s, self.transfer_s, self.kernel_s]
            lines.append(f"{int(n):>11,} | " + " | ".join(
                f"{c[j]:.3e}" if c else "–" for c in cols))
        for model in MODELS:
            for name, c in self.curves(model).items():
                if c.form == "piecewise":
                    lines.append(f"{model:>6} {name:>8}: piecewise linear through the "
                                 f"{len(c.knots)} sizes measured")
                    continue
                tau = "" if not np.isfinite(c.tau) else f", linear from τ={c.tau:,.0f}"
                lines.append(f"{model:>6} {name:>8}: {c.form} a={c.a:.4g} b={c.b:.4g}{tau}")
        return "\n".join(lines)

    # ------------------------------------------------------------------ storage
    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Calibration:
        return cls(**d)


def cache_path() -> Path:
    """Where calibrations are cached (``mgpu.mf.calibration-cache``, ``~`` expanded)."""
    return Path(os.path.expanduser(str(config.get("mf.calibration-cache"))))


def cached_all() -> dict[str, Calibration]:
    """Every cached calibration by key (none when the cache is missing or unreadable)."""
    path = cache_path()
    try:
        entries = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        logger.warning("ignoring the unreadable calibration cache %s: %s", path, exc)
        return {}
    return {key: Calibration.from_json(entry) for key, entry in entries.items()}


def cached(key: str) -> Calibration | None:
    """The cached calibration under ``key``, or None."""
    return cached_all().get(key)


def store(cal: Calibration) -> Path:
    """Add ``cal`` to the cache file (written whole, then renamed into place)."""
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        entries = {}
    entries[cal.key] = cal.to_json()
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(entries, indent=1))
    tmp.replace(path)
    return path


# ---------------------------------------------------------------------- on the workers
def _prefix_block(users: np.ndarray, items: np.ndarray, ratings: np.ndarray, n: int, k: int,
                  dtype: Any, n_items: int, by_user: bool = True
                  ) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], np.ndarray, np.ndarray]:
    """The first n ratings (ids in a :class:`Window`, ordered by user) as a block, kept in
    the order a fit keeps a block's (:func:`mgpu.mf.sgd.libmf_order`), with factor segments
    of every user up to the last one's and the stratum's ``n_items``."""
    from mgpu.mf.sgd import libmf_order

    rng = np.random.default_rng(n)
    P = (rng.random((int(users[:n].max()) + 1, k)) / np.sqrt(k)).astype(dtype)
    Q = (rng.random((n_items, k)) / np.sqrt(k)).astype(dtype)
    o = libmf_order(users[:n], items[:n], by_user)
    return (users[o].astype(np.int64), items[o].astype(np.int64),
            ratings[o].astype(np.float64)), P, Q


def _measure(kind: str, users: np.ndarray, items: np.ndarray, ratings: np.ndarray,
             n_items: int, sizes: list[int], k: int, dtype: str, repeats: int,
             gpu_kw: dict[str, Any], threads: int = 1, by_user: bool = True
             ) -> dict[str, Any]:
    """Runs on a worker: a block call's steps timed on each prefix (means of repeats) of
    a :class:`Window`'s ratings, a stratum of ``n_items`` (CPU blocks visited as
    ``by_user`` says, :func:`mgpu.mf.sgd.libmf_order`).

    CPU: ``threads`` blocks of the prefix's size at once, each on its own thread and its own
    copies, as the worker's slots run them in an epoch (they share its cores' memory bus);
    a block's time is the mean over them. GPU: the ratings staged on the device once (a
    GPU's own blocks stay there for every epoch) and its user segment left there by the
    previous pass; timed apart are the item segment's trip (to the device and back to the
    host: columns go round every slot) and the kernel.
    """
    from concurrent.futures import ThreadPoolExecutor

    from mgpu.mf.sgd import sgd_block

    out: dict[str, Any] = {"times": [], "transfer": [], "kernel": []}
    if kind == "cpu":
        held: dict[int, list[tuple[Any, ...]]] = {}

        def one(block: Any, P: np.ndarray, Q: np.ndarray) -> float:
            t0 = time.perf_counter()  # as a CPU host runs a block: in place on its segments,
            sgd_block(*block, P, Q, 0.005, 0.05, 0.05)  # its ratings in the order kept
            return time.perf_counter() - t0

        with ThreadPoolExecutor(threads) as pool:
            def run(n: int) -> float:
                if n not in held:  # one prefix at a time, its first pass untimed (compiling)
                    held.clear()
                    block, P, Q = _prefix_block(users, items, ratings, n, k, np.dtype(dtype),
                                                n_items, by_user)
                    # each thread its own copy of the block too, as each slot of an epoch
                    # reads its own block's ratings
                    held[n] = [(tuple(a.copy() for a in block), P.copy(), Q.copy())
                               for _ in range(threads)]
                    one(*held[n][0])
                return float(np.mean(list(pool.map(lambda c: one(*c), held[n]))))

            out["times"] = [float(t) for t in prefix_times(run, sizes, repeats)[1]]
        return out
    import cupy

    stream = cupy.cuda.get_current_stream()
    for n in sizes:
        block, P, Q = _prefix_block(users, items, ratings, n, k, np.dtype(dtype), n_items)
        staged = stage_block(block, np.dtype(dtype), n, gpu_kw.get("scheme", "wavefront"))
        Pd = cupy.asarray(P)  # the user segment stays on the device between calls
        tr, ke = [], []
        for rep in range(repeats + 1):  # the first run compiles and warms up
            stream.synchronize()
            t0 = time.perf_counter()
            Qd = cupy.asarray(Q)  # the item segment arrives from another host
            stream.synchronize()
            t1 = time.perf_counter()
            run_staged(staged, Pd, Qd, 0.005, 0.05, 0.05, gpu_kw)
            stream.synchronize()
            t2 = time.perf_counter()
            Q = host_copy(Qd)  # both segments back, as a GPU host's call copies them
            host_copy(Pd)
            t3 = time.perf_counter()
            if rep:
                tr.append((t1 - t0) + (t3 - t2))
                ke.append(t2 - t1)
        out["transfer"].append(float(np.mean(tr)))
        out["kernel"].append(float(np.mean(ke)))
    return out


def _task_overheads(client: Any, block: tuple[np.ndarray, ...], P: np.ndarray, Q: np.ndarray,
                    cpu_worker: str | None, threads: int, gpu_worker: str | None, dtype: Any,
                    gpu_kw: dict[str, Any], tasks: int = 8) -> dict[str, float]:
    """Seconds a call costs its slot beyond its own run, per kind of slot, with every slot
    busy as in an epoch: ``threads`` CPU slots and the GPU slot each run ``block`` again and
    again on their own segments, through block hosts (:mod:`mgpu.mf.hosts`) as the block
    scheduler runs them (the GPU's item segment is a copy of the one a CPU slot finished
    last, and each column the GPU finishes is a CPU slot's next call's, so that columns
    cross between workers both ways as in an epoch), a CPU slot one call at a time,
    the GPU with ``mf.gpu-ahead`` calls queued behind its running one, as long as the CPU
    slots run (or ``tasks`` times).
    A call's busy time is counted as :func:`mgpu.mf.planning.side_times` counts it: from its
    submission, or from the end of its slot's call before it when it was queued behind that
    one, to the sender hearing it ended; the calls are sent from the CPU worker's host (the
    GPU worker's without one), as a fit's block scheduler sends them (:func:`_probe_calls`).
    The hosts of one node share their segments as a fit's do (``mf.shared-segments``,
    :func:`mgpu.mf.hosts.share_segments`); ``shared`` in the result is 1.0 where they did,
    and then only the GPU's input crosses (:func:`_probe_calls`).
    Returns, per kind, the mean of busy less run (an epoch's side time is a sum of them,
    outliers included, so the mean predicts it where the median falls well short of what
    epochs' calls spend beyond their runs) and, as ``{kind}_run``, the median run (one slow
    call should not scale every block), over each kind's calls but its slots' first ones (a
    first call may load what later ones find loaded)."""
    from mgpu.mf.hosts import call, share_segments, start_hosts

    slots = [("cpu", cpu_worker)] * (threads if cpu_worker else 0)
    if gpu_worker is not None:
        slots.append(("gpu", gpu_worker))
    depth = {"cpu": 1, "gpu": 1 + max(0, int(config.get("mf.gpu-ahead")))}
    hosts = start_hosts(client, {w: (kind, threads if kind == "cpu" else 1)
                                 for kind, w in set(slots)}, gpu_kw)
    dtype = np.dtype(dtype).name
    # hosts of one node share the segments as a fit's do (mf.shared-segments): a column
    # crossing between them is then read where it lies, not taken through both workers
    shared = bool(share_segments(
        client, hosts, [((name, s), int(x.shape[0])) for s in range(len(slots))
                        for name, x in (("p", P), ("q", Q))], int(P.shape[1]), dtype
    )) if config.get("mf.shared-segments") else False
    # each slot its own copy of the block (numbered as the slot) and its own segments
    for f in [call(client, h, "put",
                   {s: tuple(a.copy() for a in block) for s, (_, w2) in enumerate(slots)
                    if w2 == w},
                   {(name, s): x for s, (_, w2) in enumerate(slots) if w2 == w
                    for name, x in (("p", P), ("q", Q))},
                   [s for s, (k, w2) in enumerate(slots) if k == "gpu" and w2 == w], dtype)
              for w, h in hosts.items()]:
        f.result()
    # sent as the fit's block scheduler sends its calls: from the CPU worker's host
    driving = cpu_worker if cpu_worker else gpu_worker
    out = call(client, hosts[driving], "drive", _probe_calls, slots, depth, tasks, cpu_worker,
               dtype, shared).result()
    out["shared"] = float(shared)
    return out


def _probe_calls(driver: Any, slots: list[tuple[str, str]], depth: dict[str, int], tasks: int,
                 cpu_worker: str | None, dtype: str, shared: bool = False) -> dict[str, float]:
    """:func:`_task_overheads`'s calls, sent from a host's driver thread
    (:meth:`mgpu.mf.hosts.BlockHost.drive`). ``shared``: the hosts share their segments
    (:func:`mgpu.mf.hosts.share_segments`), so the GPU reads a CPU slot's column from
    there, where it lies, and copies it to the device, and a CPU slot, which would run on
    the GPU's column in place as on its own, runs on its own; else each column crossing
    is taken from the other host as a copy."""
    import queue

    finished: queue.SimpleQueue[Any] = queue.SimpleQueue()
    info: dict[Any, tuple[int, float]] = {}  # future -> (slot, submitted)
    flight: list[list[Any]] = [[] for _ in slots]
    runs = [0] * len(slots)
    heard: list[float | None] = [None] * len(slots)
    busy: list[tuple[int, float, float, bool]] = []  # (slot, busy, own run, its slot's first)
    seeds = iter(range(1 << 62))
    cpus = [c for c, (k, _) in enumerate(slots) if k == "cpu"]
    gpus = [g for g, (k, _) in enumerate(slots) if k == "gpu"]
    ended = [0] * len(slots)  # each slot's calls that ended
    handed = [0]  # the GPU's columns a CPU slot's call has taken

    def more(s: int) -> bool:
        if slots[s][0] == "cpu" or not cpus:
            return runs[s] < tasks
        return any(flight[c] or runs[c] < tasks for c in cpus) and runs[s] < 50 * tasks

    def submit(s: int) -> None:
        kind, worker = slots[s]
        p = (("p", s), runs[s], None, False)
        q = (("q", s), runs[s], None, False)
        if kind == "gpu" and cpus:  # a copy of a column a CPU slot finished, from its worker
            c = cpus[runs[s] % len(cpus)]
            q = (("q", c), ended[c], cpu_worker, not shared)
        elif kind == "cpu" and gpus and not shared and handed[0] < ended[gpus[0]]:
            # and each column the GPU finished goes on to a CPU slot, as in an epoch (with
            # shared segments a CPU slot runs on the GPU's column where it lies, as on its
            # own: nothing crosses)
            q = (("q", gpus[0]), ended[gpus[0]], slots[gpus[0]][1], True)
            handed[0] += 1
        runs[s] += 1
        fut = driver.call(worker, "run", [s], [p], q, [(("p", s), runs[s])], (("q", s), runs[s]),
                          0.005, 0.05, next(seeds), {}, dtype)
        info[fut] = (s, time.perf_counter())
        flight[s].append(fut)
        fut.add_done_callback(finished.put)

    for s in range(len(slots)):
        while len(flight[s]) < depth[slots[s][0]] and more(s):
            submit(s)
    while any(flight):
        fut = finished.get()
        now = time.perf_counter()
        own = fut.result()  # raises the call's own error
        s, sent = info[fut]
        flight[s].remove(fut)
        busy.append((s, now - max(sent, heard[s] or sent), own, heard[s] is None))
        heard[s] = now
        ended[s] += 1
        while len(flight[s]) < depth[slots[s][0]] and more(s):
            submit(s)
    out = {}
    for kind in ("cpu", "gpu"):
        got = [(b - o, o) for s, b, o, first in busy if slots[s][0] == kind and not first]
        if got:
            out[kind] = max(0.0, float(np.mean([x for x, _ in got])))
            out[f"{kind}_run"] = float(np.median([o for _, o in got]))
    return out


def calibrate(client: Any, users: np.ndarray, items: np.ndarray, ratings: np.ndarray, k: int, *,
              cpu_worker: str | None, gpu_worker: str | None, dtype: str = "float64",
              gpu_kw: dict[str, Any] | None = None, max_ratings: int = 4_000_000,
              repeats: int = 3, cpu_threads: int = 1, seed: int = 0,
              window: Window | None = None) -> Calibration:
    """Measure block calls on a CPU worker and a GPU worker of ``client``'s cluster.

    The first ``max_ratings`` ratings of ``window`` (:func:`block_window`; default: one
    stratum of all the items) are the sample; prefixes double from 1,024 up to that. Either
    worker may be None (that side is then not measured). The CPU worker runs ``cpu_threads``
    blocks at once, as many as the slots that will share it. Then every slot runs blocks of
    the middle prefix size back to back, for each task's overhead under that load
    (:func:`_task_overheads`; and the CPU's runs then against the curve, ``cpu_load``,
    recorded), and the GPU's once more with the CPU slots idle. Returns a
    :class:`Calibration` (not cached: see :func:`store`).
    """
    if cpu_worker is None and gpu_worker is None:
        raise ValueError("calibrate needs a CPU worker, a GPU worker or both.")
    if window is None:
        shape = (int(users.max()) + 1, int(items.max()) + 1) if users.size else (0, 0)
        window = block_window(users, items, shape, seed=seed)
    take = window.take[:max_ratings]
    sample = (window.users[:max_ratings], window.items[:max_ratings], ratings[take])
    sizes = prefix_sizes(take.size)
    futs = {}
    for kind, worker in (("cpu", cpu_worker), ("gpu", gpu_worker)):
        if worker is not None:
            futs[kind] = client.submit(_measure, kind, *sample, window.n_items, sizes, k, dtype,
                                       repeats, gpu_kw or {}, cpu_threads, window.by_user,
                                       workers=[worker],
                                       allow_other_workers=False, pure=False)
    got = {kind: f.result() for kind, f in futs.items()}
    probe = sizes[len(sizes) // 2]  # blocks of a middle size, segments as the division's
    pblock = _prefix_block(*sample, probe, k, np.dtype(dtype), window.n_items, window.by_user)
    # about half a second of calls a slot (8 to 64): a slot's first few calls alone scatter
    # a CPU block's run far more widely around the curve than an epoch's calls do
    cpu_s = got.get("cpu", {}).get("times", [])
    one = cpu_s[sizes.index(probe)] if cpu_s else got["gpu"]["kernel"][sizes.index(probe)]
    tasks = int(np.clip(np.ceil(0.5 / max(one, 1e-6)), 8, 64))
    overhead = _task_overheads(client, *pblock, cpu_worker, cpu_threads, gpu_worker, dtype,
                               gpu_kw or {}, tasks)
    alone = overhead.get("gpu", 0.0)
    if gpu_worker is not None and cpu_worker is not None:  # and the GPU with the CPUs idle
        alone = _task_overheads(client, *pblock, None, 0, gpu_worker, dtype, gpu_kw or {},
                                tasks)["gpu"]
    # the CPU's runs beside the GPU and the calls of an epoch, against the curve's (recorded:
    # too noisy a ratio to scale the curve by)
    cpu_load = overhead["cpu_run"] / cpu_s[sizes.index(probe)] if cpu_s else 0.0
    cal = Calibration(
        key=cluster_key(client, cpu_worker, gpu_worker, k, dtype, gpu_kw or {}, cpu_threads,
                        window.block),
        sizes=[float(s) for s in sizes],
        cpu_s=cpu_s, cpu_load=cpu_load,
        transfer_s=got.get("gpu", {}).get("transfer", []),
        kernel_s=got.get("gpu", {}).get("kernel", []),
        overhead_cpu_s=overhead.get("cpu", 0.0), overhead_gpu_s=overhead.get("gpu", 0.0),
        overhead_gpu_alone_s=alone,
        measured=datetime.datetime.now().isoformat(timespec="seconds"), block=list(window.block),
        probe=probe, calls="driven", cpu_order="libmf",
        segments="shared" if overhead.get("shared") else "separate")
    return cal


def cluster_key(client: Any, cpu_worker: str | None, gpu_worker: str | None, k: int,
                dtype: str, gpu_kw: dict[str, Any], cpu_threads: int = 1,
                block: tuple[int, float] | None = None) -> str:
    """The cache key of a calibration on these workers (their GPU and CPU models, and how
    many CPU blocks ran at once) of blocks of ``block`` (items, ratings per user)."""
    from mgpu.distributed.cluster import describe_workers

    infos = describe_workers(client)
    gpu = (infos.get(gpu_worker, {}).get("gpu") or {}).get("name") if gpu_worker else None
    cpu = infos.get(cpu_worker, {}).get("cpu_model") if cpu_worker else None
    return calibration_key(gpu, cpu, k, dtype, gpu_kw, cpu_threads if cpu_worker else 0, block)


def _about(x: float) -> float:
    """x rounded to the nearest power of √2 (0 stays 0)."""
    return 0.0 if x <= 0 else float(2.0 ** (round(2.0 * np.log2(x)) / 2.0))


def calibration_key(gpu: str | None, cpu: str | None, k: int, dtype: str,
                    gpu_kw: dict[str, Any], cpu_threads: int = 1,
                    block: tuple[int, float] | None = None) -> str:
    """What a calibration depends on, as its cache key.

    A block's items and ratings per user enter rounded to the nearest power of √2, so that
    one calibration serves blocks of about its shape (the same ratings split 90/10 or whole).

    >>> calibration_key("NVIDIA H100", "AMD EPYC", 128, "float32", {"conflicts": 4.0}, 15,
    ...                 (1185, 12.3))
    'gpu=NVIDIA H100|cpu=AMD EPYC×15|k=128|float32|conflicts=4.0|items~1024|per-user~11.31'
    """
    opts = "".join(f"|{k_}={v}" for k_, v in sorted(gpu_kw.items()) if v is not None)
    cpu = f"{cpu}×{cpu_threads}" if cpu and cpu_threads > 1 else cpu
    shape = (f"|items~{_about(block[0]):.4g}|per-user~{_about(block[1]):.4g}" if block
             else "")
    return f"gpu={gpu or '-'}|cpu={cpu or '-'}|k={k}|{dtype}{opts}{shape}"
