"""All-kNN of a corpus on a cluster, SPMD: every row is a query, its k nearest among all rows.

The corpus lies on the workers in nnz-balanced row tiles (:func:`mgpu.from_scipy`). One task
per worker (:func:`mgpu.distributed.spmd.spmd`) keeps that worker's tiles as its index,
checked and prepared once on its device. Its own rows, the query block, then go round the
ring of workers (``comm.sendrecv``: NCCL between GPUs, the host channel between CPU
workers): at each of the ``size`` steps every worker takes the top-k of the visiting block
against its tiles with the one-device kNN (global ids: a tile's ids plus its first row) and
merges them into the running top-k that travels with the block, on its device. One more pass
of the running lists brings each block's result home. The client waits once.

Ties go to the lower id in every local top-k and in every merge, so the result is the
one-device ``mgpu.knn(X, X, k)``: the same ids, the same distances; each row's own id is
among its neighbours as it is there (``mgpu.ops.distances.drop_self`` takes it out).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from numbers import Integral
from typing import Any

import dask.array as da
import numpy as np

from mgpu import config
from mgpu.backends import (array_module, is_gpu_array, is_sparse, knn_prepare_lookup,
                           knn_prepared_lookup, sparse_module, to_host)
from mgpu.distributed.cluster import current_client, workers_now
from mgpu.distributed.collection import gpu_workers
from mgpu.distributed.inputs import check_dask_input, is_placed, row_tiles
from mgpu.distributed.knn import _check_tile_memory
from mgpu.ops import distances as dist
from mgpu.ops.validation import Bytes, Interval, IsCallable, check_param, is_dask_array

logger = logging.getLogger(__name__)

__all__ = ["all_knn", "merge_sorted", "one_worker_kind"]

# the id of an empty slot of a running top-k: after every real row, whatever its distance
_NO_ID = np.iinfo(np.int64).max


def one_worker_kind(client: Any) -> bool:
    """Whether the cluster's workers are all GPU workers or all CPU workers: the SPMD ring
    needs one communicator kind (a mixed cluster keeps the task path of :func:`mgpu.knn`)."""
    n = len(workers_now(client))
    return len(gpu_workers(client)) in (0, n)


def merge_sorted(a: tuple[Any, Any], b: tuple[Any, Any], k: int, largest: bool
                 ) -> tuple[Any, Any]:
    """The k best of two candidate lists per row, ties to the lower id, on the lists' device.

    :func:`mgpu.distributed.knn.merge_top_k` (scikit-learn's brute-force order) with two
    stable sorts in place of ``lexsort``, which CuPy has only for one-dimensional keys: by
    id first, then by distance, so equal distances keep the id order.

    >>> d, i = merge_sorted((np.array([[1.0, 2.0]]), np.array([[7, 3]])),
    ...                     (np.array([[1.0, 1.5]]), np.array([[2, 9]])), 3, False)
    >>> d.tolist(), i.tolist()
    ([[1.0, 1.0, 1.5]], [[2, 7, 9]])
    """
    xp = array_module(a[0])
    D = xp.concatenate([a[0], b[0]], axis=1)
    ids = xp.concatenate([a[1], b[1]], axis=1)
    by_id = xp.argsort(ids, axis=1, kind="stable")
    D = xp.take_along_axis(D, by_id, axis=1)
    ids = xp.take_along_axis(ids, by_id, axis=1)
    # + 0.0 makes -0.0 a 0.0: a radix sort (CuPy's) would put it first
    key = (-D if largest else D) + 0.0
    best = xp.argsort(key, axis=1, kind="stable")[:, :k]
    return xp.take_along_axis(D, best, axis=1), xp.take_along_axis(ids, best, axis=1)


def _empty_top_k(xp: Any, rows: int, k: int, dtype: Any, largest: bool) -> tuple[Any, Any]:
    """A running top-k with no candidate yet: the worst distance and an id after all rows."""
    worst = -np.inf if largest else np.inf
    return (xp.full((rows, k), worst, dtype=dtype), xp.full((rows, k), _NO_ID, dtype=np.int64))


def _checked_tiles(parts: list[Any], ring: dist.Semiring, p: float
                   ) -> tuple[list[tuple[Any, int, int]], Any]:
    """This worker's tiles checked and prepared as kNN's index ((prepared, first row, rows)
    for the tiles with rows) and its query block: its tiles' rows, checked as one device
    checks queries, stacked in tile order."""
    index, rows = [], []
    for part in parts:
        X = dist.check_knn_input(part.data, "X", "all_knn", on=part.data)
        dist.check_knn_values(X, "X", "all_knn", ring)
        rows.append(X)
        if X.shape[0]:
            index.append((knn_prepare_lookup(X, ring, p), part.rows.start, X.shape[0]))
    block = rows[0] if len(rows) == 1 else sparse_module(rows[0]).vstack(rows, format="csr")
    return index, block


def _csr_arrays(Q: Any, rows: int, nnz: int, idx_dtype: Any) -> list[Any]:
    """Q's CSR arrays padded to ``rows`` rows and ``nnz`` nonzeros (the largest block's, so
    that every rank sends and receives arrays of one shape)."""
    xp = array_module(Q.data)
    indptr = xp.full(rows + 1, Q.nnz, dtype=idx_dtype)
    indptr[: Q.shape[0] + 1] = Q.indptr
    indices = xp.zeros(nnz, dtype=idx_dtype)
    indices[: Q.nnz] = Q.indices
    data = xp.zeros(nnz, dtype=Q.data.dtype)
    data[: Q.nnz] = Q.data
    return [indptr, indices, data]


def _ring_knn(comm: Any, parts: list[Any], k: int, metric: str, p: float,
              working_memory: int, n_cols: int) -> list[tuple[int, int, Any, Any]]:
    """One worker's part of :func:`all_knn`: its blocks' final top-k, as (first row, last
    row + 1, distances, ids) on the host per tile."""
    ring, p = dist.resolve_metric(metric, p, func="all_knn")
    error, index, Q = None, [], None
    try:
        index, Q = _checked_tiles(parts, ring, p)
    except (TypeError, ValueError) as exc:  # every rank learns it below: none waits alone
        error = f"{type(exc).__name__}: {exc}"
    meta = (None if Q is None else (int(Q.shape[0]), int(Q.nnz), Q.indices.dtype.str,
                                    Q.data.dtype.str), error)
    every = comm.allgather_obj(meta)
    for m in every:
        if m[1] is not None:
            raise ValueError(f"all_knn refused a tile of X: {m[1]}")
    sizes = [(m[0][0], m[0][1]) for m in every]
    idx_dtype = np.result_type(*[np.dtype(m[0][2]) for m in every])
    dtype = np.result_type(*[np.dtype(m[0][3]) for m in every])
    xp = array_module(Q.data)
    rank, size = comm.rank, comm.size
    top_rows, top_nnz = max(r for r, _ in sizes), max(max(z for _, z in sizes), 1)
    sparse = sparse_module(Q.data)
    Q = sparse.csr_matrix((Q.data.astype(dtype, copy=False), Q.indices.astype(idx_dtype),
                           Q.indptr.astype(idx_dtype)), shape=Q.shape)
    top = _empty_top_k(xp, Q.shape[0], k, dtype, ring.similarity)
    ahead, behind = (rank + 1) % size, (rank - 1) % size
    for step in range(size):
        if Q.shape[0]:
            for prepared, first, tile_rows in index:  # k above a tile's rows: all of them
                d, i = knn_prepared_lookup(prepared, Q, min(k, tile_rows), ring, p,
                                           working_memory)
                top = merge_sorted(top, (d.astype(dtype, copy=False), i + first), k,
                                   ring.similarity)
        if step < size - 1:  # the block and its lists go on to the next rank
            rows, nnz = sizes[(rank - step - 1) % size]
            bufs = [comm.sendrecv(x, ahead, behind)
                    for x in _csr_arrays(Q, top_rows, top_nnz, idx_dtype) + _padded(top, top_rows)]
            Q = sparse.csr_matrix((bufs[2][:nnz], bufs[1][:nnz], bufs[0][: rows + 1]),
                                  shape=(rows, n_cols))
            top = (bufs[3][:rows], bufs[4][:rows])
        comm.report({"step": step + 1, "steps": size})
    if size > 1:  # one more pass brings each block's lists home
        rows = sizes[rank][0]
        top = tuple(comm.sendrecv(x, ahead, behind)[:rows] for x in _padded(top, top_rows))
    # to the client in the tiles' dtype and int32 ids where they fit: half the bytes of
    # float64 and int64 (widened there)
    ids = top[1].astype(np.int32) if sum(r for r, _ in sizes) < 2**31 else top[1]
    d, i = to_host(top[0]), to_host(ids)
    out, at = [], 0
    for part in parts:
        n = part.rows.stop - part.rows.start
        out.append((part.rows.start, part.rows.stop, d[at:at + n], i[at:at + n]))
        at += n
    return out


def _padded(top: tuple[Any, Any], rows: int) -> list[Any]:
    """A running top-k padded to ``rows`` rows (the largest block's)."""
    xp = array_module(top[0])
    out = []
    for x in top:
        y = xp.zeros((rows, x.shape[1]), dtype=x.dtype)
        y[: x.shape[0]] = x
        out.append(y)
    return out


def all_knn(X: da.Array, k: int, *, metric: str = "euclidean", p: float = 2,
            working_memory: Any = None, client: Any = None,
            progress: Callable[[int], Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest rows of X for every row of X, SPMD on the workers that hold X.

    Parameters
    ----------
    X : dask array of shape (n_samples, n_features)
        CSR row tiles on a cluster's workers (:func:`mgpu.from_scipy`; a dask array cut by
        columns too is re-cut into row tiles at nnz prefix sums). Every worker keeps its
        tiles as its index; its rows go round the ring of workers as queries.
    k : int
        Neighbours per row, the row itself among them: 1 <= k <= n_samples.
    metric, p
        As :func:`mgpu.knn`.
    working_memory : str or int, optional
        As :func:`mgpu.knn`: the bytes of one step's batch on a worker.
    client : distributed.Client, optional
        Default: the current one (:func:`mgpu.connect`).
    progress : callable, optional
        Called with the number of rows done, as the ring's steps end.

    Returns
    -------
    distances : ndarray of shape (n_samples, k), float64, best first
    indices : ndarray of shape (n_samples, k), int64, ties to the lower index
        Equal to ``mgpu.knn(S, S, k)`` on one device.

    Raises
    ------
    ValueError, TypeError
        An unknown metric, k out of range, X not a dask array of one chunk of columns
        (or re-cuttable into one), no cluster, a working memory that cannot hold one row's
        work against the largest tile; before the workers start. A tile kNN refuses (NaN,
        negative values for a metric of distributions) ends the call on every worker.

    Examples
    --------
    >>> import scipy.sparse as sp, mgpu
    >>> S = sp.random(50, 20, density=0.2, format="csr", random_state=0)
    >>> with mgpu.connect(gpus=False, n_workers=2, processes=False):  # doctest: +SKIP
    ...     d, i = all_knn(mgpu.from_scipy(S), 3, metric="cosine")
    """
    ring, p = dist.resolve_metric(metric, p, func="all_knn")
    check_param(working_memory, "working_memory", "all_knn", [Bytes(), None])
    check_param(progress, "progress", "all_knn", [IsCallable(), None])
    if not is_dask_array(X):
        raise TypeError("The 'X' parameter of all_knn must be a dask array of row tiles on a "
                        f"cluster. Got {type(X).__name__} instead: place it with "
                        "mgpu.from_scipy(S), or call mgpu.knn(S, S, k) on one device.")
    check_dask_input(X, "X", "all_knn")
    n = int(X.shape[0])
    check_param(k, "k", "all_knn", Interval(Integral, 1, max(n, 1)), f" (X has {n} rows)")
    client = client or current_client()
    if client is None:
        raise ValueError("all_knn runs on a cluster: call mgpu.connect() first, or pass "
                         "client=.")
    X = row_tiles(X, "all_knn")
    if not is_sparse(X._meta):  # the ring sends a block as its CSR arrays
        raise TypeError("The 'X' parameter of all_knn must hold sparse (CSR) tiles. Got "
                        f"{type(X._meta).__name__} chunks: place a scipy matrix with "
                        "mgpu.from_scipy.")
    if not is_placed(X):
        X = client.persist(X)
    budget = config.get_bytes("knn.working-memory", working_memory)
    if not is_gpu_array(X._meta):  # a GPU tile batches within the budget on its device
        _check_tile_memory(X, ring, budget, client)
    from mgpu.distributed.spmd import spmd

    done = [0]

    def report(record: dict[str, Any]) -> None:
        rows = n * int(record["step"]) // int(record["steps"])
        if progress is not None and rows > done[0]:
            progress(rows - done[0])
        done[0] = rows

    logger.info("all_knn: %d rows in %d tile(s), k=%d, %s, SPMD ring", n, X.numblocks[0], k,
                ring.name)
    results = spmd(_ring_knn, X, args=(int(k), ring.name, p, budget, int(X.shape[1])),
                   client=client, name="all-knn", progress=report)
    out_d = np.empty((n, k), dtype=np.float64)
    out_i = np.empty((n, k), dtype=np.int64)
    for per_rank in results:
        for lo, hi, d, i in per_rank:
            out_d[lo:hi], out_i[lo:hi] = d, i
    if progress is not None and done[0] < n:
        progress(n - done[0])
    return out_d, out_i
