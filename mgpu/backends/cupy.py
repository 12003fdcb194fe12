"""GPU backend: CuPy arrays and cupyx sparse matrices, kernels from ``kernels/``.

Imported lazily by the dispatch tables the first time CuPy data reaches an operation.
"""
from __future__ import annotations

import cupy
import cupyx.scipy.sparse as csp

from mgpu.backends import row_norms_lookup, sddmm_lookup
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


_SDDMM = "sddmm.cu"
_NZ_PER_WARP = 32
_GATHER_BYTES = 1 << 28  # working memory of the gather-dot fallback per pass


def sddmm_is_usable_for(S: csp.csr_matrix, A: cupy.ndarray, B: cupy.ndarray) -> bool:
    """Whether the warp kernel takes these operands (instantiated dtypes, C order)."""
    return (
        S.format == "csr"
        and S.dtype.name in ("float32", "float64")
        and S.dtype == A.dtype == B.dtype
        and S.indptr.dtype.name in ("int32", "int64")
        and S.indices.dtype == S.indptr.dtype
        and A.flags.c_contiguous
        and B.flags.c_contiguous
        and A.shape[1] < 2**31
    )


def sddmm_kernel(S: csp.csr_matrix, A: cupy.ndarray, B: cupy.ndarray,
                 hadamard: bool) -> csp.csr_matrix:
    """P = S ∘ (A Bᵀ) by the load-balanced warp kernel of kernels/sddmm.cu."""
    nnz = int(S.nnz)
    out = cupy.empty(nnz, dtype=A.dtype)
    if nnz:
        fn = get_function(
            _SDDMM,
            f"mgpu_sddmm_warp<{c_type(A.dtype)}, {c_type(S.indptr.dtype)}>",
            INSTANCES[_SDDMM],
        )
        warps = -(-nnz // _NZ_PER_WARP)
        threads = 256
        blocks = -(-warps * 32 // threads)
        fn((blocks,), (threads,), (
            S.indptr, S.indices, S.data, A, B, cupy.int64(S.shape[0]), cupy.int64(nnz),
            cupy.int32(A.shape[1]), cupy.int32(1 if hadamard else 0),
            cupy.int32(_NZ_PER_WARP), out,
        ))
    return csp.csr_matrix((out, S.indices.copy(), S.indptr.copy()), shape=S.shape)


def sddmm_fallback(S: csp.csr_matrix, A: cupy.ndarray, B: cupy.ndarray,
                   hadamard: bool) -> csp.csr_matrix:
    """The same product as a CuPy gather-dot, in passes bounded by working memory."""
    nnz = int(S.nnz)
    out = cupy.empty(nnz, dtype=A.dtype)
    rows = cupy.repeat(cupy.arange(S.shape[0], dtype=cupy.int64),
                       cupy.diff(S.indptr).astype(cupy.int64))
    step = max(1, _GATHER_BYTES // max(1, 2 * A.shape[1] * A.itemsize))
    for s in range(0, nnz, step):
        r, c = rows[s:s + step], S.indices[s:s + step]
        out[s:s + step] = (A[r] * B[c]).sum(axis=1)
    if hadamard:
        out *= S.data.astype(out.dtype, copy=False)
    return csp.csr_matrix((out, S.indices.copy(), S.indptr.copy()), shape=S.shape)


@sddmm_lookup.register(csp.spmatrix)
def _sddmm_sparse(S, A, B, hadamard: bool):
    if sddmm_is_usable_for(S, A, B):
        return sddmm_kernel(S, A, B, hadamard)
    return sddmm_fallback(S, A, B, hadamard)
