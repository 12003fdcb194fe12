"""Communicators of an SPMD job: one per worker, ranks ``0 … size-1``, collectives with timeouts.

Two implementations of one interface (:class:`HostComm`, :class:`NcclComm`):

- every rank holds a TCP link to every other rank (the host channel), opened by the job's
  first call and kept for the next ones (:func:`mgpu.distributed.spmd.spmd` caches the
  communicator per set of workers). On CPU workers the collectives go over it: the root
  gathers, reduces **in rank order** (so a sum is the same as one process summing the parts
  in tile order), and sends the result back;
- on GPU workers the collectives run through NCCL (``cupy.cuda.nccl``) on device buffers;
  the NCCL unique id is made by rank 0 and handed to the others over the host channel, which
  also carries small Python objects, checkpoints and, when a collective times out, the
  question of who is where.

Every collective waits at most ``timeout`` seconds. A rank that does not arrive is named in a
:class:`CollectiveTimeout`; a rank whose link closes (its worker died) in a
:class:`WorkerLost`; ranks that call different collectives at the same step in a
:class:`CollectiveMismatch`. The root tells the other ranks which rank failed before it raises,
so every rank's error names the same worker.
"""
from __future__ import annotations

import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from distributed.protocol.serialize import deserialize_bytes, serialize_bytelist

logger = logging.getLogger(__name__)

__all__ = ["CollectiveError", "CollectiveMismatch", "CollectiveTimeout", "HostComm", "NcclComm",
           "WorkerLost"]


class CollectiveError(RuntimeError):
    """A collective of an SPMD job could not complete. ``worker`` is the worker to blame
    (its address), when one is known."""

    def __init__(self, message: str, worker: str | None = None):
        super().__init__(message)
        self.worker = worker

    def __reduce__(self) -> tuple:
        return type(self), (str(self), self.worker)


class CollectiveTimeout(CollectiveError, TimeoutError):
    """A rank did not arrive at a collective within the timeout."""


class WorkerLost(CollectiveError):
    """A rank's link closed in the middle of a job: its worker is gone."""


class CollectiveMismatch(CollectiveError):
    """Ranks called different collectives at the same step (a bug of the job's function)."""


_REDUCE: dict[str, Callable[[Any, Any], Any]] = {
    "sum": lambda a, b: a + b, "max": np.maximum, "min": np.minimum}
# the root's verdict that ends a collective on every rank: (kind, message, worker)
_ABORT = "mgpu-abort"


_KINDS: dict[str, type[CollectiveError]] = {
    "timeout": CollectiveTimeout, "lost": WorkerLost, "mismatch": CollectiveMismatch,
    "failed": CollectiveError}


class _Timeout(Exception):
    pass


class _Closed(Exception):
    pass


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> memoryview:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Timeout
        sock.settimeout(left)
        try:
            k = sock.recv_into(view[got:], n - got)
        except TimeoutError:
            raise _Timeout from None
        except OSError as exc:
            raise _Closed(str(exc)) from None
        if k == 0:
            raise _Closed("connection closed")
        got += k
    return view


# a message on a link: its kind (data, or a verdict that ends the job) and its length, then
# Dask's serialization of the object (array buffers sent as they lie)
_WIRE = struct.Struct("<cQ")
_DATA, VERDICT = b"D", b"A"


def send_obj(sock: socket.socket, obj: Any, kind: bytes = _DATA) -> None:
    """Send ``obj`` to the peer of ``sock``, serialized as Dask serializes task data (the
    peers are the cluster's own workers, met through the job's secret key in :func:`mesh`)."""
    # bytes of every frame (an empty array's frame has no bytes, and no view to cast)
    frames = [memoryview(f).cast("B") if memoryview(f).nbytes else memoryview(b"")
              for f in serialize_bytelist(obj, compression=False)]
    sock.settimeout(None)
    try:
        sock.sendall(_WIRE.pack(kind, sum(f.nbytes for f in frames)))
        for f in frames:
            sock.sendall(f)
    except OSError as exc:
        raise _Closed(str(exc)) from None


def recv_obj(sock: socket.socket, deadline: float) -> Any:
    _, n = _WIRE.unpack(_recv_exact(sock, _WIRE.size, deadline))
    return deserialize_bytes(_recv_exact(sock, n, deadline))


class HostComm:
    """The host channel of one rank, and the collectives of CPU workers over it.

    Parameters
    ----------
    rank, size : int
    workers : list of str
        Every rank's worker address, in rank order (for the messages).
    links : dict of int to socket
        A connected socket to every other rank.
    timeout : float
        Seconds a collective waits for the ranks it needs.
    """

    xp = np

    def __init__(self, rank: int, size: int, workers: list[str],
                 links: dict[int, socket.socket], timeout: float):
        self.rank, self.size, self.workers = rank, size, list(workers)
        self._links = links
        self.timeout = float(timeout)
        self._seq = 0
        self.broken: CollectiveError | None = None

    # ------------------------------------------------------------------ the host channel

    def _who(self, r: int) -> str:
        return f"rank {r} (worker {self.workers[r]})"

    def _fail(self, error: CollectiveError) -> CollectiveError:
        self.broken = error
        return error

    def _recv_from(self, r: int, op: str, seq: int, deadline: float) -> Any:
        try:
            msg = recv_obj(self._links[r], deadline)
        except _Timeout:
            raise self._fail(CollectiveTimeout(
                f"{op} #{seq}: {self._who(r)} did not arrive within {self.timeout:g} s "
                "(raise mgpu.spmd.timeout if a step of this job takes longer).",
                self.workers[r])) from None
        except _Closed as exc:
            raise self._fail(WorkerLost(
                f"{op} #{seq}: the link to {self._who(r)} closed ({exc}): that worker is "
                "gone.", self.workers[r])) from None
        if msg[0] == _ABORT:
            raise self._fail(_KINDS[msg[1]](msg[2], msg[3]))
        if msg[0] != op or msg[1] != seq:
            raise self._fail(CollectiveMismatch(
                f"{op} #{seq} on {self._who(self.rank)} met {msg[0]} #{msg[1]} from "
                f"{self._who(r)}: every rank must call the same collectives in the same "
                "order."))
        return msg[2]

    def _send_to(self, r: int, msg: Any) -> None:
        try:
            send_obj(self._links[r], msg)
        except _Closed as exc:
            raise self._fail(WorkerLost(
                f"{msg[0]} #{msg[1]}: the link to {self._who(r)} closed ({exc}): that worker "
                "is gone.", self.workers[r])) from None

    def _abort_others(self, error: CollectiveError) -> None:
        """The root's verdict to every other rank (a late one reads it when it comes; the
        link of a lost one is closed, and skipped)."""
        kind = ("timeout" if isinstance(error, CollectiveTimeout)
                else "lost" if isinstance(error, WorkerLost) else "mismatch")
        for r in range(self.size):
            if r != self.rank:
                try:
                    send_obj(self._links[r], (_ABORT, kind, str(error), error.worker),
                             VERDICT)
                except _Closed:
                    pass

    def _next(self) -> int:
        if self.broken is not None:
            raise self.broken
        self._seq += 1
        return self._seq

    def gather_obj(self, obj: Any, root: int = 0, op: str = "gather") -> list[Any] | None:
        """Every rank's ``obj`` in rank order on ``root`` (None elsewhere)."""
        seq = self._next()
        if self.rank != root:
            self._send_to(root, (op, seq, obj))
            return None
        out: list[Any] = [None] * self.size
        out[root] = obj
        deadline = time.monotonic() + self.timeout
        for r in range(self.size):
            if r != root:
                try:
                    out[r] = self._recv_from(r, op, seq, deadline)
                except CollectiveError as exc:
                    self._abort_others(exc)
                    raise
        return out

    def bcast_obj(self, obj: Any = None, root: int = 0, op: str = "bcast") -> Any:
        """``root``'s ``obj`` on every rank."""
        seq = self._next()
        if self.rank == root:
            for r in range(self.size):
                if r != root:
                    self._send_to(r, (op, seq, obj))
            return obj
        # the root waits up to the timeout for the others first: wait longer for its verdict
        deadline = time.monotonic() + 2 * self.timeout + 5
        return self._recv_from(root, op, seq, deadline)

    def allgather_obj(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        return self.bcast_obj(self.gather_obj(obj, op="allgather"), op="allgather")

    def allreduce_obj(self, obj: Any, op: str = "sum") -> Any:
        """``obj`` (numbers or host arrays) reduced over the ranks in rank order."""
        parts = self.gather_obj(obj, op="allreduce")
        total = None
        if parts is not None:
            total = _reduce_in_order(parts, op)
        return self.bcast_obj(total, op="allreduce")

    def sendrecv_obj(self, obj: Any, dest: int, source: int) -> Any:
        """Send ``obj`` to ``dest`` while receiving from ``source`` (a ring step)."""
        seq = self._next()
        if dest == self.rank and source == self.rank:
            return obj
        error: list[BaseException] = []

        def send() -> None:
            try:
                self._send_to(dest, ("sendrecv", seq, obj))
            except BaseException as exc:  # raised in the caller's thread below
                error.append(exc)

        t = threading.Thread(target=send, daemon=True)
        t.start()
        try:
            got = self._recv_from(source, "sendrecv", seq, time.monotonic() + self.timeout)
        finally:
            t.join(self.timeout)
        if error:
            raise error[0]
        return got

    # -------------------------------------------------------------------- arrays on the host

    def allreduce(self, x: Any, op: str = "sum") -> np.ndarray:
        """``x`` reduced over the ranks (``op``: sum, max or min), in rank order."""
        _check_op(op)
        return np.asarray(self.allreduce_obj(np.ascontiguousarray(x), op))

    def allgather(self, x: Any) -> np.ndarray:
        """Every rank's ``x`` concatenated along axis 0, in rank order."""
        return np.concatenate(self.allgather_obj(np.ascontiguousarray(x)), axis=0)

    def broadcast(self, x: Any, root: int = 0) -> np.ndarray:
        """``root``'s ``x`` on every rank."""
        return np.asarray(self.bcast_obj(np.ascontiguousarray(x) if self.rank == root
                                         else None, root))

    def sendrecv(self, x: Any, dest: int, source: int) -> np.ndarray:
        """Send ``x`` to ``dest``; return what ``source`` sent to this rank."""
        return np.asarray(self.sendrecv_obj(np.ascontiguousarray(x), dest, source))

    def barrier(self) -> None:
        """Return once every rank has called it."""
        self.allgather_obj(None)

    def poll_abort(self) -> None:
        """Without waiting: raise what a peer's verdict says, or WorkerLost for a link that
        closed; a peer's ordinary message (it is a step ahead) is left to be read."""
        links = list(self._links.items())
        if not links:
            return
        readable, _, _ = select.select([s for _, s in links], [], [], 0)
        for r, s in links:
            if s not in readable:
                continue
            try:
                head = s.recv(1, socket.MSG_PEEK)
            except OSError:
                head = b""
            if not head:
                raise self._fail(WorkerLost(f"the link to {self._who(r)} closed: that worker "
                                            "is gone.", self.workers[r]))
            if head == VERDICT:
                self._recv_from(r, "abort", 0, time.monotonic() + self.timeout)

    def close(self) -> None:
        for s in self._links.values():
            try:
                s.close()
            except OSError:
                pass
        self._links = {}


def _check_op(op: str) -> None:
    if op not in _REDUCE:
        raise ValueError(f"The 'op' parameter of a collective must be one of "
                         f"{sorted(_REDUCE)}. Got {op!r} instead.")


def _reduce_in_order(parts: list[Any], op: str) -> Any:
    _check_op(op)
    total = parts[0]
    if isinstance(total, np.ndarray):
        total = total.copy()
    for p in parts[1:]:
        total = _REDUCE[op](total, p)
    return total


class NcclComm:
    """Collectives between GPU workers through NCCL, on CuPy arrays of the current device.

    Built from a rank's :class:`HostComm` (which stays its host channel: small objects,
    checkpoints, and finding the rank that did not arrive when a collective times out). Each
    collective is queued on the current stream and waited for with the timeout; on timeout
    the NCCL communicator is aborted and the ranks are asked where they are.
    """

    def __init__(self, host: HostComm):
        import cupy
        from cupy.cuda import nccl

        self.host, self.xp, self._nccl = host, cupy, nccl
        self.rank, self.size, self.workers = host.rank, host.size, host.workers
        uid = host.bcast_obj(nccl.get_unique_id() if host.rank == 0 else None, op="nccl-id")
        self._comm = nccl.NcclCommunicator(host.size, uid, host.rank)
        self._types = {np.dtype(np.float32): nccl.NCCL_FLOAT32,
                       np.dtype(np.float64): nccl.NCCL_FLOAT64,
                       np.dtype(np.int32): nccl.NCCL_INT32,
                       np.dtype(np.int64): nccl.NCCL_INT64,
                       np.dtype(np.uint8): nccl.NCCL_UINT8,
                       np.dtype(np.int8): nccl.NCCL_INT8,
                       np.dtype(np.uint32): nccl.NCCL_UINT32,
                       np.dtype(np.uint64): nccl.NCCL_UINT64,
                       np.dtype(np.float16): nccl.NCCL_FLOAT16}
        self._ops = {"sum": nccl.NCCL_SUM, "max": nccl.NCCL_MAX, "min": nccl.NCCL_MIN}
        self._seq = 0
        self.broken: CollectiveError | None = None
        # NCCL connects its channels at the first collective, blocking the host until every
        # rank is there: make that happen now, while all of them are starting, so that a
        # later collective's wait is the polled one, with its timeout
        self.allreduce(self.xp.zeros(1, dtype=np.float32))

    @property
    def timeout(self) -> float:
        return self.host.timeout

    def _prepare(self, x: Any) -> tuple[Any, int]:
        if self.broken is not None:
            raise self.broken
        x = self.xp.ascontiguousarray(self.xp.asarray(x))
        if x.dtype == np.bool_:
            raise TypeError("NCCL collectives take numbers; cast boolean arrays first.")
        try:
            return x, self._types[x.dtype]
        except KeyError:
            raise TypeError(f"NCCL collectives take {sorted(str(t) for t in self._types)}. "
                            f"Got an array of {x.dtype} instead.") from None

    def _wait(self, op: str) -> None:
        """Wait for the queued collective, at most ``timeout``; spin briefly, then sleep."""
        self._seq += 1
        stream = self.xp.cuda.get_current_stream()
        done = stream.record()
        start = time.monotonic()
        deadline = start + self.timeout
        pause = 0.0
        while not done.done:
            now = time.monotonic()
            if now > deadline:
                self._timed_out(op)
            if now - start > 0.001:
                # at most 0.1 ms late: a step's collectives are often a millisecond or less
                pause = min(max(pause * 2, 2e-5), 1e-4)
            time.sleep(pause)
            if now - start > 0.01:
                self._check_peers(op)

    def _check_peers(self, op: str) -> None:
        """A peer's verdict or closed link on the host channel, or NCCL's own error, ends
        the wait at once (a rank whose function raised does not come to the collective)."""
        try:
            self.host.poll_abort()
        except CollectiveError as exc:
            self.broken = exc
            try:
                self._comm.abort()
            except Exception:  # aborting a failed communicator may itself fail
                logger.debug("NCCL abort failed", exc_info=True)
            raise
        check = getattr(self._comm, "check_async_error", None)
        if check is not None:
            try:
                check()
            except Exception as exc:  # NCCL's own error: a peer failed
                self._timed_out(op, exc)

    def _timed_out(self, op: str, cause: BaseException | None = None) -> None:
        try:
            self._comm.abort()
        except Exception:  # aborting a failed communicator may itself fail
            logger.debug("NCCL abort failed", exc_info=True)
        try:
            # every rank's count of device collectives, or the error naming the one that
            # does not answer
            seqs = self.host.allgather_obj(self._seq)
        except CollectiveError as exc:
            self.broken = exc
            raise exc from cause
        behind = [r for r, s in enumerate(seqs) if s < self._seq]
        who = ", ".join(self.host._who(r) for r in behind) or "no rank"
        why = f" (NCCL: {cause})" if cause is not None else ""
        self.broken = CollectiveTimeout(
            f"{op} #{self._seq} on the GPUs did not complete within {self.timeout:g} s{why}: "
            f"{who} had not reached it. Raise mgpu.spmd.timeout if a step of this job takes "
            "longer.", self.workers[behind[0]] if behind else None)
        raise self.broken from cause

    def allreduce(self, x: Any, op: str = "sum") -> Any:
        """``x`` reduced over the ranks on the devices (NCCL's order of summation)."""
        _check_op(op)
        x, t = self._prepare(x)
        out = self.xp.empty_like(x)
        stream = self.xp.cuda.get_current_stream()
        self._comm.allReduce(x.data.ptr, out.data.ptr, x.size, t, self._ops[op], stream.ptr)
        self._wait("allreduce")
        return out

    def allgather(self, x: Any) -> Any:
        """Every rank's ``x`` concatenated along axis 0, in rank order (first dimensions may
        differ: the sizes go over the host channel and the parts are padded)."""
        x, t = self._prepare(x)
        rows = self.host.allgather_obj(int(x.shape[0]) if x.ndim else 1)
        tail = x.shape[1:]
        top = max(rows)
        per = int(np.prod(tail, dtype=np.int64)) * top
        padded = self.xp.zeros((top, *tail), dtype=x.dtype)
        padded[:x.shape[0]] = x
        out = self.xp.empty((self.size * top, *tail), dtype=x.dtype)
        stream = self.xp.cuda.get_current_stream()
        self._comm.allGather(padded.data.ptr, out.data.ptr, per, t, stream.ptr)
        self._wait("allgather")
        if all(r == top for r in rows):
            return out
        return self.xp.concatenate([out[r * top:r * top + n] for r, n in enumerate(rows)])

    def broadcast(self, x: Any, root: int = 0) -> Any:
        """``root``'s ``x`` on every rank (the others pass an array of its shape and dtype)."""
        x, t = self._prepare(x)
        out = x if self.rank == root else self.xp.empty_like(x)
        stream = self.xp.cuda.get_current_stream()
        self._comm.broadcast(x.data.ptr, out.data.ptr, x.size, t, root, stream.ptr)
        self._wait("broadcast")
        return out

    def sendrecv(self, x: Any, dest: int, source: int) -> Any:
        """Send ``x`` to ``dest``; return what ``source`` sent (of ``x``'s shape and dtype)."""
        x, t = self._prepare(x)
        if dest == self.rank and source == self.rank:
            return x.copy()
        out = self.xp.empty_like(x)
        stream = self.xp.cuda.get_current_stream()
        self._nccl.groupStart()
        self._comm.send(x.data.ptr, x.size, t, dest, stream.ptr)
        self._comm.recv(out.data.ptr, out.size, t, source, stream.ptr)
        self._nccl.groupEnd()
        self._wait("sendrecv")
        return out

    def barrier(self) -> None:
        self.allreduce(self.xp.zeros(1, dtype=np.float32))

    def __getattr__(self, name: str) -> Any:
        # the object collectives (gather_obj, bcast_obj, …) are the host channel's
        if name.endswith("_obj"):
            return getattr(self.host, name)
        raise AttributeError(name)

    def close(self) -> None:
        try:
            self._comm.destroy()
        except Exception:  # a communicator aborted after a failure
            logger.debug("NCCL destroy failed", exc_info=True)
        self.host.close()


# ------------------------------------------------------------------------ the host mesh


def listen(host: str) -> socket.socket:
    """A listening socket for this rank's peers."""
    # an IPv6 worker address gets an IPv6 listener
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, 0), family=family, backlog=128)


def _tune(s: socket.socket) -> socket.socket:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _hello(key: str, rank: int) -> bytes:
    return key.encode() + struct.pack("<I", rank)


def mesh(key: str, rank: int, addresses: list[tuple[str, int]], listener: socket.socket,
         timeout: float) -> dict[int, socket.socket]:
    """Connect this rank to every other: it dials the lower ranks and answers the higher.

    A dialler first sends the job's key (a random id only the job's ranks were given) and
    its rank as plain bytes; a connection without the key is closed before anything of it
    is deserialized. Raises CollectiveTimeout naming the ranks that never dialled in.
    """
    links: dict[int, socket.socket] = {}
    deadline = time.monotonic() + timeout
    for r in range(rank):
        while True:
            try:
                s = socket.create_connection(addresses[r],
                                             timeout=max(deadline - time.monotonic(), 0.1))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise CollectiveTimeout(f"rank {r} at {addresses[r]} did not answer within "
                                            f"{timeout:g} s when the job started.") from None
                time.sleep(0.05)
        _tune(s).sendall(_hello(key, rank))
        links[r] = s
    size = len(_hello(key, 0))
    while len(links) < len(addresses) - 1:
        left = deadline - time.monotonic()
        if left <= 0:
            missing = [r for r in range(len(addresses)) if r != rank and r not in links]
            raise CollectiveTimeout(f"rank(s) {missing} did not connect within {timeout:g} s "
                                    "when the job started.")
        listener.settimeout(left)
        try:
            s, _ = listener.accept()
        except TimeoutError:
            continue
        try:
            hello = bytes(_recv_exact(_tune(s), size, min(deadline, time.monotonic() + 10)))
        except (_Timeout, _Closed):
            s.close()
            continue
        r = struct.unpack("<I", hello[-4:])[0]
        if hello[:-4] != key.encode() or not 0 <= r < len(addresses) or r == rank:
            s.close()  # not one of this job's ranks
            continue
        links[r] = s
    return links
