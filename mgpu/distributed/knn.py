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
from mgpu.backends import is_gpu_array, is_sparse, to_host
from mgpu.distributed.cluster import completed, current_client, result, task_placement
from mgpu.distributed.collection import block_futures, chunk_nnz, place_as
from mgpu.distributed.inputs import check_dask_input, is_placed, one_chunk, row_chunks, row_tiles
from mgpu.ops import distances as dist
from mgpu.ops.validation import Bytes, Interval, IsCallable, check_param, is_dask_array

logger = logging.getLogger(__name__)

__all__ = ["knn", "knn_distributed", "merge_all", "merge_top_k"]


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


def _tile_bytes(rows: int, cols: int, nnz: int | None) -> int:
    """Bytes of a tile as a worker checks it: float64 CSR (scipy's int32 indices while they
    fit) or, without ``nnz``, a dense float64 array."""
    if nnz is None:
        return 8 * rows * cols
    idx = 4 if max(nnz, rows, cols) < np.iinfo(np.int32).max else 8
    return nnz * (8 + idx) + (rows + 1) * idx


def _check_tile_memory(index: da.Array, ring: dist.Semiring, budget: int, client: Any) -> int:
    """Query rows per batch, after refusing, before any query is sent, tiles whose work for
    one query does not fit the working memory (each task would fail alone): the message
    gives the bytes needed and available and the number of tiles that would fit."""
    rows = [int(r) for r in index.chunks[0]]
    cols = int(index.shape[1])
    nnz: list[int | None] = [None] * len(rows)
    if is_sparse(index._meta):
        # waited for as every task of this call is: a cluster without workers stops it
        counted = chunk_nnz(index, lambda counts: result(
            client.compute(counts), "knn's index tiles (their nonzeros, for the working-memory "
            "check)", client))
        nnz = [int(z) for z in np.asarray(counted).ravel()]
    sizes = [_tile_bytes(r, cols, z) for r, z in zip(rows, nnz)]
    need = [dist.working_memory_for(1, r, ring, b) for r, b in zip(rows, sizes)]
    worst = int(np.argmax(need))
    if need[worst] > budget:
        whole = dist.working_memory_for(1, sum(rows), ring, sum(sizes))
        tiles = max(len(rows) + 1, -(-whole // budget))
        what = f", {nnz[worst]:,} nonzeros" if nnz[worst] is not None else ""
        raise ValueError(
            f"The working memory of knn ({budget:,} bytes, working_memory= or "
            f"mgpu.knn.working-memory) cannot hold one query's work against tile {worst} of "
            f"the index ({rows[worst]:,} rows{what}): metric '{ring.name}' needs "
            f"{need[worst]:,} bytes there. Raise working_memory to at least {max(need):,}, or "
            f"cut the index into at least {tiles} row tiles (it has {len(rows)}): "
            f"mgpu.from_scipy(S, {tiles}, axis=0).")
    return dist.working_memory_rows(max(rows), budget)


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
    check_dask_input(index, "index", "knn")
    if is_dask_array(queries):
        check_dask_input(queries, "queries", "knn")
    else:
        queries = dist.check_knn_input(queries, "queries", "knn")
    if queries.shape[1] != index.shape[1]:
        raise ValueError(f"The 'index' and 'queries' parameters of knn must have the same number "
                         f"of columns. Got {index.shape[1]} and {queries.shape[1]}.")
    if not is_dask_array(queries):
        dist.check_knn_values(queries, "queries", "knn", ring)
    n = int(index.shape[0])
    check_param(k, "k", "knn", Interval(Integral, 1, n), f" (the index has {n} rows)")
    client = client or current_client()
    if client is None:
        raise ValueError("a distributed index needs a cluster: call mgpu.connect() first.")
    index = row_tiles(index, "knn")
    if not is_placed(index):  # the index must be resident: placed now, queried by batches
        index = client.persist(index)
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
        step = _check_tile_memory(index, ring, working_memory, client)
    in_flight = max(1, int(config.get("knn.batches-in-flight")))
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
    if is_dask_array(queries):
        return _streamed(prepared, queries, k, ring, p, working_memory)
    nq = queries.shape[0]
    out_d = np.empty((nq, k), dtype=np.float64)
    out_i = np.empty((nq, k), dtype=np.int64)
    logger.info("knn: %d queries in batches of %d (%d in flight) over %d tile(s), k=%d, %s",
                nq, step, in_flight, len(tiles), k, ring.name)

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
        d, i = merge_all(client.gather(parts), k, ring.similarity)
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


def _query_rows(q: Any) -> Any:
    """A chunk of queries checked as a tile's task takes them (host data, as the client
    checks numpy queries)."""
    return dist.check_knn_input(to_host(q), "queries", "knn")


def _chunk_knn(tile: Any, q: Any, k: int, metric: str, p: float, offset: int,
               working_memory: Any) -> tuple[np.ndarray, np.ndarray]:
    """One prepared tile's top-k for one chunk of a dask array of queries."""
    ring, p = dist.resolve_metric(metric, p, func="knn")
    q = _query_rows(q)
    dist.check_knn_values(q, "queries", "knn", ring)
    return _local_knn(tile, q, k, metric, p, offset, working_memory)


def merge_all(lists: list[tuple[np.ndarray, np.ndarray]], k: int, largest: bool
              ) -> tuple[np.ndarray, np.ndarray]:
    """Several tiles' (or shards') lists for the same queries merged into their k best, ties
    to the lower id: a tree of pairwise merges (:func:`merge_top_k`)."""
    while len(lists) > 1:
        lists = [merge_top_k(lists[j], lists[j + 1], k, largest)
                 for j in range(0, len(lists) - 1, 2)] + lists[len(lists) - len(lists) % 2:]
    return lists[0]


def _as_dask(parts: list[Any], rows: tuple[int, ...], k: int, name: str
             ) -> tuple[da.Array, da.Array]:
    """Delayed (distances, indices) per chunk of queries as two dask arrays."""
    out = []
    for j, dt in ((0, np.float64), (1, np.int64)):
        blocks = [da.from_delayed(part[j], shape=(r, k), dtype=dt,
                                  meta=np.empty((0, 0), dtype=dt), name=f"{name}-{j}-{c}")
                  for c, (part, r) in enumerate(zip(parts, rows))]
        out.append(da.concatenate(blocks, axis=0) if blocks
                   else da.empty((0, k), dtype=dt))
    return out[0], out[1]


def _streamed(prepared: list[tuple[Any, int, Any]], queries: da.Array, k: int,
              ring: dist.Semiring, p: float, working_memory: int
              ) -> tuple[da.Array, da.Array]:
    """A dask array of queries against the tiles prepared on the workers: per chunk of
    queries, one task per tile and one merge, in the graph of the (lazy) results."""
    from dask import delayed

    queries = row_chunks(queries, "knn")
    run = uuid.uuid4().hex
    parts = []
    for c, q in enumerate(queries.to_delayed(optimize_graph=False).ravel()):
        lists = [delayed(_chunk_knn, pure=True)(
            t, q, k, ring.name, p, o, working_memory,
            dask_key_name=f"mgpu-knn-tile-{run}-{c}-{j}")
            for j, (t, o, _pin) in enumerate(prepared)]
        parts.append(delayed(merge_all, pure=True, nout=2)(
            lists, k, ring.similarity, dask_key_name=f"mgpu-knn-merge-{run}-{c}"))
    logger.info("knn: a dask array of %d queries in %d chunk(s) over %d tile(s), k=%d, %s "
                "(lazy)", queries.shape[0], queries.numblocks[0], len(prepared), k, ring.name)
    return _as_dask(parts, queries.chunks[0], k, f"mgpu-knn-{run}")


def _local_index(index: Any, queries: da.Array, k: int, metric: str, p: float,
                 working_memory: Any) -> tuple[da.Array, da.Array]:
    """A resident (numpy/scipy, or computed dask) index against a dask array of queries,
    lazily: the index is checked and prepared here, once, and each chunk of queries is a
    task against it."""
    from dask import delayed

    ring, p = dist.resolve_metric(metric, p, func="knn")
    check_param(working_memory, "working_memory", "knn", [Bytes(), None])
    check_dask_input(queries, "queries", "knn")
    prepared = dist.prepare_index(index, ring, p)
    if queries.shape[1] != prepared.shape[1]:
        raise ValueError(f"The 'index' and 'queries' parameters of knn must have the same number "
                         f"of columns. Got {prepared.shape[1]} and {queries.shape[1]}.")
    n = int(prepared.shape[0])
    check_param(k, "k", "knn", Interval(Integral, 1, n), f" (the index has {n} rows)")
    working_memory = config.get_bytes("knn.working-memory", working_memory)
    run = uuid.uuid4().hex
    held = delayed(prepared, name=f"mgpu-knn-index-{run}")  # one key, not a copy per task
    queries = row_chunks(queries, "knn")
    parts = [delayed(_chunk_knn, pure=True, nout=2)(
        held, q, k, ring.name, p, 0, working_memory, dask_key_name=f"mgpu-knn-chunk-{run}-{c}")
        for c, q in enumerate(queries.to_delayed(optimize_graph=False).ravel())]
    return _as_dask(parts, queries.chunks[0], k, f"mgpu-knn-{run}")


def knn(index: Any, queries: Any, k: int, *, metric: str = "euclidean", p: float = 2,
        working_memory: Any = None, progress: Callable[[int], None] | None = None
        ) -> tuple[Any, Any]:
    """The k nearest rows of ``index`` for every row of ``queries``, on one machine or a cluster.

    Parameters
    ----------
    index : {ndarray, sparse matrix} of shape (n_index, n_features), or a dask array
        A dask array (sparse or dense chunks, any chunking) is the index of a cluster: it is
        cut into row tiles (re-cut at nnz prefix sums when it is also cut by columns), kept
        on the workers and prepared there once per call, and the tiles' top-k lists are
        merged in a tree. The index must be resident, so it is placed (computed) now;
        without a cluster it is computed into this process.
    queries : {ndarray, sparse matrix} of shape (n_queries, n_features), or a dask array
        numpy/scipy queries are sent in batches and the results come back as numpy. A dask
        array of queries is streamed, chunk by chunk, against the resident index, and the
        results are dask arrays (lazy: nothing runs until they are computed).
    k : int
        1 <= k <= n_index.
    metric, p, working_memory
        As :func:`mgpu.ops.distances.knn`.
    progress : callable, optional
        Distributed index and numpy queries only: called with the number of queries done
        after each batch.

    Returns
    -------
    distances : ndarray or dask array of shape (n_queries, k), best first
    indices : ndarray or dask array of shape (n_queries, k), int64, ties to the lower index
        dask arrays, chunked like the queries' rows, when the queries are a dask array.

    Raises
    ------
    ValueError
        As :func:`mgpu.ops.distances.knn`; for a distributed index, before any query is
        sent, a working memory that cannot hold one query's work against the largest tile
        (with the bytes needed and the number of tiles that would fit).

    Examples
    --------
    >>> import numpy as np
    >>> knn(np.array([[0.0], [1.0], [3.0]]), np.array([[2.9]]), 2)[1].tolist()
    [[2, 1]]
    >>> import dask.array as da
    >>> d, i = knn(np.array([[0.0], [1.0], [3.0]]), da.from_array(np.array([[2.9], [0.2]])), 1)
    >>> i.compute().ravel().tolist()
    [2, 0]
    """
    check_param(progress, "progress", "knn", [IsCallable(), None])
    if progress is not None and is_dask_array(queries):
        raise ValueError("The 'progress' parameter of knn is for numpy/scipy queries; a dask "
                         "array of queries gives lazy results: follow them with "
                         "distributed.progress. Leave progress out.")
    if is_dask_array(index):
        if current_client() is not None:
            return knn_distributed(index, queries, k, metric=metric, p=p,
                                   working_memory=working_memory, progress=progress)
        # no cluster to keep it on: the resident index is this process's
        check_dask_input(index, "index", "knn")
        index = one_chunk(index, "knn").compute()
    if is_dask_array(queries):
        return _local_index(index, queries, k, metric, p, working_memory)
    return dist.knn(index, queries, k, metric=metric, p=p, working_memory=working_memory)
