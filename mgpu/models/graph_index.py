"""``GraphIndex``: approximate nearest neighbours by a proximity graph, GANNS's search and
GGraphCon's batched construction (Yu, PhD thesis ch. 4); see
:mod:`mgpu.backends.numpy_ann` for the algorithms.

A scikit-learn estimator (``BaseEstimator``'s parameters, repr and ``clone``;
``kneighbors``), saved to and loaded from an ``.npz`` file of plain arrays (no pickle).
This module imports scikit-learn; :mod:`mgpu.models` loads it the first time
``GraphIndex`` is asked for.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from numbers import Integral
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from mgpu.backends import (ann_build_lookup, ann_half_lookup, ann_prepare_lookup,
                           ann_search_lookup, is_gpu_array, is_sparse, to_host)
from mgpu.backends.numpy_ann import HALF_DENSE, rows_of
from mgpu.distributed.ann import build_shards, search_shards
from mgpu.distributed.ann_routed import Routed, build_routed, search_routed
from mgpu.distributed.inputs import check_dask_input, is_sparse_array
from mgpu.ops.distances import check_knn_input
from mgpu.ops.validation import (Boolean, InstanceOf, Interval, IsCallable, StrOptions,
                                 as_array, check_param, is_dask_array)

__all__ = ["GraphIndex"]

# metric name -> (the graph's metric, how its distances become the metric's)
_METRICS: dict[str, tuple[str, Callable[[np.ndarray], np.ndarray]]] = {
    "euclidean": ("sqeuclidean", lambda d: np.sqrt(np.maximum(d, 0.0))),
    "l2": ("sqeuclidean", lambda d: np.sqrt(np.maximum(d, 0.0))),
    "sqeuclidean": ("sqeuclidean", lambda d: np.maximum(d, 0.0)),
    "cosine": ("cosine", lambda d: d),
    "inner_product": ("inner_product", lambda d: -d),  # a similarity: the largest first
}
_FORMAT = 1  # the version of the saved file's layout
_NAME = "GraphIndex"  # the refusals of the constructor's parameters name the estimator
_PATH = InstanceOf((str, os.PathLike), "a str or path")
# a sparse index's rows in a saved file (mgpu.backends.numpy_ann.prepare's tuple)
_SPARSE = ("rows_indptr", "rows_indices", "rows_values", "rows_squared_norms")


class GraphIndex(BaseEstimator):
    """Approximate nearest neighbours in a proximity graph: GANNS's search, GGraphCon's
    construction (Yu, PhD thesis ch. 4), on all CPU cores (numba) or on a GPU.

    ``fit`` builds the graph: the rows are inserted in batches; each row of a batch
    searches the graph built so far and links to up to ``degree // 2`` of the nearest
    among what it found and the rows of its batch before it (with ``diverse``, those that
    no nearer link already stands for), and each link is added back the other way; a
    vertex keeps the links it made and the nearest of those made to it, ``degree`` in all.
    A search keeps the ``candidates`` nearest vertices met in a fixed-length array and
    explores, one at a time, the nearest not yet explored among its first ``explore``; it
    scores every neighbour of that vertex without asking whether it was met before
    (GANNS's lazy check), and ends when those first ``explore`` are all explored. More
    candidates (and a larger ``explore``) find more of the true neighbours at more
    distances computed.

    On the CPU (numpy, scipy sparse) or the GPU (CuPy, cupyx sparse: the graph is built
    and searched there, by the kernels of ``kernels/ann.cu``, one thread block a query), as
    X of ``fit`` is; queries must be where the index is; a dask array is sharded over a
    cluster's workers (``partition``). A sparse row is scored against a query as mgpu's
    sparse kNN scores it: a dot product over the columns the two share (their sorted
    columns merged), expanded with the norms for the euclidean distances; rows are never
    made dense.
    Queries take the index's form (dense queries of a sparse index are made sparse, and
    sparse ones of a dense index dense).

    Parameters
    ----------
    n_neighbors : int, default=10
        The neighbours ``kneighbors`` returns unless told.
    metric : {'euclidean', 'l2', 'sqeuclidean', 'cosine', 'inner_product'}, default='euclidean'
        ``inner_product`` is a similarity: the largest are the nearest, and returned.
    degree : int, default=32
        The most links a vertex keeps (at least 2); a new row makes ``degree // 2``.
    candidates : int, default=64
        The vertices a search keeps (its array N), in ``fit`` and in ``kneighbors``; at
        least ``n_neighbors``.
    explore : int or None, default=None
        How far down the candidates a search explores (at most ``candidates``; None: all).
    batch : int, default=1024
        Rows inserted at a time by ``fit``.
    diverse : bool, default=True
        A new row links only to the candidates nearer to it than to every candidate it
        linked to before them (HNSW's heuristic; Malkov and Yashunin, 2018): where several
        lie in one direction the nearest stands for them, so the links reach in more
        directions and a search needs fewer candidates for the same recall. False: its
        ``degree // 2`` nearest.
    partition : {'rows', 'clusters'}, default='rows'
        How ``fit`` shards a dask array over the workers. ``'rows'``: a shard a row tile,
        and every shard searches every query (any rows and metric; the workers share the
        memory, not the work). ``'clusters'`` (dense rows; euclidean, sqeuclidean or
        cosine): a shard a worker holding tiles, each holding the rows nearest its k-means
        centroids (32 a shard, from a sample of the rows), and each query searched only in
        the ``probes`` shards whose centroids lie nearest, in one SPMD job (NCCL between
        GPU workers): the workers share the work too. Ignored for data on one device.
    probes : int, default=1
        With ``partition='clusters'``: the shards each query is searched in (more find
        the neighbours that lie across a cluster's border, at more work; at least the
        shards, every shard searches every query).
    half : bool, default=False
        Keep the rows in half precision (float16) once the graph is built on them as
        given: on the GPU half their memory, and half the bytes a search reads of each
        row it scores, with float32 queries and sums; distances are those of the rounded
        rows. On the CPU the rounded values are kept as float64 (the same neighbours, no
        memory saved). Dense rows only, each value within float16's range (±65504, after
        cosine's scaling); refused before the build otherwise. Read by ``fit``.

    Attributes
    ----------
    effective_metric_ : str
        The metric the graph was built with (``kneighbors`` refuses to search it under
        another). ``candidates`` and ``explore`` may change between searches.
    n_samples_fit_ : int
    n_features_in_ : int
    graph_ : ndarray of shape (n_samples_fit_, degree)
        Each vertex's neighbours: the links it made, nearest first, then the nearest of
        those made to it; -1 past ``degree_``. None for an index sharded over a cluster
        (each worker holds its shard's graph).
    degree_ : ndarray of shape (n_samples_fit_,)

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [5.0, 5.0], [5.0, 6.0]])
    >>> index = GraphIndex(n_neighbors=2, degree=4, candidates=4).fit(X)
    >>> dist, ind = index.kneighbors(np.array([[0.9, 0.1]]))
    >>> ind.tolist(), dist.round(3).tolist()
    ([[1, 0]], [[0.141, 0.906]])
    """

    def __init__(self, n_neighbors: int = 10, *, metric: str = "euclidean", degree: int = 32,
                 candidates: int = 64, explore: int | None = None, batch: int = 1024,
                 diverse: bool = True, partition: str = "rows", probes: int = 1,
                 half: bool = False):
        self.n_neighbors = n_neighbors
        self.metric = metric
        self.degree = degree
        self.candidates = candidates
        self.explore = explore
        self.batch = batch
        self.diverse = diverse
        self.partition = partition
        self.probes = probes
        self.half = half

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    def _check_params(self) -> tuple[str, int, int]:
        """The graph's metric, N's length and the exploration limit, refusing bad
        parameters."""
        func = _NAME
        check_param(self.metric, "metric", func, StrOptions(set(_METRICS)))
        check_param(self.n_neighbors, "n_neighbors", func, Interval(Integral, 1, None))
        check_param(self.degree, "degree", func, Interval(Integral, 2, None))
        check_param(self.candidates, "candidates", func, Interval(Integral, 1, None))
        if self.candidates < self.n_neighbors:
            raise ValueError(
                f"The 'candidates' parameter of {func} must be at least n_neighbors = "
                f"{self.n_neighbors} (a search keeps that many vertices). Got "
                f"{self.candidates!r} instead.")
        check_param(self.explore, "explore", func,
                    [Interval(Integral, 1, int(self.candidates)), None],
                    " (at most candidates)")
        check_param(self.batch, "batch", func, Interval(Integral, 1, None))
        check_param(self.diverse, "diverse", func, Boolean())
        check_param(self.partition, "partition", func, StrOptions({"rows", "clusters"}))
        check_param(self.probes, "probes", func, Interval(Integral, 1, None))
        check_param(self.half, "half", func, Boolean())
        explore = self.candidates if self.explore is None else self.explore
        return _METRICS[self.metric][0], int(self.candidates), int(explore)

    def fit(self, X: Any, y: Any = None, *,
            progress: Callable[[int, int], None] | None = None) -> GraphIndex:
        """Build the graph of the rows of X.

        Parameters
        ----------
        X : {array-like, sparse matrix, dask array} of shape (n_samples, n_features)
            Real numbers, finite: numpy, scipy sparse (any format), CuPy or cupyx sparse
            (the index is then built and kept on the GPU, float32 kept float32), or a
            dask array on a cluster (``mgpu.connect()``): each worker then builds and keeps
            the graph of its row tiles (on its GPU for CuPy chunks), a shard of the index.
        y : None
            Ignored (scikit-learn's estimator API).
        progress : callable or None, default=None
            Called as ``progress(rows_inserted, n_samples)`` after each batch; for a dask
            array, after each shard (``partition="rows"``), or about once a second as the
            first shard's build goes (its share of the rows inserted, as a number of
            ``n_samples``) and once all are built (``partition="clusters"``).

        Returns
        -------
        self : GraphIndex

        Raises
        ------
        ValueError
            A bad parameter; X not 2-D, empty, or with NaN or infinity.
        TypeError
            X not of numbers.
        """
        metric, l_n, e = self._check_params()
        check_param(progress, "progress", "GraphIndex.fit", [IsCallable(), None])
        d_max = int(self.degree)
        self._shards = None
        # only to choose the path: a dask array's rows are sharded over the workers
        if is_dask_array(X):
            if self.half and is_sparse_array(X):
                raise ValueError(HALF_DENSE)
            build = build_routed if self.partition == "clusters" else build_shards
            self._shards = build(X, metric, max(1, d_max // 2), d_max, l_n, e,
                                 int(self.batch), bool(self.diverse), progress,
                                 bool(self.half))
            self._sparse = is_sparse_array(X)
            self._data = self.graph_ = self.degree_ = None
            self.effective_metric_ = self.metric
            self.n_samples_fit_, self.n_features_in_ = (int(n) for n in X.shape)
            return self
        X = _rows(X, "X", "GraphIndex.fit")
        data = ann_prepare_lookup(X, metric)
        self._sparse = is_sparse(X)
        halved = ann_half_lookup(data) if self.half else None  # refused before the build
        self.graph_, self.degree_ = ann_build_lookup(data, metric, max(1, d_max // 2), d_max,
                                                     l_n, e, int(self.batch), progress,
                                                     bool(self.diverse))
        self._data = data if halved is None else halved
        self.effective_metric_ = self.metric
        self.n_samples_fit_, self.n_features_in_ = (int(n) for n in X.shape)
        return self

    def _check_fitted(self) -> None:
        """Refuse an index not built, or built for another metric than it now names (the
        graph's links, and its rows' scaling, hold for the metric of ``fit``)."""
        check_is_fitted(self, "graph_")
        if self.metric != self.effective_metric_:
            raise ValueError(
                f"The 'metric' parameter of {_NAME} is {self.metric!r}, but the index was "
                f"built for {self.effective_metric_!r}: fit it again, or set the metric "
                "back (the graph's links hold for the metric it was built with).")

    def kneighbors(self, X: Any, n_neighbors: int | None = None, return_distance: bool = True
                   ) -> Any:
        """The approximate nearest rows of the index to each row of X, nearest first.

        Parameters
        ----------
        X : {array-like, sparse matrix, dask array} of shape (n_queries, n_features)
            Real numbers, finite, on the device of the index (the GPU for an index fitted
            on GPU data; either for a sharded one, whose answers are numpy arrays); a dask
            array only for an index partitioned by clusters (its tiles are searched where
            they are, and the answers kept there).
        n_neighbors : int or None, default=None
            At most ``candidates`` and the index's rows (None: the index's
            ``n_neighbors``).
        return_distance : bool, default=True

        Returns
        -------
        distances : ndarray of shape (n_queries, n_neighbors), float64
            In the metric's terms (inner products for ``inner_product``, the largest
            first). Only with ``return_distance``. For a dask array X: a dask array of
            X's tiles (one a shard), held on the workers.
        indices : ndarray of shape (n_queries, n_neighbors), int64
            Rows of the index; -1 (and distance inf, or -inf for ``inner_product``) past
            the vertices a search reached, where it reached fewer than asked (a graph
            whose links were dropped so that some rows are out of reach). A dask array
            for a dask array X, as the distances.

        Raises
        ------
        ValueError
            X not 2-D, with another number of columns than the index, empty, or with NaN
            or infinity; n_neighbors out of range.
        TypeError
            X on another device than the index, a dask array (but for an index partitioned
            by clusters), or not of numbers.
        """
        func = "GraphIndex.kneighbors"
        self._check_fitted()
        metric, l_n, e = self._check_params()
        k = self.n_neighbors if n_neighbors is None else n_neighbors
        most = min(l_n, self.n_samples_fit_)
        check_param(k, "n_neighbors", _NAME, Interval(Integral, 1, most),
                    f" (at most candidates = {l_n} and the index's {self.n_samples_fit_} rows)")
        check_param(return_distance, "return_distance", func, Boolean())
        routed = isinstance(self._shards, Routed)
        # a dask array of queries stays on the workers of an index partitioned by clusters
        if routed and is_dask_array(X):
            check_dask_input(X, "X", func)  # 2-D, real numbers, known chunks
            Q = X
        else:
            Q = _rows(X, "X", func)
        if Q.ndim != 2 or Q.shape[1] != self.n_features_in_:
            raise ValueError(f"The 'X' parameter of {func} must have {self.n_features_in_} "
                             f"columns, as the index. Got shape {Q.shape} instead.")
        if routed:  # each query goes to its nearest shards
            if not is_dask_array(Q) and not self._shards.anchor.gpu:
                Q = to_host(Q)
            dist, ind = search_routed(self._shards, Q, int(k), metric, l_n, e,
                                      int(self.probes))
            return (_METRICS[self.metric][1](dist), ind) if return_distance else ind
        if self._shards is not None:  # every shard searches the queries, from the host
            dist, ind = search_shards(self._shards, to_host(Q), int(k), metric, l_n, e)
            return (_METRICS[self.metric][1](dist), ind) if return_distance else ind
        # only to word the refusal: each device searches its own index
        if is_gpu_array(Q) != is_gpu_array(self.graph_):
            where = "the GPU" if is_gpu_array(self.graph_) else "the CPU"
            raise TypeError(
                f"The 'X' parameter of {func} must be on {where}, where the index is. Got "
                f"{type(Q).__name__} instead: move the queries (cupy.asarray(X), or X.get()), "
                "or fit the index on the queries' device.")
        queries = ann_prepare_lookup(Q, metric, self._sparse)  # in the index's form
        dist, ind = ann_search_lookup(self._data, self.graph_, self.degree_, queries,
                                      int(k), metric, l_n, e)
        return (_METRICS[self.metric][1](dist), ind) if return_distance else ind

    def save(self, path: str | os.PathLike) -> None:
        """Write the index (its parameters, the rows as the graph holds them, the graph) to
        ``path``, an ``.npz`` file of plain arrays (``.npz`` added where the name lacks
        it), whole: written beside it first, then moved into place."""
        check_param(path, "path", "GraphIndex.save", _PATH)
        self._check_fitted()
        if self._shards is not None:
            raise ValueError("GraphIndex.save writes an index held on one device; this one is "
                             "sharded over a cluster's workers (fitted on a dask array). Fit "
                             "it on a numpy, scipy or CuPy array to save it.")
        params = self.get_params()
        data = self._data
        # a GPU index is written as the CPU's: its rows in the host form (without scaling
        # them again: "sqeuclidean"), its graph as int64
        if is_gpu_array(self.graph_):
            data = ann_prepare_lookup(to_host(data), "sqeuclidean")
        rows = dict(zip(_SPARSE, data)) if self._sparse else {"data": data}
        final = os.fspath(path)
        final = final if final.endswith(".npz") else final + ".npz"
        head, name = os.path.split(final)
        partial = os.path.join(head, f".{name[:-4]}.partial.npz")
        np.savez(partial, format=np.int64(_FORMAT),
                 graph=to_host(self.graph_).astype(np.int64), **rows,
                 links=to_host(self.degree_).astype(np.int64),
                 n_features=np.int64(self.n_features_in_),
                 metric=np.str_(params.pop("metric")),
                 partition=np.str_(params.pop("partition")),
                 explore=np.int64(-1 if params["explore"] is None else params["explore"]),
                 **{k: np.int64(v) for k, v in params.items() if k != "explore"})
        os.replace(partial, final)

    @classmethod
    def load(cls, path: str | os.PathLike) -> GraphIndex:
        """The index :meth:`save` wrote to ``path`` (read without pickle)."""
        check_param(path, "path", "GraphIndex.load", _PATH)
        with np.load(path, allow_pickle=False) as f:
            if "format" not in f or int(f["format"]) != _FORMAT:
                raise ValueError(f"{os.fspath(path)!r} is not a GraphIndex file of format "
                                 f"{_FORMAT} (written by GraphIndex.save).")
            explore = int(f["explore"])
            index = cls(int(f["n_neighbors"]), metric=str(f["metric"]),
                        degree=int(f["degree"]), candidates=int(f["candidates"]),
                        explore=None if explore < 0 else explore, batch=int(f["batch"]),
                        # files written before the parameter hold graphs built without it
                        diverse=bool(f["diverse"]) if "diverse" in f else False,
                        # and before these two, which a file may lack
                        partition=str(f["partition"]) if "partition" in f else "rows",
                        probes=int(f["probes"]) if "probes" in f else 1,
                        half=bool(f["half"]) if "half" in f else False)
            index._sparse = _SPARSE[0] in f
            index._shards = None
            index._data = tuple(f[k] for k in _SPARSE) if index._sparse else f["data"]
            index.graph_ = f["graph"]
            index.degree_ = f["links"]
            index.effective_metric_ = index.metric
            index.n_samples_fit_ = rows_of(index._data)
            index.n_features_in_ = int(f["n_features"])
        return index


def _rows(X: Any, name: str, func: str) -> Any:
    """X checked where it is: a float64 numpy array or CSR matrix (summed duplicates) on
    the CPU, a C-ordered CuPy array or canonical cupyx CSR (float32 or float64) on the GPU,
    of real, finite numbers with rows and columns (an array-like converted, numbers stored
    as objects too), refusing dask data (queries) with what to do instead."""
    X = as_array(X, name, func)
    # only to word the refusal: queries come to the index as one batch
    if is_dask_array(X):
        raise TypeError(
            f"The '{name}' parameter of {func} must be data on one device (numpy, scipy "
            f"sparse, CuPy, cupyx sparse, or a list of rows). Got {type(X).__name__} "
            "instead: compute the queries first (X.compute()), in batches that fit.")
    return check_knn_input(X, name, func, X, min_samples=1, min_features=1)
