"""The proximity-graph index sharded over a cluster's workers: each worker builds and keeps
the graph of its own row tiles (on its GPU for CuPy tiles), a batch of queries goes to every
shard, and each shard's k nearest, with global ids, are merged on the client in a tree of
pairwise merges (:func:`mgpu.distributed.knn.merge_all`, ties to the lower id).

An index bigger than one device's memory is served by several this way; a query's answer is
the k nearest of what each shard's search found, so its recall is at least each shard's.
"""
from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask.array as da
import dask.config
import numpy as np

from mgpu.backends import (ann_build_lookup, ann_half_lookup, ann_prepare_lookup,
                           ann_search_lookup, is_gpu_array, is_sparse, on_device_of, to_host)
from mgpu.distributed.cluster import completed, current_client, task_placement
from mgpu.distributed.collection import block_futures, place_as
from mgpu.distributed.inputs import check_dask_input, is_placed, row_tiles
from mgpu.distributed.knn import merge_all
from mgpu.ops.distances import check_knn_input

logger = logging.getLogger(__name__)

__all__ = ["Shards", "build_shards", "gpu_settings", "search_shards"]

_FIT = "GraphIndex.fit"
# the GPU search's settings: read on the client, carried by the tasks (mgpu/config.py)
_SETTINGS = ("mgpu.ann.block-threads", "mgpu.ann.visited-slots", "mgpu.ann.merge",
             "mgpu.ann.search")


def gpu_settings() -> dict[str, Any]:
    """The GPU search's settings as the client has them, for tasks to carry."""
    return {key: dask.config.get(key) for key in _SETTINGS}


@dataclass
class Shard:
    """One worker's part of the index: its rows as the graph's kernels take them, its graph,
    and the global id of its first row."""

    data: Any
    graph: Any
    degree: Any
    offset: int
    sparse: bool


@dataclass
class Shards:
    """The client's handle of a sharded index: each shard's future (held on its worker),
    where its tasks run, and the rows of each."""

    futures: list[Any]
    placements: list[dict[str, Any]]
    rows: list[int]
    client: Any


def _build(tile: Any, metric: str, d_min: int, d_max: int, l_n: int, e: int, batch: int,
           diverse: bool, offset: int, settings: dict[str, Any], half: bool) -> Shard:
    """A tile's graph, built where the tile is (its rows checked there: NaN and infinity
    refused, as on one device; with ``half``, values past float16's range too, before the
    build), its rows then kept in half precision with ``half``."""
    X = check_knn_input(tile, "X", _FIT, tile, min_samples=1, min_features=1)
    data = ann_prepare_lookup(X, metric)
    halved = ann_half_lookup(data) if half else None
    with dask.config.set(settings):
        graph, degree = ann_build_lookup(data, metric, d_min, d_max, l_n, e, batch, None,
                                         diverse)
    return Shard(data if halved is None else halved, graph, degree, offset, is_sparse(X))


def _search(shard: Shard, queries: Any, k: int, metric: str, l_n: int, e: int,
            settings: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """A shard's k nearest to each of the queries (checked host rows), on the host, with
    global ids (-1 stays -1)."""
    Q = on_device_of(queries, shard.graph)  # host queries go to a GPU shard's device
    k = min(k, shard.graph.shape[0])
    with dask.config.set(settings):
        dist, ids = ann_search_lookup(shard.data, shard.graph, shard.degree,
                                      ann_prepare_lookup(Q, metric, shard.sparse), k,
                                      metric, l_n, e)
    dist, ids = to_host(dist).astype(np.float64), to_host(ids).astype(np.int64)
    return dist, np.where(ids >= 0, ids + shard.offset, -1)


def build_shards(X: da.Array, metric: str, d_min: int, d_max: int, l_n: int, e: int,
                 batch: int, diverse: bool,
                 progress: Callable[[int, int], None] | None = None,
                 half: bool = False) -> Shards:
    """Build the graph of each row tile of the dask array X on the worker that holds it
    (its rows then kept in half precision with ``half``); ``progress(rows, n)`` after each
    shard is built."""
    check_dask_input(X, "X", _FIT)
    client = current_client()
    if client is None:
        raise ValueError(f"The 'X' parameter of {_FIT} is a dask array, which needs a cluster: "
                         "call mgpu.connect() first, or pass a numpy, scipy or CuPy array.")
    X = row_tiles(X, _FIT)
    if not is_placed(X):  # each tile is built on, and its graph kept by, the worker it is on
        X = client.persist(X)
    blocks = block_futures(X, client)
    tiles = [blocks[(i, 0)] for i in range(X.numblocks[0])]
    where = client.who_has(tiles)
    gpu = is_gpu_array(X._meta)  # GPU shards stay pinned to their device (task_placement)
    offsets = np.concatenate([[0], np.cumsum(X.chunks[0])[:-1]]).astype(np.int64)
    futures, placements, rows, settings = [], [], [], gpu_settings()
    for tile, offset, n in zip(tiles, offsets, X.chunks[0]):
        if n == 0:
            continue
        pin = task_placement(list(where.get(tile.key, ()))[:1], gpu)
        futures.append(client.submit(_build, tile, metric, d_min, d_max, l_n, e, batch,
                                     diverse, int(offset), settings, half, pure=False, **pin))
        placements.append(pin)
        rows.append(int(n))
    n_rows, done = int(X.shape[0]), 0
    rows_of = {f.key: n for f, n in zip(futures, rows)}
    for future in completed(futures, "the shards' graphs", client):
        future.result()  # a shard's error (its rows refused, say) is raised here
        done += rows_of[future.key]
        if progress is not None:
            progress(done, n_rows)
    logger.info("graph index: %d shard(s) of %s rows built", len(futures), rows)
    return Shards(futures, placements, rows, client)


def search_shards(shards: Shards, queries: Any, k: int, metric: str, l_n: int, e: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest of the sharded index's rows to each query (checked host rows), in the
    graph's metric (nearest first): every shard searches the batch, their lists merged."""
    client = shards.client
    batch = place_as(client, f"mgpu-ann-queries-{uuid.uuid4().hex}", queries)
    settings = gpu_settings()
    parts = [client.submit(_search, f, batch, k, metric, l_n, e, settings, pure=False, **pin)
             for f, pin in zip(shards.futures, shards.placements)]
    for _ in completed(parts, "the shards' searches", client):
        pass
    # each shard gives min(k, its rows) a query, and k is at most the index's rows: the
    # merged lists hold k
    return merge_all(client.gather(parts), k, False)
