"""Row norms of dense or sparse matrices (the norms the semiring distances expand with)."""
from __future__ import annotations

from typing import Any

import numpy as np

from mgpu.backends import array_module, row_norms_lookup
from mgpu.backends.numpy import ROW_ABS_MAX, ROW_ABS_SUM, ROW_SQ_SUM, ROW_SUM, narrow
from mgpu.ops.validation import (canonical_csr, check_array, check_option, float_dtype,
                                 is_dask_array, is_sparse)

# norm name -> (row reduction, whether the result is square-rooted)
NORMS: dict[str, tuple[int, bool]] = {
    "l1": (ROW_ABS_SUM, False),
    "l2": (ROW_SQ_SUM, True),
    "sqeuclidean": (ROW_SQ_SUM, False),
    "linf": (ROW_ABS_MAX, False),
    "sum": (ROW_SUM, False),
}


def _row_norms_block(X: Any, op: int, root: bool) -> Any:
    dt = float_dtype(X.dtype)
    # A rooted norm is rounded to float32 after its square root, not before: the squares of
    # float32 values above ~1.8e19 overflow float32 while their norm does not.
    work = np.dtype(np.float64) if root else dt
    if is_sparse(X):
        X = canonical_csr(X)
        if X.dtype != work:
            X = X.astype(work)
    else:
        X = X.astype(work, copy=False)
    r = row_norms_lookup(X, op)
    return narrow(np.sqrt(r), dt) if root else r


def row_norms(X: Any, *, norm: str = "l2") -> Any:
    """Norm of every row of a dense or sparse matrix.

    Parameters
    ----------
    X : {array-like, sparse matrix} of shape (n_samples, n_features)
        numpy array or scipy sparse matrix (CPU), cupy array or cupyx sparse matrix (GPU),
        or a dask array of such chunks, chunked by rows.
    norm : {'l2', 'sqeuclidean', 'l1', 'linf', 'sum'}, default='l2'
        ``'sqeuclidean'`` is the squared L2 norm, ``'sum'`` the plain row sum.

    Returns
    -------
    norms : ndarray of shape (n_samples,)
        float32 for float32 input, float64 otherwise (accumulated in float64 either way);
        numpy for CPU input, cupy for GPU input, a dask array for dask input. Duplicate
        entries of a sparse matrix are summed first; NaN propagates.

    Raises
    ------
    TypeError
        If X is not a supported array or holds non-real values.
    ValueError
        If X is not 2-D or ``norm`` is unknown.

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> row_norms(sp.csr_matrix([[3.0, 4.0], [0.0, 0.0]]))
    array([5., 0.])
    >>> row_norms(sp.csr_matrix([[3.0, -4.0]]), norm="l1")
    array([7.])
    """
    check_option("norm", "row_norms", norm, NORMS)
    check_array(X, "X", "row_norms", accept_dask=True)
    op, root = NORMS[norm]
    if is_dask_array(X):
        if X.numblocks[1] != 1:
            X = X.rechunk({1: -1})
        dt = float_dtype(X.dtype)
        meta = array_module(X._meta).empty(0, dtype=dt)
        return X.map_blocks(
            _row_norms_block, op, root, drop_axis=1, dtype=dt, meta=meta, token="mgpu-row-norms"
        )
    return _row_norms_block(X, op, root)
