"""CPU merge-path SpMV and SpMM (numba), registered on :data:`mgpu.backends.spmv_lookup`.

The work of ``y = A @ x`` on CSR is the merge of two sorted lists, the row ends
``indptr[1:]`` and the nonzero indices ``0 .. nnz-1`` (Merrill & Garland; Dalton et al.,
"Optimizing Sparse Matrix Operations on GPUs using Merge Path"). The ``m + nnz`` merge
items are cut into equal pieces; each piece finds its start by a binary search along its
diagonal, writes the rows it ends, and leaves a carry ``(row, partial sum)`` for the row cut
at its end, which a fix-up pass adds. Pieces are equal whatever the row lengths: a single
very long row is spread over every thread, and an empty row costs one item (no compaction
pass is needed to skip them). The same scheme runs on the GPU in ``kernels/spmv.cu``.
"""
from __future__ import annotations

import numba
import numpy as np
import scipy.sparse as sp

from mgpu.backends.dispatch import spmv_lookup, spmv_plan_lookup, spmv_takes_as_is_lookup
from mgpu.backends.jit import njit
from mgpu.backends.numpy import narrow
from mgpu.backends.spmv_plan import SpMVPlan

__all__ = ["merge_path_rows", "piece_items", "piece_starts", "plan_spmv", "spmm_merge",
           "spmv_merge"]

# Merge items per piece: at least this many (the two searches and the carry are then a small
# part of a piece), else enough pieces for every thread several times over.
_MIN_ITEMS = 2048
_PIECES_PER_THREAD = 4


def piece_items(m: int, nnz: int, k: int = 1) -> int:
    """Merge items per piece for an ``m``-row matrix with ``nnz`` nonzeros and ``k`` columns
    of x: ``_PIECES_PER_THREAD`` pieces per numba thread, none smaller than about
    ``_MIN_ITEMS / k`` items (a wide X makes each item k times the work)."""
    total = m + nnz
    per_thread = -(-total // (_PIECES_PER_THREAD * numba.get_num_threads()))
    return int(max(1, max(_MIN_ITEMS // max(k, 1), per_thread)))


@njit(nogil=True, inline="always")
def merge_path_rows(d, indptr, m, nnz):
    """Rows consumed before diagonal ``d`` of the merge of ``indptr[1:]`` and ``0..nnz-1``:
    the largest r in [max(0, d - nnz), min(d, m)] with ``indptr[r] <= d - r``."""
    lo = max(d - nnz, 0)
    hi = min(d, m)
    while lo < hi:
        pivot = (lo + hi) >> 1
        if indptr[pivot + 1] <= d - pivot - 1:
            lo = pivot + 1
        else:
            hi = pivot
    return lo


@njit(parallel=True, nogil=True)
def _piece_starts(indptr, m, items, starts):
    nnz = np.int64(indptr[m])
    total = m + nnz
    for p in numba.prange(starts.shape[0]):
        starts[p] = merge_path_rows(min(np.int64(p) * items, total), indptr, m, nnz)


def piece_starts(indptr: np.ndarray, m: int, items: int) -> np.ndarray:
    """Rows consumed before each piece of ``items`` merge items starts, and ``m`` after the
    last: ``ceil((m + nnz) / items) + 1`` values (one search each, all threads)."""
    nnz = int(indptr[m]) if m else 0
    starts = np.empty(-(-(m + nnz) // items) + 1, dtype=np.int64)
    _piece_starts(indptr, np.int64(m), np.int64(items), starts)
    return starts


@njit(inline="always")
def _piece(p, items, starts, m, nnz):
    """Piece p's merge range: first row, row where it ends (cut or m), first nonzero and the
    nonzero where it ends."""
    total = m + nnz
    d0 = min(np.int64(p) * items, total)
    d1 = min(d0 + items, total)
    row = starts[p]
    row_end = starts[p + 1]
    return row, row_end, d0 - row, d1 - row_end


@njit(parallel=True, nogil=True)
def _spmv_merge(indptr, indices, data, x, items, starts, y, carry_row, carry_val):
    m = y.shape[0]
    nnz = np.int64(indptr[m])
    for p in numba.prange(carry_row.shape[0]):
        row, row_end, nz, nz_end = _piece(p, items, starts, m, nnz)
        acc = 0.0
        while row < row_end:
            stop = np.int64(indptr[row + 1])
            while nz < stop:
                acc += np.float64(data[nz]) * np.float64(x[indices[nz]])
                nz += 1
            y[row] = acc
            acc = 0.0
            row += 1
        while nz < nz_end:
            acc += np.float64(data[nz]) * np.float64(x[indices[nz]])
            nz += 1
        carry_row[p] = row_end
        carry_val[p] = acc


@njit(parallel=True, nogil=True)
def _spmm_merge(indptr, indices, data, X, items, starts, Y, carry_row, carry_val):
    m = Y.shape[0]
    k = Y.shape[1]
    nnz = np.int64(indptr[m])
    for p in numba.prange(carry_row.shape[0]):
        row, row_end, nz, nz_end = _piece(p, items, starts, m, nnz)
        acc = np.zeros(k)
        while row < row_end:
            stop = np.int64(indptr[row + 1])
            while nz < stop:
                v = np.float64(data[nz])
                j = indices[nz]
                for c in range(k):
                    acc[c] += v * np.float64(X[j, c])
                nz += 1
            for c in range(k):
                Y[row, c] = acc[c]
                acc[c] = 0.0
            row += 1
        while nz < nz_end:
            v = np.float64(data[nz])
            j = indices[nz]
            for c in range(k):
                acc[c] += v * np.float64(X[j, c])
            nz += 1
        carry_row[p] = row_end
        for c in range(k):
            carry_val[p, c] = acc[c]


def _fixup(y: np.ndarray, carry_row: np.ndarray, carry_val: np.ndarray) -> None:
    """Add each piece's carry to the row cut at its end (row m means none was cut)."""
    cut = carry_row < y.shape[0]
    # add.at accumulates repeated rows: a row may be cut by many pieces
    np.add.at(y, carry_row[cut], carry_val[cut])


@spmv_plan_lookup.register((sp.spmatrix, sp.sparray))
def plan_spmv(A: sp.csr_matrix) -> SpMVPlan:
    """The CPU plan of :func:`mgpu.spmv_plan`: the pieces of :func:`spmv_merge` and where
    each starts, found once."""
    m = A.shape[0]
    nnz = int(A.indptr[m]) if m else 0
    items = piece_items(m, nnz)
    starts = piece_starts(A.indptr, m, items)
    return SpMVPlan(device="cpu", shape=tuple(A.shape), nnz=nnz,
                    empty_rows=int(np.count_nonzero(np.diff(A.indptr) == 0)), compacted=False,
                    items=items, pieces=len(starts) - 1, starts=starts)


def spmv_merge(A: sp.csr_matrix, x: np.ndarray, *, items: int | None = None,
               plan: SpMVPlan | None = None) -> np.ndarray:
    """``A @ x`` by merge path, accumulated in float64 and returned in ``x``'s dtype.

    ``A`` is CSR (sorted or unsorted indices, duplicates summed as scipy does) with
    ``indptr[0] == 0``; ``x`` is 1-D of length ``A.shape[1]``. ``items`` (merge items per
    piece) defaults to :func:`piece_items`; a ``plan`` (:func:`plan_spmv` of this A) gives
    them and where the pieces start.
    """
    m = A.shape[0]
    nnz = int(A.indptr[m]) if m else 0
    if plan is not None:
        items, starts = plan.items, plan.starts
    else:
        items = piece_items(m, nnz) if items is None else int(items)
        starts = piece_starts(A.indptr, m, items)
    n_pieces = len(starts) - 1
    y = np.empty(m, dtype=np.float64)
    carry_row = np.empty(n_pieces, dtype=np.int64)
    carry_val = np.empty(n_pieces, dtype=np.float64)
    if n_pieces:
        _spmv_merge(A.indptr, A.indices, A.data, x, np.int64(items), starts, y, carry_row,
                    carry_val)
        _fixup(y, carry_row, carry_val)
    return narrow(y, x.dtype)


def spmm_merge(A: sp.csr_matrix, X: np.ndarray, *, items: int | None = None) -> np.ndarray:
    """``A @ X`` for a dense 2-D ``X`` by merge path: each piece covers all columns of X."""
    m = A.shape[0]
    k = X.shape[1]
    nnz = int(A.indptr[m]) if m else 0
    items = piece_items(m, nnz, k) if items is None else int(items)
    n_pieces = -(-(m + nnz) // items)
    Y = np.zeros((m, k), dtype=np.float64)
    carry_row = np.empty(n_pieces, dtype=np.int64)
    carry_val = np.empty((n_pieces, k), dtype=np.float64)
    if n_pieces and k:
        _spmm_merge(A.indptr, A.indices, A.data, X, np.int64(items),
                    piece_starts(A.indptr, m, items), Y, carry_row, carry_val)
        _fixup(Y, carry_row, carry_val)
    return narrow(Y, X.dtype)


@spmv_lookup.register((sp.spmatrix, sp.sparray))
def _spmv_sparse(A, x: np.ndarray, plan: SpMVPlan | None = None) -> np.ndarray:
    """A @ x for CSR A and a C-contiguous x of A's float dtype (checked by the caller); a
    ``plan`` (of this A, x 1-D) gives the merge's cuts."""
    A = A.tocsr()
    if x.ndim == 1:
        return spmv_merge(A, x, plan=plan)
    return spmm_merge(A, x)


@spmv_takes_as_is_lookup.register(object)
def _host_takes_nothing_as_is(A: object, x: object, ndim: int) -> bool:
    return False  # the host checks every operand before the product
