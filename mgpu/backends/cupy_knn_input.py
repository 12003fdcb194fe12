"""The input of the GPU kNN and distance kernels (:mod:`mgpu.backends.cupy_knn`): checked
data on the device in canonical CSR (or C-ordered dense) form, and the value transforms of
the metrics' forms."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cupy
import cupyx.scipy.sparse as csp
import numpy as np

from mgpu.backends.cupy import row_reduce_csr_kernel
from mgpu.backends.numpy import ROW_SUM



def device_input(X: Any) -> Any:
    """X (a real 2-D array or sparse matrix, host or device, its kind and shape checked by
    :func:`mgpu.ops.distances.check_knn_input`) on the device as the kernels take it:
    float32/float64 (other reals become float64), CSR with summed duplicates, sorted indices
    and no stored zeros, or a C-ordered dense array."""
    if isinstance(X, np.ndarray) or type(X).__module__.startswith("scipy"):
        X = csp.csr_matrix(X) if hasattr(X, "tocsr") else cupy.asarray(X)
    dtype = X.dtype if X.dtype.name in ("float32", "float64") else np.dtype(np.float64)
    if csp.issparse(X):
        X = csp.csr_matrix(X, dtype=dtype, copy=True)
        X.sum_duplicates()
        X = without_zeros(X)
        X.sort_indices()
        return X
    return cupy.ascontiguousarray(X, dtype=dtype)


def without_zeros(X: csp.csr_matrix) -> csp.csr_matrix:
    """X without stored zeros. (cupyx's eliminate_zeros goes through cuSPARSE's compress,
    which on the CUDA 13 stack also loses negative values.)"""
    keep = X.data != 0
    if bool(keep.all()):
        return X
    rows = cupy.searchsorted(X.indptr, cupy.arange(X.nnz), side="right") - 1
    counts = cupy.bincount(rows[keep], minlength=X.shape[0])
    indptr = cupy.concatenate([cupy.zeros(1, X.indptr.dtype), cupy.cumsum(counts)]).astype(
        X.indptr.dtype)
    return csp.csr_matrix((X.data[keep], X.indices[keep], indptr), shape=X.shape)


def as_csr(X: Any) -> csp.csr_matrix:
    if csp.issparse(X):
        return X
    C = csp.csr_matrix(X)  # drops the zeros of a dense array
    # ...but leaves the indices of larger arrays unsorted, and the union walk and the
    # merge kernels take each row in feature order
    C.sort_indices()
    return C


def normalised(X: csp.csr_matrix) -> csp.csr_matrix:
    # a row's sum depends on the row alone (one warp per row), so a query equal to an index
    # row is scaled exactly as that row is, whatever matrix each sits in
    sums = row_reduce_csr_kernel(X, ROW_SUM).astype(cupy.float64)
    scale = 1.0 / sums
    rows = cupy.searchsorted(X.indptr, cupy.arange(X.nnz), side="right") - 1
    data = (X.data.astype(cupy.float64) * scale[rows]).astype(X.dtype)
    return csp.csr_matrix((data, X.indices, X.indptr), shape=X.shape)


def transformed(X: csp.csr_matrix, fn: Callable[[Any], Any] | None) -> csp.csr_matrix:
    if fn is None:
        return X
    data = fn(X.data.astype(cupy.float64)).astype(X.dtype)
    return csp.csr_matrix((data, X.indices, X.indptr), shape=X.shape)
