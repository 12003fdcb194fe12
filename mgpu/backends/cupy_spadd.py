"""GPU SpAdd (CuPy), registered on :data:`mgpu.backends.spadd_lookup`.

The sum runs as a merge of the two matrices' entries ordered by (row, column): each entry's
place in the merged list is its own index plus the number of the other matrix's entries
before it (a binary search each), the parallel merge of merge path; equal keys end up side by
side and are added.
"""
from __future__ import annotations

import cupy
import cupyx.scipy.sparse as csp

from mgpu.backends.cupy_csr import csr_of, indptr_of, rows_of
from mgpu.backends.dispatch import spadd_lookup
from mgpu.backends.memory import require_gpu

__all__: list[str] = []


def _canonical(X: csp.csr_matrix) -> csp.csr_matrix:
    """X with sorted columns and no duplicates (a copy where X is not so already)."""
    if X.has_canonical_format:
        return X
    X = X.copy()
    X.sum_duplicates()
    return X


@spadd_lookup.register(csp.spmatrix)
def _spadd_cupy(A: csp.csr_matrix, B: csp.csr_matrix, alpha: float, beta: float
                ) -> csp.csr_matrix:
    """alpha·A + beta·B of canonical A and B by a parallel merge of their (row, column)
    keys; exact zeros left out (as scipy's sum)."""
    A, B = _canonical(A), _canonical(B)
    m, n = A.shape
    dt = A.dtype
    what = (f"SpAdd of two {m}×{n} matrices with {A.nnz:,} and {B.nnz:,} nonzeros")
    total = A.nnz + B.nnz
    require_gpu(total * (8 * 4 + 2 * dt.itemsize) + 16 * (m + 1), what)
    if total == 0:
        return csp.csr_matrix((m, n), dtype=dt)
    ka = rows_of(A.indptr, A.nnz).astype(cupy.int64) * n + A.indices
    kb = rows_of(B.indptr, B.nnz).astype(cupy.int64) * n + B.indices
    keys = cupy.empty(total, dtype=cupy.int64)
    vals = cupy.empty(total, dtype=dt)
    pa = cupy.arange(A.nnz, dtype=cupy.int64) + cupy.searchsorted(kb, ka, side="left")
    pb = cupy.arange(B.nnz, dtype=cupy.int64) + cupy.searchsorted(ka, kb, side="right")
    keys[pa] = ka
    keys[pb] = kb
    vals[pa] = A.data * dt.type(alpha)
    vals[pb] = B.data * dt.type(beta)
    del ka, kb, pa, pb
    head = cupy.ones(total, dtype=cupy.bool_)
    head[1:] = keys[1:] != keys[:-1]
    # each key appears at most twice (once from each canonical matrix): a head's sum is its
    # value plus that of the next entry when the next is not a head
    nxt = cupy.zeros(total, dtype=dt)
    nxt[:-1] = cupy.where(head[1:], dt.type(0), vals[1:])
    sums = (vals + nxt)[head]
    keys = keys[head]
    keep = sums != 0
    keys, sums = keys[keep], sums[keep]
    rows = keys // n
    counts = cupy.bincount(rows, minlength=m)
    return csr_of(indptr_of(counts), (keys - rows * n).astype(cupy.int32), sums, (m, n))
