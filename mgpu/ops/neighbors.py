"""``NearestNeighbors`` with scikit-learn's estimator API over :func:`mgpu.knn`."""
from __future__ import annotations

from numbers import Integral
from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu.backends import array_module, is_gpu_array, knn_lookup, sparse_module
from mgpu.ops.distances import check_knn_input, check_knn_pair, drop_self, resolve_metric
from mgpu.ops.routes import route
from mgpu.ops.validation import Boolean, Interval, check_option, check_param, is_dask_array

__all__ = ["NearestNeighbors"]


def _sparse_array(X: Any) -> bool:
    """Whether X is a scipy sparse array, or a dask array of them (``csr_array`` out)."""
    return isinstance(getattr(X, "_meta", X), sp.sparray)


class NearestNeighbors:
    """Exact nearest neighbours, brute force in memory-bounded batches.

    Parameters
    ----------
    n_neighbors : int, default=5
    metric : str, default='euclidean'
        Any name or alias of :data:`mgpu.ops.distances.SEMIRINGS`.
    p : float, default=2
        Minkowski's exponent.

    Attributes
    ----------
    n_samples_fit_ : int
    n_features_in_ : int

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[0.0], [1.0], [2.5], [10.0]])
    >>> nn = NearestNeighbors(n_neighbors=2).fit(X)
    >>> nn.kneighbors(np.array([[2.0]]))[1].tolist()
    [[2, 1]]
    >>> nn.kneighbors(n_neighbors=1)[1].ravel().tolist()  # each point's neighbour but itself
    [1, 0, 1, 2]
    """

    def __init__(self, n_neighbors: int = 5, *, metric: str = "euclidean", p: float = 2):
        self.n_neighbors = n_neighbors
        self.metric = metric
        self.p = p

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {"n_neighbors": self.n_neighbors, "metric": self.metric, "p": self.p}

    def set_params(self, **params: Any) -> NearestNeighbors:
        for key, value in params.items():
            if key not in self.get_params():
                raise ValueError(f"Invalid parameter {key!r} for NearestNeighbors; valid ones: "
                                 f"{sorted(self.get_params())}.")
            setattr(self, key, value)
        return self

    def fit(self, X: Any, y: Any = None) -> NearestNeighbors:
        """Keep X (checked and converted once) as the index."""
        resolve_metric(self.metric, self.p, func="NearestNeighbors")
        self._check_k(self.n_neighbors, "n_neighbors", None)
        self._fit_sparray = _sparse_array(X)
        if is_dask_array(X):  # a resident index: on the cluster's workers (mgpu.distributed)
            self._fit_X = route("nearest_neighbors.fit")(X, self.metric, self.p)
        # CuPy data stays on its device as given (no checked copy held beside it): each
        # kneighbors call checks it there
        elif is_gpu_array(X):
            self._fit_X = X
        else:
            self._fit_X = check_knn_input(X, "X", "NearestNeighbors.fit")
        self.n_samples_fit_, self.n_features_in_ = self._fit_X.shape
        return self

    def _check_k(self, k: Any, name: str, limit: int | None) -> int:
        check_param(k, name, "NearestNeighbors", Interval(Integral, 1, None))
        if limit is not None and k > limit:
            raise ValueError(f"Expected n_neighbors <= n_samples_fit, but n_neighbors = {k}, "
                             f"n_samples_fit = {self.n_samples_fit_}, n_samples = {limit}")
        return int(k)

    def kneighbors(self, X: Any = None, n_neighbors: int | None = None,
                   return_distance: bool = True) -> Any:
        """Neighbours of X's rows, or of the index's own rows (each without itself) if X is None.

        Returns
        -------
        distances : ndarray of shape (n_queries, n_neighbors)
            Only when ``return_distance``.
        indices : ndarray of shape (n_queries, n_neighbors)
        """
        if not hasattr(self, "_fit_X"):
            raise ValueError("This NearestNeighbors instance is not fitted yet. Call 'fit' first.")
        check_param(return_distance, "return_distance", "NearestNeighbors.kneighbors",
                    Boolean())
        k = self.n_neighbors if n_neighbors is None else n_neighbors
        self_query = X is None
        limit = self.n_samples_fit_ - 1 if self_query else self.n_samples_fit_
        k = self._check_k(k, "n_neighbors", limit)
        # mgpu.knn's checks, with the refusals naming this method's X
        shape = getattr(X, "shape", ())
        if len(shape) == 2 and shape[1] != self.n_features_in_:
            raise ValueError(f"The 'X' parameter of NearestNeighbors.kneighbors must have the "
                             f"{self.n_features_in_} columns of the fitted X. Got {shape[1]} "
                             "instead.")
        if is_dask_array(self._fit_X) or is_dask_array(X):  # mgpu.distributed's kNN
            dist, ind = route("nearest_neighbors.kneighbors")(self._fit_X, X, k, self.metric,
                                                              self.p)
            return (dist, ind) if return_distance else ind
        ring, p = resolve_metric(self.metric, self.p, func="NearestNeighbors")
        index, Q = check_knn_pair(self._fit_X, None if self_query else X, ring,
                                  "NearestNeighbors.kneighbors", ("X", "X"))
        dist, ind = knn_lookup(index, Q, k + 1 if self_query else k, ring, p, None)
        if self_query:
            dist, ind = drop_self(dist, ind, k)
        return (dist, ind) if return_distance else ind

    def kneighbors_graph(self, X: Any = None, n_neighbors: int | None = None,
                         mode: str = "connectivity") -> sp.csr_matrix:
        """The kNN graph as CSR of shape (n_queries, n_samples_fit): ones or distances
        (cupyx CSR when the index is CuPy data)."""
        check_option("mode", "kneighbors_graph", mode, ("connectivity", "distance"))
        dist, ind = self.kneighbors(X, n_neighbors, return_distance=True)
        if is_dask_array(ind):  # lazy results: a lazy graph (mgpu.distributed)
            return route("nearest_neighbors.graph")(dist, ind, self.n_samples_fit_,
                                                    mode == "distance", self._fit_sparray)
        n_q, k = ind.shape
        xp, csr_matrix = array_module(ind), sparse_module(ind).csr_matrix
        id_type = np.int64 if xp is np else xp.int32  # cupyx CSR indices are 32-bit
        data = xp.ones(n_q * k, dtype=dist.dtype) if mode == "connectivity" else dist.ravel()
        graph = csr_matrix((data, ind.ravel().astype(id_type),
                            xp.arange(0, n_q * k + 1, k, dtype=id_type)),
                           shape=(n_q, self.n_samples_fit_))
        return sp.csr_array(graph) if self._fit_sparray else graph
