"""Distributed exact kNN: the index in nnz-balanced row tiles on the workers, queries sent
in batches, a local top-k per tile with global ids, merged on the client in a tree of
pairwise merges.

Ties go to the lower global id at every step (within a tile by the local top-k, across tiles
by the merge), so the result equals the one-device :func:`mgpu.knn`.
"""
from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Callable
from numbers import Integral
from typing import Any

import dask.array as da
import numpy as np

from mgpu import config
from mgpu.backends import is_gpu_array
from mgpu.distributed.cluster import completed, current_client, task_placement
from mgpu.distributed.collection import block_futures, place_as
from mgpu.ops import distances as dist
from mgpu.ops.validation import Bytes, Interval, IsCallable, check_param, is_dask_array

logger = logging.getLogger(__name__)

__all__ = ["knn", "knn_distributed", "merge_top_k"]


def merge_top_k(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], k: int,
                largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """The k best of two candidate lists per row, ties to the lower id.

    >>> d, i = merge_top_k((np.array([[1.0, 2.0]]), np.array([[7, 3]])),
    ...                    (np.array([[1.0, 1.5]]), np.array([[2, 9]])), 3, False)
    >>> d.tolist(), i.tolist()
    ([[1.0, 1.0, 1.5]], [[2, 7, 9]])
    """
    D = np.hstack([a[0], b[0]])
    ids = np.hstack([a[1], b[1]])
    order = np.lexsort((ids, -D if largest else D), axis=1)[:, :k]
    return np.take_along_axis(D, order, axis=1), np.take_along_axis(ids, order, axis=1)


def _prepare_tile(tile: Any, metric: str, p: float) -> Any:
    """A tile checked and prepared where it lives (on its GPU for CuPy tiles), once per call."""
    ring, p = dist.resolve_metric(metric, p, func="knn")
    return dist.prepare_index(tile, ring, p)


def _local_knn(tile: Any, queries: Any, k: int, metric: str, p: float, offset: int,
               working_memory: Any) -> tuple[np.ndarray, np.ndarray]:
    """Top-k of one prepared tile for a batch of checked queries, with global ids."""
    ring, p = dist.resolve_metric(metric, p, func="knn")
    d, i = dist.knn_prepared(tile, queries, k, ring, p, working_memory)
    return d.astype(np.float64, copy=False), i.astype(np.int64, copy=False) + offset


def knn_distributed(index: da.Array, queries: Any, k: int, *, metric: str = "euclidean",
                    p: float = 2, working_memory: Any = None, client: Any = None,
                    progress: Callable[[int], None] | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """kNN over an index held by the workers as row tiles (:func:`mgpu.from_scipy`).

    Query batches are sized so that a tile's distances for one batch stay within
    ``working_memory`` (default ``mgpu.knn.working-memory``) on its worker; GPU tiles take
    ``mgpu.knn.gpu-task-queries`` queries a task and batch them within the budget on the
    device. ``mgpu.knn.batches-in-flight`` batches run at once; ``progress`` is called with
    the number of queries finished after each batch.
    """
    ring, p = dist.resolve_metric(metric, p, func="knn")
    check_param(working_memory, "working_memory", "knn", [Bytes(), None])
    if index.numblocks[1] != 1:
        raise ValueError("The 'index' parameter of knn must be cut into row tiles (from_scipy "
                         f"with axis=0). Got {index.numblocks[1]} column tiles.")
    queries = dist.check_knn_input(queries, "queries", "knn")
    if queries.shape[1] != index.shape[1]:
        raise ValueError(f"The 'index' and 'queries' parameters of knn must have the same number "
                         f"of columns. Got {index.shape[1]} and {queries.shape[1]}.")
    dist.check_knn_values(queries, "queries", "knn", ring)
    n = int(index.shape[0])
    check_param(k, "k", "knn", Interval(Integral, 1, n), f" (the index has {n} rows)")
    client = client or current_client()
    if client is None:
        raise ValueError("a distributed index needs a cluster: call mgpu.connect() first.")
    blocks = block_futures(index, client)
    tiles = [blocks[(i, 0)] for i in range(index.numblocks[0])]
    where = client.who_has(tiles)
    offsets = np.concatenate([[0], np.cumsum(index.chunks[0])[:-1]]).astype(np.int64)
    # settings are read here, once: tasks get values, never the workers' own config
    working_memory = config.get_bytes("knn.working-memory", working_memory)
    if is_gpu_array(index._meta):  # the tiles' device sizes the tasks, as below it places them
        # a GPU tile keeps k candidates per query, never a row of distances, and cuts its
        # task into batches within the budget itself
        step = int(config.get("knn.gpu-task-queries"))
    else:
        step = dist.working_memory_rows(max(index.chunks[0]), working_memory)
    in_flight = max(1, int(config.get("knn.batches-in-flight")))
    nq = queries.shape[0]
    out_d = np.empty((nq, k), dtype=np.float64)
    out_i = np.empty((nq, k), dtype=np.int64)
    logger.info("knn: %d queries in batches of %d (%d in flight) over %d tile(s), k=%d, %s",
                nq, step, in_flight, len(tiles), k, ring.name)
    # Each tile is checked and prepared once per call where it lives, and its queries are
    # asked to run there. Asked, not pinned, for CPU tiles: when that worker is lost, the
    # tile is made again elsewhere and its work follows it, where a pin would wait for the
    # lost worker until mgpu.dist.stall-timeout. A prepared GPU tile belongs to its device
    # and stays pinned there (moving it has not been tried on GPUs).
    gpu_tiles = is_gpu_array(index._meta)  # GPU tasks ask for a GPU (task_placement)
    prepared = []
    for t, o, rows in zip(tiles, offsets, index.chunks[0]):
        if rows:
            holders = list(where.get(t.key, ()))
            pin = task_placement(holders[:1], gpu_tiles)
            prepared.append((client.submit(_prepare_tile, t, ring.name, p, pure=False, **pin),
                             int(o), pin))

    def submit_batch(s: int) -> list[Any]:
        # held by a task, not scattered to every worker: a broadcast scatter waits forever
        # for a worker lost while it runs
        batch = place_as(client, f"mgpu-knn-queries-{uuid.uuid4().hex}", queries[s:s + step])
        return [client.submit(_local_knn, t, batch, k, ring.name, p, o, working_memory,
                              pure=False, **pin)
                for t, o, pin in prepared]

    def collect(s: int, parts: list[Any]) -> None:
        # The tiles' lists (k per query) are merged here, in a tree of pairwise merges:
        # a merge task would take the thread of a GPU worker from its next batch.
        for _ in completed(parts, f"knn's query batch at row {s}", client):
            pass
        lists = client.gather(parts)
        while len(lists) > 1:
            lists = [merge_top_k(lists[j], lists[j + 1], k, ring.similarity)
                     for j in range(0, len(lists) - 1, 2)] + lists[len(lists) - len(lists) % 2:]
        d, i = lists[0]
        out_d[s:s + step], out_i[s:s + step] = d, i
        if progress is not None:
            progress(d.shape[0])

    pending: deque[tuple[int, list[Any]]] = deque()
    for s in range(0, nq, step):
        pending.append((s, submit_batch(s)))
        if len(pending) >= in_flight:
            collect(*pending.popleft())
    while pending:
        collect(*pending.popleft())
    return out_d, out_i


def knn(index: Any, queries: Any, k: int, *, metric: str = "euclidean", p: float = 2,
        working_memory: Any = None, progress: Callable[[int], None] | None = None
        ) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest rows of ``index`` for every row of ``queries``, on one machine or a cluster.

    Parameters
    ----------
    index : {ndarray, sparse matrix} of shape (n_index, n_features), or a dask array
        A dask array of row tiles (``mgpu.from_scipy(S, axis=0)``) stays on the workers:
        each computes its tiles' top-k, and the lists are merged in a tree.
    queries : {ndarray, sparse matrix} of shape (n_queries, n_features)
    k : int
        1 <= k <= n_index.
    metric, p, working_memory
        As :func:`mgpu.ops.distances.knn`.
    progress : callable, optional
        Distributed only: called with the number of queries done after each batch.

    Returns
    -------
    distances : ndarray of shape (n_queries, k), best first
    indices : ndarray of shape (n_queries, k), int64, ties to the lower index

    Examples
    --------
    >>> import numpy as np
    >>> knn(np.array([[0.0], [1.0], [3.0]]), np.array([[2.9]]), 2)[1].tolist()
    [[2, 1]]
    """
    check_param(progress, "progress", "knn", [IsCallable(), None])
    if is_dask_array(index):
        return knn_distributed(index, queries, k, metric=metric, p=p,
                               working_memory=working_memory, progress=progress)
    return dist.knn(index, queries, k, metric=metric, p=p, working_memory=working_memory)
