"""CuPy CSR helpers of the sparse products (:mod:`mgpu.backends.cupy_spgemm`,
:mod:`mgpu.backends.cupy_spadd`): CSR matrices from their arrays, 32-bit index arrays, rows
sorted by column in place, and the check of CSR operands
(:data:`mgpu.backends.csr_sound_lookup`)."""
from __future__ import annotations

import cupy
import cupyx.scipy.sparse as csp
import numpy as np

from mgpu.backends.arrays import csr_well_formed
from mgpu.backends.dispatch import csr_sound_lookup
from mgpu.backends.flags import device_flag, flag_csr

__all__ = ["csr_of", "indptr_of", "int32_indices", "rows_of", "sort_rows"]

_INT32_MAX = np.iinfo(np.int32).max


def sort_rows(c_idx: cupy.ndarray, c_val: cupy.ndarray, starts: cupy.ndarray,
               lens: cupy.ndarray, n: int) -> None:
    """Sort by column, in place, the runs c_idx[starts[i] : starts[i] + lens[i]] (and c_val
    alike): one radix sort of (run, column) keys, 32-bit where they fit."""
    ends = cupy.cumsum(lens)
    total = int(ends[-1])
    t = cupy.arange(total, dtype=cupy.int64)
    seg = cupy.searchsorted(ends, t, side="right")
    pos = starts[seg] + t - (ends[seg] - lens[seg])
    shift = max(1, int(n - 1).bit_length())
    if (lens.size << shift) <= _INT32_MAX:
        key = (seg.astype(cupy.int32) << shift) | c_idx[pos]
    else:
        key = (seg << shift) | c_idx[pos].astype(cupy.int64)
    order = cupy.argsort(key)
    c_idx[pos] = c_idx[pos][order]
    c_val[pos] = c_val[pos][order]


def rows_of(indptr: cupy.ndarray, nnz: int) -> cupy.ndarray:
    """The row of each of ``nnz`` entries of a CSR with row pointers ``indptr``."""
    return (cupy.searchsorted(indptr, cupy.arange(nnz, dtype=indptr.dtype), side="right")
            - 1).astype(cupy.int32)


# cupyx's constructor from (data, indices, indptr) reads the index arrays back to check them
# (waits for the device); the product's arrays are right by construction, so they are
# wrapped by the constructor CuPy itself uses for its own results, where it has one
_FROM_PARTS = getattr(csp.csr_matrix, "_from_parts", None)


def csr_of(indptr: cupy.ndarray, idx: cupy.ndarray, val: cupy.ndarray, shape: tuple[int, int]
         ) -> csp.csr_matrix:
    """A canonical cupyx CSR of these arrays (int32 idx; indptr of any integer type, m + 1
    values)."""
    indptr = indptr.astype(cupy.int32, copy=False)
    if _FROM_PARTS is not None:
        return _FROM_PARTS(val, idx, indptr, shape, has_canonical_format=True)
    C = csp.csr_matrix((val, idx, indptr), shape=shape, copy=False)
    C.has_canonical_format = True
    return C


def indptr_of(counts: cupy.ndarray) -> cupy.ndarray:
    indptr = cupy.zeros(counts.size + 1, dtype=cupy.int64)
    indptr[1:] = cupy.cumsum(counts)
    return indptr


def int32_indices(X: csp.csr_matrix, name: str) -> csp.csr_matrix:
    """X with int32 index arrays, as the kernels take them (a copy of the index arrays
    where X's are 64-bit; refused where its size needs them)."""
    if X.indices.dtype == np.int32 and X.indptr.dtype == np.int32:
        return X
    if max(X.nnz, *X.shape) > _INT32_MAX:
        raise ValueError(
            f"The '{name}' operand ({X.shape[0]}×{X.shape[1]}, {X.nnz:,} nonzeros) needs 64-bit "
            "indices, which the GPU's SpGEMM does not take: multiply it on the CPU (scipy "
            "operands), or as a dask array of row tiles that each fit 32-bit indices.")
    return csp.csr_matrix((X.data, X.indices.astype(cupy.int32),
                           X.indptr.astype(cupy.int32)), shape=X.shape, copy=False)


@csr_sound_lookup.register(csp.spmatrix)
def _csr_sound_device(*Xs: csp.csr_matrix) -> bool:
    """Whether the cupyx CSR matrices ``Xs`` all have consistent index arrays and finite
    values: one launch each and one wait (64-bit index arrays, which the check kernel is
    not built for, by CuPy's reductions)."""
    if any(X.indices.dtype != np.int32 or X.indptr.dtype != np.int32 for X in Xs):
        return all(bool(csr_well_formed(X) & cupy.isfinite(X.data).all()) for X in Xs)
    # the kernel reads m + 1 row pointers and as many indices as values: their lengths first
    if any(X.indptr.shape != (X.shape[0] + 1,) or X.indices.ndim != 1
           or X.data.shape != X.indices.shape for X in Xs):
        return False
    with device_flag() as flag:
        for X in Xs:
            flag_csr(X, flag)
        return not flag.raised()
