"""Partitioned sparse collections: dask arrays whose chunks are CSR matrices.

Chunk boundaries come from :mod:`mgpu.partition` (nnz prefix sums), so the chunks are uneven
in rows (or columns) and even in nonzeros. With a client, every chunk is made on one worker
and stays there (as cupyx CSR on GPU workers), so iterative jobs move only dense factors.

A chunk is a task that holds its piece of the matrix (:func:`place_as`), not scattered data:
the scheduler keeps the task, so when a worker is lost its chunks are made again on another
worker and a job that needed them goes on. The price is a copy of the matrix on the
scheduler (about its CSR bytes) for as long as the collection lives.
"""
from __future__ import annotations

import logging
import threading
import uuid
import weakref
from collections.abc import Callable
from typing import Any, Literal

import dask
import dask.array as da
import numpy as np
import scipy.sparse as sp
from dask.core import flatten

from mgpu.backends import to_device
from mgpu.distributed.cluster import CLIENT, current_client, describe_workers, workers_now
from mgpu.ops.validation import IsCallable, check_array, check_param
from mgpu.partition import axis_counts, part_sums, split_counts

logger = logging.getLogger(__name__)

__all__ = ["block_futures", "check_gpu_room", "chunk_nnz", "chunk_workers", "device_copy",
           "from_scipy", "gather", "gpu_workers", "place_as"]

_INT32_MAX = np.iinfo(np.int32).max

_device_copies: dict[int, tuple[weakref.ref, Any]] = {}
_device_lock = threading.Lock()


def device_copy(X: Any, convert: Callable[[Any], Any]) -> Any:
    """``convert(X)`` made once per object a worker holds and kept while it holds it.

    Data sent to a worker stays on the host (a placed SDDMM factor, a broadcast graph); the
    GPU copy is made on first use and found again on the next call, so it crosses PCIe once,
    not every call. Objects that cannot be weakly referenced are converted every time.

    >>> import numpy as np
    >>> X = np.ones(3)
    >>> device_copy(X, np.copy) is device_copy(X, np.copy)
    True
    """
    key = id(X)
    with _device_lock:
        hit = _device_copies.get(key)
        if hit is not None and hit[0]() is X:
            return hit[1]
    dev = convert(X)
    try:
        ref = weakref.ref(X, lambda _r, key=key: _device_copies.pop(key, None))
    except TypeError:  # not weak-referenceable: no cache
        return dev
    with _device_lock:
        _device_copies[key] = (ref, dev)
    return dev


def _held(piece: Any) -> Any:
    """A piece of data as the task that holds it returns it."""
    return piece


def place_as(client: Any, key: Any, value: Any, *, workers: list[str] | None = None,
             convert: Callable[[Any], Any] | None = None) -> Any:
    """Put ``value`` (or ``convert(value)``) on a worker under the dask key ``key`` as a task
    that holds it, and return its future.

    The value travels inside the task, which the scheduler keeps: when the worker holding the
    result is lost, the task runs again on another worker and every job that needs it goes on
    (scattered data would be gone for good). ``workers`` is a preference, not a pin: a pin to
    a worker that is gone would wait for it forever. The cost is a copy of ``value`` on the
    scheduler for as long as the key is held.

    A dask array whose graph maps each key to the future *of that same key* is what
    ``client.persist`` returns: later graphs use the data where it is. A future under another
    key would make every later graph add an alias task per chunk, run on one worker, so that
    a chunk needed by every worker (an unsplit factor) would be fetched by the others each time.
    """
    pin = {"workers": list(workers), "allow_other_workers": True} if workers else {}
    # Each value is a graph of its own, sent on purpose: distributed's warning about a large
    # graph (and its advice to scatter) is not for it.
    with dask.config.set({"distributed.admin.large-graph-warning-threshold": "1 PiB"}):
        return client.submit(convert or _held, value, key=key, **pin)


def _gpu_room() -> tuple[int, int]:
    """(available, capacity) bytes of this worker's GPU (``gpu_available``)."""
    from mgpu.backends.memory import gpu_available

    return gpu_available()


def check_gpu_room(chunk_bytes: list[int], chunk_workers: list[str],
                   room: dict[str, tuple[int, int]]) -> None:
    """Refuse, before anything is sent, chunks that would not fit on their workers' GPUs.

    ``chunk_bytes[i]`` goes to ``chunk_workers[i]``; ``room`` maps each worker to its GPU's
    (available, capacity) bytes.

    Raises
    ------
    DeviceMemoryError
        Naming the first worker whose chunks exceed what its GPU has available.

    Examples
    --------
    >>> check_gpu_room([600, 600], ["a", "b"], {"a": (1000, 2000), "b": (1000, 2000)})
    >>> try:
    ...     check_gpu_room([600, 600], ["a", "a"], {"a": (1000, 2000)})
    ... except MemoryError as e:
    ...     print(e)  # doctest: +ELLIPSIS
    from_scipy: the 2 chunk(s) for worker a take 1.17 kiB on its GPU; 0.98 kiB of its 1.95 kiB...
    """
    from dask.utils import format_bytes

    from mgpu.backends.memory import DeviceMemoryError

    need: dict[str, list[int]] = {}
    for b, w in zip(chunk_bytes, chunk_workers):
        need.setdefault(w, []).append(int(b))
    for w, parts in need.items():
        available, capacity = room[w]
        if sum(parts) > available:
            raise DeviceMemoryError(
                f"from_scipy: the {len(parts)} chunk(s) for worker {w} take "
                f"{format_bytes(sum(parts))} on its GPU; {format_bytes(available)} of its "
                f"{format_bytes(capacity)} are available. Cut S into more parts over more GPU "
                "workers, or keep it on the CPU (device='cpu')."
            )


def _to_device(chunk: sp.csr_matrix) -> Any:
    return to_device(chunk)


def _to_host(chunk: Any) -> sp.csr_matrix:
    if sp.issparse(chunk):
        return sp.csr_matrix(chunk)
    return chunk.get()  # cupyx -> scipy


def _nnz_block(chunk: Any) -> np.ndarray:
    return np.array([[int(chunk.nnz)]], dtype=np.int64)


def gpu_workers(client: Any) -> list[str]:
    """Addresses of the cluster's workers that have a working GPU (sorted)."""
    return [w for w, i in describe_workers(client).items()
            if i.get("gpu") and "error" not in i["gpu"]]


def _workers_have_gpus(client: Any) -> bool:
    workers = workers_now(client)
    return bool(workers) and len(gpu_workers(client)) == len(workers)


def _check_input(S: Any, axis: int, parts: int | None) -> sp.csr_matrix:
    if axis not in (0, 1):
        raise ValueError(
            f"The 'axis' parameter of from_scipy must be 0 (rows) or 1 (columns). Got {axis!r}."
        )
    if parts is not None and (isinstance(parts, bool) or not isinstance(parts, (int, np.integer))
                              or parts < 1):
        raise ValueError(f"The 'parts' parameter of from_scipy must be an int >= 1. Got {parts!r}.")
    # cupyx data is refused by its device: the chunks are cut on the host
    check_array(S, "S", "from_scipy", accept_dense=False, devices=("cpu",),
                kinds="a scipy sparse matrix",
                kinds_hint="; convert with scipy.sparse.csr_matrix(S)")
    S = sp.csr_matrix(S)  # a CSR *matrix* (not array): dask's concatenation knows it
    if not S.has_canonical_format:
        S = S.copy()
        S.sum_duplicates()
    return S


def from_scipy(
    S: sp.spmatrix | sp.sparray,
    parts: int | None = None,
    *,
    axis: Literal[0, 1] = 0,
    client: Any = None,
    device: Literal["auto", "cpu", "gpu"] = "auto",
    progress: Callable[[int], None] | None = None,
) -> da.Array:
    """Cut a scipy sparse matrix at nnz prefix sums into a dask array of CSR chunks.

    Parameters
    ----------
    S : sparse matrix of shape (n_rows, n_cols)
        Any scipy sparse format; duplicates are summed and indices sorted (in a copy).
    parts : int, optional
        Number of chunks; default one per worker (or one without a cluster). More parts than
        workers is allowed: parts go to workers round-robin.
    axis : {0, 1}, default=0
        0 cuts rows (chunks span every column), 1 cuts columns (every row).
    client : distributed.Client, optional
        Where to place the chunks; default the current client, if any. Without one the
        chunks stay in the graph and go wherever the scheduler runs the tasks. With one,
        each chunk is a task holding its piece (:func:`place_as`): the scheduler keeps a
        copy of S (about its CSR bytes) while the collection lives, and makes the chunks of
        a lost worker again on another one.
    device : {'auto', 'cpu', 'gpu'}, default='auto'
        Chunk type on the workers: scipy CSR ('cpu') or cupyx CSR ('gpu'); 'auto' picks
        'gpu' when every worker has a GPU. With 'gpu' the chunks go to the workers that have
        a GPU only (the GPU workers of a mixed cluster), and ``parts`` defaults to their
        number.
    progress : callable, optional
        Called with the nnz of each chunk once it is on its worker (for progress bars).

    Returns
    -------
    dask.array.Array
        Chunks are uneven in rows (or columns) and even in nonzeros; ``.compute()`` gives
        the matrix back (a cupyx matrix for GPU chunks: see :func:`gather`).

    Raises
    ------
    TypeError
        If S is not a scipy sparse matrix of real numbers.
    ValueError
        For a bad ``axis``, ``parts`` or ``device``, ``device='gpu'`` on a cluster without
        GPU workers, or with a chunk too large for cupyx's 32-bit indices.
    mgpu.DeviceMemoryError
        With ``device='gpu'``, before anything is sent, when a worker's chunks would not fit
        in what its GPU has available (:func:`check_gpu_room`).

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> S = sp.random(1000, 200, density=0.01, format="csr", random_state=0)
    >>> x = from_scipy(S, 4)
    >>> x.numblocks
    (4, 1)
    >>> (x.compute() != S).nnz
    0
    """
    if device not in ("auto", "cpu", "gpu"):
        raise ValueError(
            f"The 'device' parameter of from_scipy must be a str among {{'auto', 'cpu', 'gpu'}}."
            f" Got {device!r} instead."
        )
    S = _check_input(S, axis, parts)
    check_param(client, "client", "from_scipy", [CLIENT, None])
    check_param(progress, "progress", "from_scipy", [IsCallable(), None])
    if client is None:
        client = current_client()
    workers: list[str] = sorted(workers_now(client)) if client else []
    on_gpu = False
    if workers and device != "cpu":
        with_gpu = gpu_workers(client)
        if device == "gpu":
            if not with_gpu:
                raise ValueError(
                    f"The 'device' parameter of from_scipy is 'gpu', but none of the cluster's "
                    f"{len(workers)} worker(s) has a GPU. Pass device='cpu', or connect GPU "
                    "workers (mgpu.connect() with GPUs visible, or dask-cuda's workers)."
                )
            on_gpu, workers = True, with_gpu  # a mixed cluster: GPU chunks on GPU workers only
        else:
            on_gpu = len(with_gpu) == len(workers)
    if parts is None:
        parts = max(1, len(workers))
    counts = axis_counts(S, axis)
    bounds = split_counts(counts, parts)
    nnz = part_sums(counts, bounds)
    sizes = tuple(int(b) for b in np.diff(bounds))
    chunks = (sizes, (S.shape[1],)) if axis == 0 else ((S.shape[0],), sizes)
    src = S if axis == 0 else S.tocsc()

    def piece(i: int) -> sp.csr_matrix:
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        return sp.csr_matrix(src[lo:hi] if axis == 0 else src[:, lo:hi])

    if on_gpu and nnz.max(initial=0) > _INT32_MAX:
        raise ValueError(
            f"A chunk of {int(nnz.max()):,} nonzeros exceeds cupyx's 32-bit indices; "
            f"use parts >= {int(-(-int(nnz.sum()) // _INT32_MAX))}."
        )
    takers = [workers[i % len(workers)] for i in range(parts)] if workers else []
    if on_gpu:
        # cupyx CSR on the device: values, int32 indices and row pointers per chunk
        rows = sizes if axis == 0 else (S.shape[0],) * parts
        device_bytes = [int(z) * (S.dtype.itemsize + 4) + (int(r) + 1) * 4
                        for z, r in zip(nnz, rows)]
        check_gpu_room(device_bytes, takers,
                       client.run(_gpu_room, workers=sorted(set(takers))))

    # A fresh name, not a hash of S: hashing every value costs a pass over the matrix, and a
    # name that two calls share could meet a release of the same key still in flight.
    name = f"mgpu-from-scipy-{uuid.uuid4().hex}"
    meta: Any = sp.csr_matrix((0, 0), dtype=S.dtype)
    keys = [(name, i, 0) if axis == 0 else (name, 0, i) for i in range(parts)]
    graph: dict[Any, Any] = {}
    if client is None or not workers:
        for i, k in enumerate(keys):
            graph[k] = piece(i)
            if progress is not None:
                progress(int(nnz[i]))
    else:
        from mgpu.distributed.cluster import completed

        held = 0
        for i, key in enumerate(keys):
            p = piece(i)
            held += p.data.nbytes + p.indices.nbytes + p.indptr.nbytes
            graph[key] = place_as(client, key, p, workers=[takers[i]],
                                  convert=_to_device if on_gpu else None)
            del p
        part_of = {graph[k].key: i for i, k in enumerate(keys)}
        for fut in completed(list(graph.values()), "from_scipy placing the chunks", client):
            fut.result()  # surfaces an error (a GPU's) now, not at the first compute
            if progress is not None:
                progress(int(nnz[part_of[fut.key]]))
        logger.info("from_scipy: the scheduler keeps %.1f MB of chunks to make them again "
                    "if a worker is lost", held / 1e6)
        if on_gpu:
            meta = to_device(sp.csr_matrix((0, 0), dtype=S.dtype))
    logger.info(
        "from_scipy: %d x %d, %d nnz in %d %s chunk(s) along axis %d, largest/mean nnz %.4f",
        S.shape[0], S.shape[1], S.nnz, parts, "GPU" if on_gpu else "CPU", axis,
        float(nnz.max() / nnz.mean()) if nnz.sum() else 1.0,
    )
    return da.Array(graph, name, chunks=chunks, dtype=S.dtype, meta=meta)


def chunk_nnz(x: da.Array, compute: Callable[[da.Array], Any] | None = None) -> np.ndarray:
    """nnz of every chunk of a sparse dask array, shaped like its block grid, computed by
    ``compute`` (the array of counts in, its values out; default ``.compute()``)."""
    counts = x.map_blocks(
        _nnz_block, dtype=np.int64, chunks=((1,) * x.numblocks[0], (1,) * x.numblocks[1]),
        meta=np.empty((0, 0), dtype=np.int64), token="mgpu-chunk-nnz",
    )
    return counts.compute() if compute is None else compute(counts)


def chunk_workers(x: da.Array, client: Any) -> dict[tuple[int, ...], tuple[str, ...]]:
    """Which worker(s) hold each placed chunk of a dask array, by block index.

    Only chunks that are futures (placed by :func:`from_scipy` or ``client.persist``) are
    listed; chunks still to be computed have no worker yet.
    """
    from distributed import Future

    placed = {}
    for k in flatten(x.__dask_keys__()):
        v = x.dask[k]
        if isinstance(v, Future):
            placed[tuple(k[1:])] = v
    who = client.who_has(list(placed.values())) if placed else {}
    return {idx: tuple(who.get(f.key, ())) for idx, f in placed.items()}


def block_futures(x: da.Array, client: Any) -> dict[tuple[int, ...], Any]:
    """The future of every block of ``x``, by block index, persisting ``x`` only if needed.

    An array made by :func:`from_scipy` (or persisted) already maps each key to its own
    future, and is taken as it is: no round trip, no alias task.
    """
    from distributed import Future

    keys = list(flatten(x.__dask_keys__()))
    graph = x.__dask_graph__()
    if not all(isinstance(graph.get(k), Future) and graph[k].key == k for k in keys):
        x = client.persist(x)
        graph = x.__dask_graph__()
    return {tuple(k[1:]): graph[k] for k in keys}


def gather(x: da.Array) -> sp.csr_matrix:
    """Bring a sparse dask array back as one scipy CSR matrix (from CPU or GPU chunks)."""
    check_array(x, "x", "gather", accept_dense=False, accept_sparse=False, accept_dask=True,
                kinds="a dask array of sparse chunks (mgpu.from_scipy)")
    return sp.csr_matrix(
        x.map_blocks(_to_host, dtype=x.dtype, meta=sp.csr_matrix((0, 0), dtype=x.dtype),
                     token="mgpu-gather").compute()
    )
