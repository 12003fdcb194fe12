"""Distributed exact kNN: the index in nnz-balanced row tiles on the workers, queries sent
in batches, a local top-k per tile with global ids, and a tree of k-way merges.

Ties go to the lower global id at every step (within a tile by the local top-k, across tiles
by the merge), so the result equals the one-device :func:`mgpu.knn`.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np
from dask.core import flatten

from mgpu import config
from mgpu.dist.cluster import current_client
from mgpu.ops import distances as dist

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
    """kNN over an index held by the workers as row tiles (:func:`mgpu.dist.from_scipy`).

    Query batches are sized so that a tile's distances for one batch stay within
    ``working_memory`` (default ``mgpu.knn.working-memory``) on its worker; ``progress`` is
    called with the number of queries finished after each batch.
    """
    from distributed import futures_of

    ring, p = dist.resolve_metric(metric, p, func="knn")
    if index.numblocks[1] != 1:
        raise ValueError("The 'index' parameter of knn must be cut into row tiles (from_scipy "
                         f"with axis=0). Got {index.numblocks[1]} column tiles.")
    queries = dist._check_input(queries, "queries", "knn")
    if queries.shape[1] != index.shape[1]:
        raise ValueError(f"The 'index' and 'queries' parameters of knn must have the same number "
                         f"of columns. Got {index.shape[1]} and {queries.shape[1]}.")
    dist._check_values(queries, "queries", "knn", ring)
    n = int(index.shape[0])
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n:
        raise ValueError(f"The 'k' parameter of knn must be an int in [1, {n}] (the index has "
                         f"{n} rows). Got {k!r} instead.")
    client = client or current_client()
    if client is None:
        raise ValueError("a distributed index needs a cluster: call mgpu.connect() first.")
    index = client.persist(index)
    by_key = {f.key: f for f in futures_of(index)}
    tiles = [by_key[key] for key in flatten(index.__dask_keys__())]
    offsets = np.concatenate([[0], np.cumsum(index.chunks[0])[:-1]]).astype(np.int64)
    # the budget is read here, once: tasks get bytes, never the workers' own config
    working_memory = config.get_bytes("knn.working-memory", working_memory)
    step = dist.working_memory_rows(max(index.chunks[0]), working_memory)
    nq = queries.shape[0]
    out_d = np.empty((nq, k), dtype=np.float64)
    out_i = np.empty((nq, k), dtype=np.int64)
    logger.info("knn: %d queries in batches of %d over %d tile(s), k=%d, %s", nq, step,
                len(tiles), k, ring.name)
    # each tile converted and checked once, where it lives, not once per batch
    tiles = [(client.submit(_prepare_tile, t, ring.name, p, pure=False), int(o))
             for t, o, rows in zip(tiles, offsets, index.chunks[0]) if rows]
    for s in range(0, nq, step):
        batch = client.scatter(queries[s:s + step], broadcast=True, hash=False)
        parts = [client.submit(_local_knn, t, batch, k, ring.name, p, o, working_memory,
                               pure=False)
                 for t, o in tiles]
        while len(parts) > 1:  # a tree of pairwise merges
            nxt = [client.submit(merge_top_k, parts[j], parts[j + 1], k, ring.similarity,
                                 pure=False)
                   for j in range(0, len(parts) - 1, 2)]
            if len(parts) % 2:
                nxt.append(parts[-1])
            parts = nxt
        d, i = parts[0].result()
        out_d[s:s + step], out_i[s:s + step] = d, i
        if progress is not None:
            progress(min(step, nq - s))
    return out_d, out_i


def knn(index: Any, queries: Any, k: int, *, metric: str = "euclidean", p: float = 2,
        working_memory: Any = None, progress: Callable[[int], None] | None = None
        ) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest rows of ``index`` for every row of ``queries``, on one machine or a cluster.

    Parameters
    ----------
    index : {ndarray, sparse matrix} of shape (n_index, n_features), or a dask array
        A dask array of row tiles (``mgpu.dist.from_scipy(S, axis=0)``) stays on the workers:
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
    from mgpu.ops._validate import is_dask_array

    if is_dask_array(index):
        return knn_distributed(index, queries, k, metric=metric, p=p,
                               working_memory=working_memory, progress=progress)
    return dist.knn(index, queries, k, metric=metric, p=p, working_memory=working_memory)
