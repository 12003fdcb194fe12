"""``NearestNeighbors``: a scikit-learn estimator (``BaseEstimator``'s parameters and repr,
tags, the ``KNeighborsMixin`` methods ``kneighbors`` and ``kneighbors_graph``) over
:func:`mgpu.knn`.

scikit-learn is a dependency of mgpu, imported by this module alone; ``mgpu`` and
``mgpu.ops`` load this module the first time ``NearestNeighbors`` is asked for, so that
``import mgpu`` (and every ``mgpu`` command) does not pay scikit-learn's import time.
"""
from __future__ import annotations

from numbers import Integral
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted, validate_data

from mgpu.backends import array_module, is_gpu_array, knn_lookup, sparse_module
from mgpu.ops.distances import (check_knn_input, check_knn_pair, check_knn_values, drop_self,
                                resolve_metric)
from mgpu.ops.routes import route
from mgpu.ops.validation import (Boolean, Interval, as_array, check_option, check_param,
                                 is_dask_array)

__all__ = ["NearestNeighbors"]

# a row and a column at least, as scikit-learn's estimators ask (12 rows of no column would
# all be at distance 0)
_LEAST = {"min_samples": 1, "min_features": 1}

def _sparse_array(X: Any) -> bool:
    """Whether X is a scipy sparse array, or a dask array of them (``csr_array`` out)."""
    return isinstance(getattr(X, "_meta", X), sp.sparray)


class NearestNeighbors(BaseEstimator):
    """Exact nearest neighbours, brute force in memory-bounded batches.

    A scikit-learn estimator: ``get_params``/``set_params``, ``clone`` and the repr come
    from ``sklearn.base.BaseEstimator``, and scikit-learn's estimator checks pass for every
    metric (tests/test_estimator_checks.py). Its tags say that sparse input is taken and,
    for hellinger, kl_divergence and jensenshannon, that only nonnegative data is.

    ``fit`` checks X once, whatever its kind (numpy, scipy sparse in any format, CuPy or
    cupyx on the GPU, or an array-like such as a list of rows, converted with
    ``np.asarray``): real numbers (numbers stored as objects are converted), at least one
    row and one column, no NaN or infinity, and the values the metric takes. CuPy data is
    checked on its device and kept there; queries go to the device of the index.

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
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Only when X had column names of str (a pandas DataFrame), as in scikit-learn.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[0.0], [1.0], [2.5], [10.0]])
    >>> nn = NearestNeighbors(n_neighbors=2).fit(X)
    >>> nn
    NearestNeighbors(n_neighbors=2)
    >>> nn.kneighbors(np.array([[2.0]]))[1].tolist()
    [[2, 1]]
    >>> nn.kneighbors(n_neighbors=1)[1].ravel().tolist()  # each point's neighbour but itself
    [1, 0, 1, 2]
    """

    def __init__(self, n_neighbors: int = 5, *, metric: str = "euclidean", p: float = 2):
        self.n_neighbors = n_neighbors
        self.metric = metric
        self.p = p

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        try:
            tags.input_tags.positive_only = resolve_metric(self.metric, self.p)[0].nonnegative
        except ValueError:  # an unknown metric or p: fit refuses it, and no data is taken
            tags.input_tags.positive_only = False
        return tags

    def fit(self, X: Any, y: Any = None) -> NearestNeighbors:
        """Keep X, checked and converted once, as the index.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            numpy, scipy sparse, CuPy or cupyx data, or what ``np.asarray`` makes a 2-D
            array of numbers.
        y : None
            Ignored (scikit-learn's estimator API).

        Returns
        -------
        self : NearestNeighbors

        Raises
        ------
        ValueError
            A bad parameter; X not 2-D, complex (a ValueError and a TypeError), without rows
            or columns, with NaN or infinity, with negative values for hellinger,
            kl_divergence or jensenshannon, or rows summing to 0 for jensenshannon.
        TypeError
            X of a kind not taken, or of values that are not numbers.
        """
        ring, _ = resolve_metric(self.metric, self.p, func="NearestNeighbors")
        self._check_k(self.n_neighbors, "n_neighbors", None)
        self._fit_sparray = _sparse_array(X)
        if is_dask_array(X):  # a resident index: on the cluster's workers (mgpu.distributed)
            self._fit_X = route("nearest_neighbors.fit")(X, self.metric, self.p)
            self.n_samples_fit_, self.n_features_in_ = (int(n) for n in self._fit_X.shape)
            return self
        X_in, X = X, as_array(X, "X", "NearestNeighbors.fit")
        checked = check_knn_input(X, "X", "NearestNeighbors.fit", on=X, **_LEAST)
        check_knn_values(checked, "X", "NearestNeighbors.fit", ring)
        # column names and n_features_in_ as scikit-learn records them (X is checked above)
        validate_data(self, X_in, skip_check_array=True)
        # CuPy data stays on its device as given (no checked copy held beside it): each
        # kneighbors call converts it there again
        self._fit_X = X if is_gpu_array(X) else checked
        self.n_samples_fit_ = int(checked.shape[0])
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

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_queries, n_features), optional
            The queries, of the kinds ``fit`` takes, on the device of the index. None: each
            row of the index, its own entry left out (see
            :func:`mgpu.ops.distances.drop_self` for a row crowded out of its own list by
            duplicates).
        n_neighbors : int, optional
            Neighbours per query (default: the ``n_neighbors`` of the estimator).
        return_distance : bool, default=True

        Returns
        -------
        distances : ndarray of shape (n_queries, n_neighbors)
            Best first; only when ``return_distance``.
        indices : ndarray of shape (n_queries, n_neighbors)
            Rows of the index; among equal distances the lower row first.
        """
        check_is_fitted(self)
        check_param(return_distance, "return_distance", "NearestNeighbors.kneighbors",
                    Boolean())
        k = self.n_neighbors if n_neighbors is None else n_neighbors
        self_query = X is None
        limit = self.n_samples_fit_ - 1 if self_query else self.n_samples_fit_
        k = self._check_k(k, "n_neighbors", limit)
        X_in = X
        if not self_query:
            X = as_array(X, "X", "NearestNeighbors.kneighbors")
            # mgpu.knn's checks, with the refusals naming this method's X
            shape = getattr(X, "shape", ())
            if len(shape) == 2 and shape[1] != self.n_features_in_:
                raise ValueError(
                    f"The 'X' parameter of NearestNeighbors.kneighbors must have the "
                    f"{self.n_features_in_} columns of the fitted X. Got {shape[1]} instead (X "
                    f"has {shape[1]} features, but NearestNeighbors is expecting "
                    f"{self.n_features_in_} features as input).")
        if is_dask_array(self._fit_X) or is_dask_array(X):  # mgpu.distributed's kNN
            dist, ind = route("nearest_neighbors.kneighbors")(self._fit_X, X, k, self.metric,
                                                              self.p)
            return (dist, ind) if return_distance else ind
        ring, p = resolve_metric(self.metric, self.p, func="NearestNeighbors")
        index, Q = check_knn_pair(self._fit_X, X, ring, "NearestNeighbors.kneighbors",
                                  ("X", "X"), **_LEAST)
        if not self_query:  # scikit-learn's warnings on column names that differ from fit's
            validate_data(self, X_in, skip_check_array=True, reset=False)
        dist, ind = knn_lookup(index, Q, k + 1 if self_query else k, ring, p, None)
        if self_query:
            dist, ind = drop_self(dist, ind, k)
        return (dist, ind) if return_distance else ind

    def kneighbors_graph(self, X: Any = None, n_neighbors: int | None = None,
                         mode: str = "connectivity") -> sp.csr_matrix:
        """The kNN graph as CSR of shape (n_queries, n_samples_fit): ones or distances
        (cupyx CSR when the index is CuPy data).

        Parameters
        ----------
        X, n_neighbors
            As :meth:`kneighbors` (X None: the index's rows, each without itself).
        mode : {'connectivity', 'distance'}, default='connectivity'

        Returns
        -------
        A : sparse matrix of shape (n_queries, n_samples_fit_)
        """
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
