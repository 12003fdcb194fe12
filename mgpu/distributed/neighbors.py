"""Dask arrays in pairwise distances and ``NearestNeighbors``: the versions the ops reach
through :mod:`mgpu.ops.routes`.

``pairwise_distances`` is lazy: a task per row chunk of X against all of Y (gathered into
one chunk), the values checked by the tasks. ``NearestNeighbors.fit`` on a dask array keeps
the index resident, as kNN needs it: on the cluster's workers as row tiles (placed and
checked at ``fit``), or, without a cluster, computed into this process. ``kneighbors`` with
a dask array of queries (or of the index's own rows) gives lazy dask arrays.
"""
from __future__ import annotations

import uuid
from typing import Any

import dask.array as da
import numpy as np
import scipy.sparse as sp

from mgpu.distributed.cluster import current_client
from mgpu.distributed.inputs import check_dask_input, is_placed, one_chunk, row_chunks, row_tiles
from mgpu.distributed.knn import _as_dask, knn
from mgpu.ops import distances as dist
from mgpu.ops.routes import register
from mgpu.ops.validation import is_dask_array

__all__ = ["kneighbors", "kneighbors_graph", "nearest_neighbors_index", "pairwise_distances"]


def _distances_block(X: Any, Y: Any, metric: str, p: float) -> np.ndarray:
    """One row chunk of X against all of Y, checked and computed as on one device."""
    if isinstance(Y, list):  # blockwise hands the contracted chunk over as a list
        Y = Y[0]
    X = X[0] if isinstance(X, list) else X
    return dist.pairwise_distances(X, Y, metric=metric, p=p)


@register("pairwise_distances")
def pairwise_distances(X: Any, Y: Any = None, *, metric: str = "euclidean",
                       p: float = 2) -> da.Array:
    """:func:`mgpu.pairwise_distances` when X or Y is a dask array: a lazy dask array of
    X's row chunks by all of Y's rows."""
    ring, p = dist.resolve_metric(metric, p)
    for name, Z in (("X", X), ("Y", Y)):
        if is_dask_array(Z):
            check_dask_input(Z, name, "pairwise_distances")
    if not is_dask_array(X):
        X = da.from_array(dist.check_knn_input(X, "X", "pairwise_distances"),
                          chunks=X.shape, asarray=False)
    X = row_chunks(X, "pairwise_distances")
    Y = X if Y is None else Y
    if Y.shape[1] != X.shape[1]:
        raise ValueError(f"The 'X' and 'Y' parameters of pairwise_distances must have the same "
                         f"number of columns. Got {X.shape[1]} and {Y.shape[1]}.")
    Y = one_chunk(Y, "pairwise_distances") if is_dask_array(Y) else da.from_array(
        Y, chunks=Y.shape, asarray=False, name=f"mgpu-distances-y-{uuid.uuid4().hex}")
    return da.blockwise(_distances_block, "ij", X, "ik", Y, "jk", metric=ring.name, p=p,
                        concatenate=False, dtype=np.float64,
                        meta=np.empty((0, 0), dtype=np.float64),
                        adjust_chunks={"j": (int(Y.shape[0]),)},
                        name=f"mgpu-distances-{uuid.uuid4().hex}")


def _check_tile(tile: Any, metric: str, p: float) -> np.ndarray:
    """Refuse a tile of an index that kNN would refuse (kinds, NaN, negative values...)."""
    ring, p = dist.resolve_metric(metric, p, func="NearestNeighbors.fit")
    X = dist.check_knn_input(tile, "X", "NearestNeighbors.fit", on=tile)
    dist.check_knn_values(X, "X", "NearestNeighbors.fit", ring)
    return np.zeros((1, 1), dtype=np.int8)


@register("nearest_neighbors.fit")
def nearest_neighbors_index(X: da.Array, metric: str, p: float) -> Any:
    """The resident index of ``NearestNeighbors.fit(X)`` for a dask X, checked now: row
    tiles on the workers (a placed dask array), or, without a cluster, X computed here."""
    check_dask_input(X, "X", "NearestNeighbors.fit")
    client = current_client()
    if client is None:
        return dist.check_knn_input(one_chunk(X, "NearestNeighbors.fit").compute(), "X",
                                    "NearestNeighbors.fit")
    index = row_tiles(X, "NearestNeighbors.fit")
    if not is_placed(index):
        index = client.persist(index)
    index.map_blocks(_check_tile, metric, p, dtype=np.int8, chunks=((1,) * index.numblocks[0],
                                                                     (1,)),
                     meta=np.empty((0, 0), dtype=np.int8),
                     token="mgpu-knn-check").compute()
    return index


def _drop_self(d: np.ndarray, i: np.ndarray, offset: int, k: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`mgpu.ops.distances.drop_self` for the chunk of the index's own rows that
    starts at row ``offset``."""
    d, i = dist.drop_self(d, i - offset, k)
    return d, i + offset


@register("nearest_neighbors.kneighbors")
def kneighbors(index: Any, X: Any, k: int, metric: str, p: float) -> tuple[Any, Any]:
    """``NearestNeighbors.kneighbors`` when the index or the queries are dask arrays; X None
    queries the index's own rows, each without itself (dask results)."""
    if X is not None:
        return knn(index, X, k, metric=metric, p=p)
    from dask import delayed

    d, i = knn(index, index, k + 1, metric=metric, p=p)
    offsets = np.concatenate([[0], np.cumsum(d.chunks[0])[:-1]]).astype(np.int64)
    parts = [delayed(_drop_self, pure=True, nout=2)(dc, ic, int(o), k)
             for dc, ic, o in zip(d.to_delayed(optimize_graph=False).ravel(),
                                  i.to_delayed(optimize_graph=False).ravel(), offsets)]
    return _as_dask(parts, d.chunks[0], k, f"mgpu-knn-self-{uuid.uuid4().hex}")


def _graph_block(d: np.ndarray, i: np.ndarray, n: int, distance: bool, sparse_array: bool
                 ) -> Any:
    """One row chunk of the kNN graph as CSR: ones (connectivity) or the distances."""
    n_q, k = i.shape
    data = d.ravel() if distance else np.ones(n_q * k, dtype=d.dtype)
    G = sp.csr_matrix((data, i.ravel(), np.arange(0, n_q * k + 1, k)), shape=(n_q, n))
    return sp.csr_array(G) if sparse_array else G


@register("nearest_neighbors.graph")
def kneighbors_graph(d: da.Array, i: da.Array, n: int, distance: bool, sparse_array: bool
                     ) -> da.Array:
    """The kNN graph of dask (distances, indices) as a lazy dask array of CSR row chunks
    (``csr_array`` chunks when the index came as scipy sparse arrays)."""
    meta = _graph_block(np.empty((0, 1)), np.empty((0, 1), dtype=np.int64), n, distance,
                        sparse_array)
    return da.map_blocks(_graph_block, d, i, n, distance, sparse_array, dtype=np.float64,
                         chunks=(d.chunks[0], (n,)), meta=meta, token="mgpu-knn-graph")

