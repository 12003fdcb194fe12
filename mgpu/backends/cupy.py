"""GPU backend: CuPy arrays and cupyx sparse matrices, kernels from ``kernels/``.

Imported lazily by the dispatch tables the first time CuPy data reaches an operation.
"""
from __future__ import annotations

import cupy
import cupyx.scipy.sparse as csp

from mgpu.backends import row_norms_lookup
from mgpu.backends.instances import INSTANCES
from mgpu.backends.loader import c_type, get_function
from mgpu.backends.numpy import ROW_ABS_MAX, ROW_ABS_SUM, ROW_SQ_SUM, ROW_SUM, dense_row_reduce

_ROWS = "rows.cu"
_ROWS_INSTANCES = INSTANCES[_ROWS]
_WARPS_PER_BLOCK = 8


def row_norms_is_usable_for(X: csp.csr_matrix) -> bool:
    """Whether the warp-per-row kernel takes this matrix (dtypes it is instantiated for)."""
    return (
        X.format == "csr"
        and X.dtype.name in ("float32", "float64")
        and X.indptr.dtype.name in ("int32", "int64")
    )


def row_reduce_csr_kernel(X: csp.csr_matrix, op: int) -> cupy.ndarray:
    """Per-row reduction by the ``mgpu_row_norms_warp`` kernel (one warp per row)."""
    n = X.shape[0]
    out = cupy.empty(n, dtype=X.dtype)
    if n == 0:
        return out
    fn = get_function(
        _ROWS,
        f"mgpu_row_norms_warp<{c_type(X.dtype)}, {c_type(X.indptr.dtype)}, {op}>",
        _ROWS_INSTANCES,
    )
    dev = cupy.cuda.Device()
    max_blocks = dev.attributes["MultiProcessorCount"] * 32
    blocks = int(min(max_blocks, -(-n // _WARPS_PER_BLOCK)))
    fn((blocks,), (32 * _WARPS_PER_BLOCK,), (X.indptr, X.data, cupy.int64(n), out))
    return out


def row_reduce_csr_fallback(X: csp.csr_matrix, op: int) -> cupy.ndarray:
    """The same reduction through cupyx's own sparse routines (any dtype), in float64."""
    X64 = X.astype(cupy.float64)
    if op == ROW_SUM:
        r = X64.sum(axis=1)
    elif op == ROW_ABS_SUM:
        r = abs(X64).sum(axis=1)
    elif op == ROW_SQ_SUM:
        r = X64.multiply(X64).sum(axis=1)
    else:
        r = abs(X64).max(axis=1).toarray()
    return cupy.asarray(r).ravel().astype(X.dtype, copy=False)


@row_norms_lookup.register(csp.spmatrix)
def _row_reduce_sparse(X, op: int):
    X = X.tocsr()
    if row_norms_is_usable_for(X):
        return row_reduce_csr_kernel(X, op)
    return row_reduce_csr_fallback(X, op)


@row_norms_lookup.register(cupy.ndarray)
def _row_reduce_dense(X, op: int):
    return dense_row_reduce(X, op, cupy)
