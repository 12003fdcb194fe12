"""``NearestNeighbors`` with scikit-learn's estimator API over :func:`mgpu.knn`."""
from __future__ import annotations

from numbers import Integral
from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu.backends import array_module, is_gpu_array, knn_lookup, sparse_module
from mgpu.ops.distances import check_knn_input, check_knn_pair, drop_self, resolve_metric
from mgpu.ops.validation import Boolean, Interval, check_option, check_param

__all__ = ["NearestNeighbors"]


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
        # CuPy data stays on its device as given (no checked copy held beside it): each
        # kneighbors call checks it there
        self._fit_X = X if is_gpu_array(X) else check_knn_input(X, "X", "NearestNeighbors.fit")
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
        n_q, k = ind.shape
        xp, csr_matrix = array_module(ind), sparse_module(ind).csr_matrix
        id_type = np.int64 if xp is np else xp.int32  # cupyx CSR indices are 32-bit
        data = xp.ones(n_q * k, dtype=dist.dtype) if mode == "connectivity" else dist.ravel()
        return csr_matrix((data, ind.ravel().astype(id_type),
                           xp.arange(0, n_q * k + 1, k, dtype=id_type)),
                          shape=(n_q, self.n_samples_fit_))
