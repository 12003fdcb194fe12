"""Block hosts: one Dask actor per worker holding its blocks' ratings and the factor
segments, running the blocks the block scheduler sends it.

Why actors and not a Dask task per block: a task's submission, its dependencies and its end
travel through the Dask scheduler, and with a worker's threads all running SGD that costs
tens of milliseconds a task, as long as a block of SGD itself; a call to an actor goes from
the client straight to the worker and costs several times less.

Why the block scheduler runs on a host (:meth:`BlockHost.drive`, the worker with the most
slots): from the client, a CPU worker's slots ending their blocks together queue their
next calls behind one another, each call's messages out and back a sizeable fraction of
the block it runs. From the CPU worker's own host, a call to it needs no message and no
serialisation, and one whose inputs are there goes straight to the host's threads, past its
event loop (:meth:`BlockHost.run_here`).

Segments are versioned, so the dataflow is the same as with futures: the scheduler numbers
each segment's updates and tells a call which version of each input it needs and where that
version will be (:class:`SegmentMap`); a host waits for a version it will make itself (a
call queued behind its own running one), or takes it from the host that makes it, which
gives it up (the scheduler never sends a segment's next update back to a holder it moved
from). Blocks run in place on the host's segments: two calls in flight never update the
same segment (the block scheduler's conflict rule), and a call's inputs are the versions
the calls before it left.

On a GPU worker the host runs one call at a time (in order of arrival, once its inputs are
there) on the device: a block's ratings are staged there once
(:func:`mgpu.mf.staging.stage_block`), segments stay on the device between calls, and each
call leaves pinned host copies of what it updated (:func:`mgpu.mf.staging.host_copy`), sent
when another host takes them, so that nobody waits behind the GPU's next kernel. On a CPU
worker it runs as many calls at once as the worker has threads, each a numba pass (nogil).
"""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import contextvars
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from mgpu.backends import is_gpu_array, to_device
from mgpu.mf.segments import Key, SegmentMap, SegmentStore, store_supported
from mgpu.mf.staging import host_copy, run_staged, stage_block

# SegmentMap, SegmentStore and store_supported live in mgpu.mf.segments; they are
# importable from here too, as before
__all__ = ["BlockHost", "Driver", "HostLost", "SegmentMap", "SegmentStore", "call",
           "share_segments", "start_hosts", "store_supported"]

logger = logging.getLogger(__name__)


class BlockHost:
    """Blocks and factor segments on one worker (an actor: create it with
    :func:`start_hosts`)."""

    def __init__(self, kind: str, threads: int, gpu_kw: dict[str, Any] | None = None,
                 switch_interval: float | None = None):
        self.kind = kind
        self.gpu_kw = dict(gpu_kw or {})
        self.scheme = self.gpu_kw.get("scheme", "wavefront")  # how its GPU stages blocks
        self.pool = cf.ThreadPoolExecutor(1 if kind == "gpu" else max(1, int(threads)))
        self.blocks: dict[Any, Any] = {}  # block id -> (users, items, ratings) on the host
        self.staged: dict[Any, Any] = {}  # block id -> its ratings on the device (GPU)
        self.segs: dict[Key, tuple[int, Any, Any]] = {}  # key -> (version, array, host copy)
        self.waiting: dict[tuple[Key, int], asyncio.Event] = {}
        # segments set from a thread (:meth:`run_here`) and waited for on the event loop
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.peers: dict[str, Any] = {}
        self.address: str | None = None  # this host's worker
        self.state: dict[str, Any] = {}  # what functions run by :meth:`drive` keep here
        self.timings: list[dict[str, float]] = []  # each call's seconds (:meth:`call_times`)
        self._driver: cf.ThreadPoolExecutor | None = None
        self.store: SegmentStore | None = None  # the node's shared segments
        self.store_peers: set[str] = set()  # the hosts that map it too
        self._switch: tuple[float, float] | None = None  # (Python's, this host's)
        if switch_interval:  # a call to another host waits less for the interpreter
            self._switch = (sys.getswitchinterval(), float(switch_interval))
            sys.setswitchinterval(float(switch_interval))

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at the interpreter's exit, CUDA may be gone
            if getattr(self, "store", None) is not None:
                self.store.close()
        if getattr(self, "_switch", None) is not None \
                and sys.getswitchinterval() == self._switch[1]:
            sys.setswitchinterval(self._switch[0])

    # ------------------------------------------------------------------- set up, look
    async def set_peers(self, peers: dict[str, Any]) -> None:
        """The other hosts, by worker address (this one's among them)."""
        from distributed import get_worker

        self.peers = dict(peers)
        self.address = get_worker().address
        self._loop = asyncio.get_running_loop()

    async def share(self, path: str | None, layout: Sequence[tuple[Key, int]], k: int,
                    dtype: str) -> str | None:
        """Map the node's shared segments (:class:`SegmentStore`): a new file where ``path``
        is None, returning its path, or None where this node cannot hold one
        (:func:`store_supported`); else the file another host of the node made, returning
        it, or None where it cannot be opened here (a worker in another container)."""
        create = path is None
        if create:
            why = store_supported(SegmentStore.offsets(layout, k, dtype)[1])
            if why is not None:
                logger.info("factor segments not shared on this node: %s", why)
                return None
            path = os.path.join("/dev/shm", f"mgpu-segments-{uuid.uuid4().hex}")
        try:
            store = await self._in_pool(SegmentStore, path, layout, k, dtype, create)
        except OSError as e:
            logger.info("factor segments not shared with this host: %s", e)
            return None
        if self.kind == "gpu":
            await self._in_pool(store.pin)
        self.store = store
        return path

    async def shared_with(self, peers: Sequence[str], unlink: bool = False) -> None:
        """The hosts that map this host's store (this one among them); with no other, the
        store is let go. ``unlink``: remove its file's name (the maps stay until let go)."""
        if self.store is None:
            return
        if unlink:
            os.unlink(self.store.path)
        if len(set(peers) - {self.address}) == 0:
            self.store.close()
            self.store, self.store_peers = None, set()
        else:
            self.store_peers = set(peers) - {self.address}

    async def drive(self, fn: Any, *args: Any) -> Any:
        """``fn(driver, *args)`` run on this host's driver thread, its result returned:
        ``driver`` (:class:`Driver`) calls this host and the others from here, so that a
        loop over calls (the block scheduler's epoch) sends the calls to this worker's
        slots without a message between processes. One function runs at a time.

        While it runs, the Dask scheduler is asked every half second which workers there
        are; once another host's worker has left, the driver's calls in flight are
        cancelled (a call to an actor whose worker is gone can wait for it forever) and
        this raises :class:`HostLost`."""
        from distributed import get_worker

        if self._driver is None:
            self._driver = cf.ThreadPoolExecutor(1, thread_name_prefix="mgpu-driver")
        loop = asyncio.get_running_loop()
        worker = get_worker()
        driver = Driver(self, loop, worker)
        # in this call's context, where Dask knows its worker: the calls to other hosts
        # (Dask actors) made from the driver thread find it there
        ctx = contextvars.copy_context()
        work = loop.run_in_executor(self._driver, ctx.run, fn, driver, *args)
        watch = asyncio.ensure_future(self._watch(worker))
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
            if work.done():
                return work.result()
            gone = watch.result()
            driver.abort()
            await asyncio.wait({work}, timeout=30)  # its calls cancelled, it ends
            if work.done() and not work.cancelled():
                work.exception()  # the cancellation, which HostLost reports: retrieved
            raise HostLost(f"a block host's worker left the cluster ({', '.join(gone)})")
        finally:
            watch.cancel()

    async def _watch(self, worker: Any, every: float = 0.5) -> list[str]:
        """The other hosts' workers that left the cluster, once some have."""
        others = set(self.peers) - {self.address}
        while True:
            await asyncio.sleep(every)
            try:
                alive = await worker.scheduler.ncores()
            except OSError:  # the scheduler out of reach: this worker's own end is near
                continue
            gone = sorted(others - set(alive))
            if gone:
                return gone

    async def put(self, blocks: dict[Any, Any], segments: dict[Key, np.ndarray],
                  stage: Sequence[Any] = (), dtype: str = "float64", seed: int = 0) -> None:
        """Blocks' ratings (local ids) and segments at version 0; the blocks in ``stage``
        go on the device once, for every epoch (GPU)."""
        self.blocks.update(blocks)
        for key, arr in segments.items():
            self._set(key, 0, *await self._in_pool(self._adopt, key, arr))
        for b in stage:
            await self._stage(b, dtype, seed)

    async def prefetch(self, ids: Sequence[Any], sources: dict[Any, str],
                       dtype: str = "float64", seed: int = 0) -> None:
        """Blocks this host will run from now on, fetched (and staged on a GPU) now."""
        await asyncio.gather(*(self._fetch_block(b, sources, dtype, seed) for b in ids))

    async def block(self, b: Any) -> Any:
        """A block's ratings, for a host that runs it without holding it."""
        return self.blocks[b]

    async def take(self, key: Key, version: int, keep: bool = False) -> np.ndarray:
        """A segment at ``version`` (waiting until it is made), as a host array; given up
        here unless ``keep``, and then at ``version`` or later (a copy: a calibration's)."""
        await self._wait(key, version, newer=keep)
        with self._lock:
            _, arr, host = self.segs[key] if keep else self.segs.pop(key)
        return arr if host is None else host

    async def held(self) -> dict[Key, int]:
        """The segments held here and their versions."""
        with self._lock:  # pool threads set segments (:meth:`run_here`)
            return {key: v for key, (v, _, _) in self.segs.items()}

    async def call_times(self) -> list[dict[str, float]]:
        """Where each call's time went since the last asking, in seconds (and forgotten
        here): ``inputs`` waiting for and taking its segments and blocks, ``queued`` waiting
        for a thread (a CPU worker's) or the device (a GPU's), ``run`` its blocks with their
        copies; on a GPU, of ``run``, ``h2d`` the segments sent to the device, ``kernel``
        the SGD kernels and ``copy`` the host copies of what it updated (the device's own
        timings)."""
        out, self.timings = self.timings, []
        return out

    async def collect(self, wanted: dict[Key, int]) -> dict[Key, np.ndarray]:
        """Segments at the given versions, as host arrays, kept here (the client's RMSE)."""
        return {key: await self.take(key, v, keep=True) for key, v in wanted.items()}

    async def warm(self, k: int) -> None:
        """Blocks run here as an epoch runs them, before the first epoch's clock starts (one
        rating on a CPU, 16,384 on a GPU): on a CPU the numba pass compiles or loads for k
        (float64); on a GPU ``kernels/sgd.cu`` and every CuPy kernel a call uses (staging
        ratings, segments from the host and left on the device, the host copies) compile or
        load. Otherwise the first epoch is the compiler's: a fresh machine's first GPU
        compile takes seconds, longer than a small data set's whole epoch, and the first
        epoch's rates are what rows are handed over by. A GPU block is of a real block's
        order of size because cupy.bincount (a block's busiest user and item,
        ``mgpu.mf.gpu-conflicts``) runs another kernel from some thousands of values on,
        compiled on its first use (seconds again), which a one-rating block would leave to
        the first epoch."""
        await self._in_pool(self._warm, k)

    def _warm(self, k: int) -> None:
        n, m = (1 << 14, 1 << 12) if self.kind == "gpu" else (1, 1)
        block = (np.arange(n, dtype=np.int64) % m, np.arange(n, dtype=np.int64) // 4 % m,
                 np.ones(n))
        seg = np.zeros((m, k))
        self.blocks["warm"] = block
        if self.kind == "gpu":
            self.staged["warm"] = stage_block(block, seg.dtype, 0, self.scheme)
        _, outs, _ = self._run_blocks(["warm"], [seg.copy()], seg.copy(), 0.0, 0.0)
        self._run_blocks(["warm"], [outs[0][0]], outs[1][0], 0.0, 0.0)  # left as made
        del self.blocks["warm"]
        self.staged.pop("warm", None)

    # ------------------------------------------------------------------------- a call
    async def run(self, ids: Sequence[Any], p_in: Sequence[tuple[Key, int, str | None, bool]],
                  q_in: tuple[Key, int, str | None, bool], p_out: Sequence[tuple[Key, int]],
                  q_out: tuple[Key, int], lr: float, reg: float, seed: int,
                  sources: dict[Any, str] | None = None, dtype: str = "float64") -> float:
        """Blocks of one column, one after the other: SGD over block ``ids[j]`` on user
        segment ``p_in[j]`` and the item segment ``q_in``, each input ``(key, version,
        holder, keep)`` (holder None: this host); the results become ``p_out[j]`` and
        ``q_out`` (key, version). ``sources`` names a host holding each block this one does
        not. Returns the seconds the blocks took here, inputs gathered (:meth:`call_times`
        says where the rest went)."""
        t0 = time.perf_counter()
        got = await asyncio.gather(*(self._input(*x) for x in (*p_in, q_in)),
                                   *(self._fetch_block(b, sources or {}, dtype, seed)
                                     for b in ids))
        Ps, Q = list(got[:len(p_in)]), got[len(p_in)]
        t1 = time.perf_counter()
        return await self._in_pool(self._run_direct, list(ids), Ps, Q, [*p_out, q_out], lr,
                                   reg, t1, t1 - t0)

    def run_here(self, ids: Sequence[Any], p_in: Sequence[tuple[Key, int, str | None, bool]],
                 q_in: tuple[Key, int, str | None, bool], p_out: Sequence[tuple[Key, int]],
                 q_out: tuple[Key, int], lr: float, reg: float, seed: int,
                 sources: dict[Any, str] | None = None, dtype: str = "float64"
                 ) -> cf.Future | None:
        """:meth:`run` from a thread of this host's own process (the driver's), straight
        to its pool, or None where it must go through :meth:`run`: an input not held
        here at its version, or a block not here (not staged, on a GPU). A call on its
        way through the event loop takes 3–4 hops there (in, to a thread, back, out), and
        with every CPU thread busy and another host's calls on the loop, a CPU block's call
        waits milliseconds on them."""
        arrs = []
        with self._lock:  # against the event loop's _wait and take
            for key, v, holder, keep in (*p_in, q_in):
                if holder is None:
                    h = self.segs.get(key)
                    if h is None or h[0] != v:
                        return None
                    arrs.append(h[1])
                elif self._shared(key, holder, keep) and self.store is not None \
                        and self.store.version(key) == v:
                    arrs.append(self.store.views[key])
                else:
                    return None
        if any(b not in self.blocks or self.kind == "gpu" and b not in self.staged
               for b in ids):
            return None
        Ps, Q = arrs[:-1], arrs[-1]
        return self.pool.submit(self._run_direct, list(ids), Ps, Q, [*p_out, q_out], lr, reg,
                                time.perf_counter())

    def _run_direct(self, ids: list[Any], Ps: list[Any], Q: Any, outs_at: list[tuple[Key, int]],
                    lr: float, reg: float, sent: float, inputs: float = 0.0) -> float:
        """A call's blocks on a pool thread, its inputs gathered at ``sent`` (after
        ``inputs`` seconds): the outputs set (their waiters woken) and the call's times
        kept."""
        views = self.store.views if self.store is not None else {}
        took, outs, times = self._run_blocks(ids, Ps, Q, lr, reg,
                                             [views.get(key) for key, _ in outs_at])
        for (key, v), out in zip(outs_at, outs):
            self._set(key, v, *out)
        self.timings.append({"inputs": inputs, "queued": time.perf_counter() - sent - took,
                             "run": took, **times})
        return took

    def _run_blocks(self, ids: list[Any], Ps: list[Any], Q: Any, lr: float, reg: float,
                    into: Sequence[Any] = ()
                    ) -> tuple[float, list[tuple[Any, Any]], dict[str, float]]:
        """The blocks run; returns their seconds, each output (P segments, then Q) with its
        host copy (None on a CPU, where the output is the host array), and on a GPU the
        device's timings. A GPU copies an output into ``into``'s array for it where there
        is one (the node's shared segments), else into pinned memory of its own."""
        from mgpu.mf.sgd import sgd_block

        t0 = time.perf_counter()
        times: dict[str, float] = {}
        if self.kind == "gpu":
            import cupy

            marks = [cupy.cuda.Event() for _ in range(4)]
            marks[0].record()
            Ps, Q = [self._on_device(P) for P in Ps], self._on_device(Q)
            marks[1].record()
            for b, P in zip(ids, Ps):
                run_staged(self.staged[b], P, Q, lr, reg, reg, self.gpu_kw)
            marks[2].record()
            outs = []
            for a, dst in zip((*Ps, Q), list(into) or [None] * (len(Ps) + 1)):
                if dst is None:
                    outs.append((a, host_copy(a)))
                else:
                    a.get(out=dst)
                    outs.append((a, dst))
            marks[3].record()
            marks[3].synchronize()
            for name, a, b in zip(("h2d", "kernel", "copy"), marks, marks[1:]):
                times[name] = 1e-3 * cupy.cuda.get_elapsed_time(a, b)
        else:
            for b, P in zip(ids, Ps):  # in the order the ratings are kept (LIBMF's)
                sgd_block(*self.blocks[b], P, Q, lr, reg, reg)
            outs = [(a, None) for a in (*Ps, Q)]
        return time.perf_counter() - t0, outs, times

    # ---------------------------------------------------------------------- helpers
    async def _in_pool(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def _adopt(self, key: Key, arr: np.ndarray) -> tuple[Any, Any]:
        """A segment arrived from elsewhere, as held here: (array, host copy), in the
        node's shared segments where they hold it."""
        view = self.store.views.get(key) if self.store is not None else None
        if view is not None:
            np.copyto(view, arr)
            arr = view
        if self.kind == "gpu":
            import cupy

            return cupy.asarray(arr), arr
        return (arr if view is not None else np.array(arr)), None

    def _shared(self, key: Key, holder: str | None, keep: bool) -> bool:
        """Whether an input made by ``holder`` is read from the node's shared segments."""
        return (not keep and holder is not None and self.store is not None
                and holder in self.store_peers and key in self.store.index)

    async def _store_wait(self, key: Key, version: int) -> None:
        assert self.store is not None
        delay = 5e-5
        while self.store.version(key) < version:
            await asyncio.sleep(delay)
            delay = min(2.0 * delay, 1e-3)

    @staticmethod
    def _on_device(a: Any) -> Any:
        # this host is a GPU's: an input is either the segment it left on the device (taken
        # as it is) or a host array that arrived (copied there by to_device)
        return a if is_gpu_array(a) else to_device(a)

    def _set(self, key: Key, version: int, arr: Any, host: Any) -> None:
        """A segment's new version, and whoever waits for it woken (on the event loop, from
        wherever this runs); in the node's shared segments too, where they hold it (copied
        there unless made there)."""
        store = self.store
        if store is not None and key in store.index:
            view, src = store.views[key], arr if host is None else host
            if src is not view:
                np.copyto(view, src)
            store.publish(key, version)
        with self._lock:
            self.segs[key] = (version, arr, host)
            ev = self.waiting.pop((key, version), None)
        if ev is None:
            return
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop or self._loop is None:
            ev.set()
        else:
            self._loop.call_soon_threadsafe(ev.set)

    async def _wait(self, key: Key, version: int, newer: bool = False) -> None:
        with self._lock:
            held = self.segs.get(key)
            if held is not None and (held[0] == version or newer and held[0] > version):
                return
            ev = self.waiting.setdefault((key, version), asyncio.Event())
        await ev.wait()

    async def _input(self, key: Key, version: int, holder: str | None, keep: bool) -> Any:
        if holder is None:
            await self._wait(key, version)
            return self.segs[key][1]
        if self._shared(key, holder, keep):
            await self._store_wait(key, version)
            return self.store.views[key]  # type: ignore[union-attr]
        arr = await self.peers[holder].take(key, version, keep)
        if self.kind != "gpu":  # received buffers may be read-only
            arr = np.array(arr)
        return arr

    async def _fetch_block(self, b: Any, sources: dict[Any, str], dtype: str, seed: int
                           ) -> None:
        if b not in self.blocks:
            self.blocks[b] = await self.peers[sources[b]].block(b)
        if self.kind == "gpu" and b not in self.staged:
            await self._stage(b, dtype, seed)

    async def _stage(self, b: Any, dtype: str, seed: int) -> None:
        if b not in self.staged:
            self.staged[b] = await self._in_pool(stage_block, self.blocks[b], np.dtype(dtype),
                                                 seed + int(b), self.scheme)


class HostLost(RuntimeError):
    """A block host, or a host it takes from, could not be reached: its worker is gone."""


async def _reached(host: Any, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
                   ) -> Any:
    """A host's method awaited; a host that cannot be reached raises :class:`HostLost`."""
    try:
        return await getattr(host, method)(*args, **kwargs)
    except (OSError, cf.CancelledError) as e:  # Dask's word for an actor whose worker left
        raise HostLost(f"a block host's worker could not be reached ({type(e).__name__}: "
                       f"{e})") from e


def call(client: Any, host: Any, method: str, *args: Any, **kwargs: Any) -> cf.Future:
    """A host's method called from the client, as a ``concurrent.futures.Future`` (done
    callbacks, ``result()``), the call made on the client's event loop; a host that cannot
    be reached fails it with :class:`HostLost`."""
    out: cf.Future = cf.Future()

    async def go() -> None:
        try:
            out.set_result(await _reached(host, method, args, kwargs))
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the call
            out.set_exception(e)

    client.loop.add_callback(go)
    return out


class Driver:
    """How a function run by :meth:`BlockHost.drive` calls the hosts: :meth:`call` as
    :func:`call` does from the client, but from the driving host's worker. A call to that
    host has no message and no serialisation: a block call whose inputs are there goes to
    its threads (:meth:`BlockHost.run_here`), any other a coroutine put on its event loop;
    a call to another host goes straight from this worker to it. ``state`` is what the host
    keeps between functions (a job's scheduler and its segments' map); :meth:`log_event`
    logs to the Dask scheduler as :meth:`distributed.Client.log_event` does."""

    def __init__(self, host: BlockHost, loop: asyncio.AbstractEventLoop, worker: Any):
        self.host = host
        self.loop = loop
        self.state = host.state
        self.worker = worker
        self.flight: set[cf.Future] = set()
        self.aborted = False

    def call(self, worker: str, method: str, *args: Any, **kwargs: Any) -> cf.Future:
        """The method of the host on ``worker`` (an address), as a
        ``concurrent.futures.Future``; a host that cannot be reached fails it with
        :class:`HostLost`, and :meth:`abort` cancels it."""
        fut = None
        if worker == self.host.address:
            target = self.host
            if method == "run":
                fut = self.host.run_here(*args, **kwargs)
        else:
            target = self.host.peers[worker]
        if fut is None:
            fut = asyncio.run_coroutine_threadsafe(_reached(target, method, args, kwargs),
                                                   self.loop)
        self.flight.add(fut)
        fut.add_done_callback(self.flight.discard)
        if self.aborted:
            fut.cancel()
        return fut

    def abort(self) -> None:
        """Cancel the calls in flight and every later one (their futures end cancelled)."""
        self.aborted = True
        for fut in list(self.flight):
            fut.cancel()

    def log_event(self, topic: str, msg: Any) -> None:
        self.worker.log_event(topic, msg)


def start_hosts(client: Any, workers: dict[str, tuple[str, int]],
                gpu_kw: dict[str, Any] | None = None) -> dict[str, Any]:
    """One :class:`BlockHost` per worker (address -> (kind, threads)), each told of the
    others; returns the actors by worker address. Their processes run at
    ``mgpu.mf.switch-interval`` while they hold them."""
    from mgpu import config

    if client.direct_to_workers is None:
        # calls straight to the workers, not relayed by the scheduler (a client made with
        # direct_to_workers=False, for workers it cannot reach, keeps the relay)
        client.direct_to_workers = True
    switch = config.get("mf.switch-interval")
    futs = {w: client.submit(BlockHost, kind, threads, gpu_kw, switch, workers=[w],
                             actor=True, allow_other_workers=False, pure=False)
            for w, (kind, threads) in workers.items()}
    hosts = {w: f.result() for w, f in futs.items()}
    for f in [call(client, h, "set_peers", hosts) for h in hosts.values()]:
        f.result()
    return hosts


def share_segments(client: Any, hosts: dict[str, Any], layout: Sequence[tuple[Key, int]],
                   k: int, dtype: str) -> dict[str, list[str]]:
    """The hosts of each node that has more than one given one :class:`SegmentStore` of
    a job's segments (``layout``: (key, rows) pairs); returns the hosts sharing one, by
    node. A node that cannot hold one (:func:`store_supported`), or a host that cannot
    open another's file, goes on without: its segments travel as before."""
    from urllib.parse import urlparse

    by_node: dict[str, list[str]] = {}
    for w in sorted(hosts):
        by_node.setdefault(urlparse(w).hostname or w, []).append(w)
    out: dict[str, list[str]] = {}
    for node, ws in by_node.items():
        if len(ws) < 2:
            continue
        path = call(client, hosts[ws[0]], "share", None, list(layout), k, dtype).result()
        if path is None:
            continue
        opened = [(w, call(client, hosts[w], "share", path, list(layout), k, dtype))
                  for w in ws[1:]]
        got = [ws[0]] + [w for w, f in opened if f.result() is not None]
        for f in [call(client, hosts[w], "shared_with", got, w == ws[0]) for w in got]:
            f.result()
        if len(got) > 1:
            out[node] = got
    return out
