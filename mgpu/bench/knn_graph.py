"""The k-nearest-neighbour graph of a dataset's rows on a cluster: ``mgpu run knn-graph``.

The index is spread over the workers in nnz-balanced row tiles, every row is queried
against it, and each row's own entry is dropped, as scikit-learn's ``kneighbors_graph``
does. On a cluster of one worker kind (all GPU or all CPU workers) the rows go round the
workers SPMD (:func:`mgpu.distributed.all_knn.all_knn`); a mixed cluster sends query batches
to the tiles as tasks (:func:`mgpu.knn`). Both give the one-device graph.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from numbers import Integral
from typing import Any

import numpy as np
import scipy.sparse as sp

# The private checks of mgpu.ops.distances, imported in this one place.
from mgpu.ops.distances import check_knn_input, check_knn_values, drop_self, resolve_metric
from mgpu.ops.validation import Interval, check_param

logger = logging.getLogger(__name__)

__all__ = ["graph_stats", "knn_graph"]


def knn_graph(S: sp.spmatrix, k: int, *, metric: str = "cosine", p: float = 2.0,
              parts: int | None = None, address: str | None = None,
              gpus: bool | None = None, progress: Callable[[int], Any] | None = None
              ) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
    """The k-NN graph of the rows of ``S``, computed on a cluster.

    Parameters
    ----------
    S : sparse matrix of shape (n_samples, n_features)
    k : int
        Neighbours per row, the row itself excluded: in [1, n_samples - 1].
    metric, p
        Any metric or alias of ``mgpu.ops.distances.SEMIRINGS``, and Minkowski's exponent.
    parts : int, optional
        Row tiles of the index (default: one per worker).
    address, gpus
        The cluster, as ``mgpu.connect`` takes them (default: an embedded one).
    progress : callable, optional
        Called with the number of rows done as batches (or the ring's steps) finish.

    Returns
    -------
    G : csr_matrix of shape (n_samples, n_samples)
        Row i holds its k neighbours, distances as values.
    distances, indices : ndarray of shape (n_samples, k)

    Raises
    ------
    ValueError, TypeError
        An unknown metric, input the metric cannot take, fewer than 2 rows, k or parts out
        of range; before any cluster is started.
    """
    from mgpu import knn
    from mgpu.distributed import connect, from_scipy
    from mgpu.distributed.all_knn import all_knn, one_worker_kind

    ring, p = resolve_metric(metric, p, func="knn-graph")
    S = check_knn_input(sp.csr_matrix(S), "INPUT", "knn-graph")
    check_knn_values(S, "INPUT", "knn-graph", ring)
    n = S.shape[0]
    if n < 2:  # no k fits: say what is wrong with the input, not with k
        raise ValueError(f"The INPUT of knn-graph has {n} row(s) ("
                         + ("an empty file?" if n == 0 else "nothing to be a neighbour")
                         + "); a k-NN graph needs at least 2.")
    if not 1 <= k < n:
        raise ValueError(f"The 'k' parameter of knn-graph must be in [1, {n - 1}] for {n:,} "
                         f"rows. Got {k}.")
    check_param(parts, "parts", "knn-graph", [Interval(Integral, 1, None), None])
    with connect(address, gpus=gpus) as client:
        X = from_scipy(S, parts, axis=0, client=client)
        if one_worker_kind(client):
            logger.info("knn-graph: the rows go round the %d worker(s) SPMD",
                        len(client.scheduler_info()["workers"]))
            d, i = all_knn(X, k + 1, metric=ring.name, p=p, client=client, progress=progress)
        else:  # GPU and CPU workers: no one communicator; query batches go to the tiles
            logger.info("knn-graph: a mixed cluster; query batches go to the tiles as tasks")
            d, i = knn(X, S, k + 1, metric=ring.name, p=p, progress=progress)
    d, i = drop_self(d, i, k)
    G = sp.csr_matrix((d.ravel(), i.ravel(), np.arange(0, n * k + 1, k)), shape=(n, n))
    return G, d, i


def graph_stats(G: sp.csr_matrix, d: np.ndarray, i: np.ndarray) -> dict[str, Any]:
    """What ``mgpu run knn-graph`` reports of a graph: the finite distances and their
    quantiles (0, 0.5, 0.9, 1), how many are infinite, the in-degrees and the share of
    edges whose reverse is an edge too.

    >>> G = sp.csr_matrix(np.array([[0, 1.0], [2.0, 0]]))
    >>> s = graph_stats(G, np.array([[1.0], [2.0]]), np.array([[1], [0]]))
    >>> s["mutual"], s["in_degree"].tolist(), s["infinite"]
    (1.0, [1, 1], 0)
    """
    indeg = np.bincount(i.ravel(), minlength=G.shape[0])
    mutual = G.copy()
    mutual.data[:] = 1.0
    fin = d[np.isfinite(d)]
    return {
        "finite": fin,
        "quantiles": np.quantile(fin, [0.0, 0.5, 0.9, 1.0]) if fin.size else [np.nan] * 4,
        "infinite": int(d.size - fin.size),
        "in_degree": indeg,
        "mutual": float(mutual.multiply(mutual.T).sum()) / max(G.nnz, 1),
    }
