"""CPU kNN and pairwise distances (numpy, scipy, numba) through the semiring table.

The *expanded* metrics are one dot-product pass (X·Yᵀ on the values or on a transform of
them) with per-row statistics and an element-wise formula; the *NAMM* metrics run the union
kernels of :mod:`mgpu.backends.numpy`. kNN runs in batches of queries sized from the working
memory, and takes each batch's top k. Input comes checked and converted
(:func:`mgpu.ops.distances.check_knn_pair`): float64 CSR or C-ordered dense arrays.
``ring`` is a :class:`mgpu.ops.distances.Semiring`.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu import config
from mgpu.backends.dispatch import (
    distances_lookup,
    knn_input_lookup,
    knn_lookup,
    knn_prepare_lookup,
    knn_prepared_lookup,
    namm_lookup,
)
from mgpu.backends.numpy import correlation_csr, csr_dot_dense

__all__ = ["distances", "knn_checked", "nbytes", "top_k", "working_memory_for",
           "working_memory_rows"]

_HOST = (np.ndarray, sp.spmatrix, sp.sparray)


@knn_input_lookup.register(object)
def _host_input(on: Any, X: Any) -> Any:
    """X (a real 2-D numpy array or scipy matrix) as float64 CSR with summed duplicates, or a
    float64 C-ordered array: what the CPU kernels take."""
    if sp.issparse(X):
        X = sp.csr_matrix(X, dtype=np.float64, copy=True)
        X.sum_duplicates()
        return X
    return np.ascontiguousarray(X, dtype=np.float64)


# ---------------------------------------------------------------------------- computation

def _dot(X: Any, Y: Any) -> np.ndarray:
    """X·Yᵀ as a dense float64 array (sparse-sparse in parallel, dense through BLAS)."""
    if sp.issparse(X) and sp.issparse(Y):
        return csr_dot_dense(X, Y)
    out = X @ Y.T
    return out.toarray() if sp.issparse(out) else np.asarray(out)


def _map_values(X: Any, fn: Any) -> Any:
    """fn applied to the stored values (the nonzeros of sparse X, every entry of dense X)."""
    if sp.issparse(X):
        out = X.copy()
        out.data = fn(out.data)
        return out
    return fn(X)


def _row_sums(X: Any) -> np.ndarray:
    return np.asarray(X.sum(axis=1)).ravel()


def _pattern(X: Any) -> Any:
    return _map_values(X, lambda v: (v != 0).astype(np.float64))


def _expanded(ring: Any, X: Any, Y: Any) -> np.ndarray:
    """The expanded metrics: one product per term, row statistics, an element-wise formula."""
    n = X.shape[1]
    name = ring.name
    if name == "inner_product":
        return _dot(X, Y)
    # In place where it costs nothing: a batch's working memory is counted in these arrays
    # (Semiring.batch_copies).
    if name in ("euclidean", "sqeuclidean"):
        sq = lambda Z: _row_sums(_map_values(Z, np.square))  # noqa: E731
        d = _dot(X, Y)
        d *= -2.0
        d += sq(X)[:, None]
        d += sq(Y)[None, :]
        np.maximum(d, 0.0, out=d)
        return np.sqrt(d, out=d) if name == "euclidean" else d
    if name == "correlation":
        return _correlation(X, Y)
    if name == "cosine":
        dot = _dot(X, Y)
        sx = np.sqrt(_row_sums(_map_values(X, np.square)))
        sy = np.sqrt(_row_sums(_map_values(Y, np.square)))
        return _cosine_finish(dot, sx, sy)
    if name in ("dice", "jaccard", "russellrao"):
        PX, PY = _pattern(X), _pattern(Y)
        both = _dot(PX, PY)
        if name == "russellrao":
            return (n - both) / n if n else np.zeros_like(both)
        cx, cy = _row_sums(PX)[:, None], _row_sums(PY)[None, :]
        if name == "dice":
            num, den = cx + cy - 2.0 * both, cx + cy
        else:
            num, den = cx + cy - 2.0 * both, cx + cy - both
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)
    if name == "hellinger":
        s = _dot(_map_values(X, np.sqrt), _map_values(Y, np.sqrt))
        return np.sqrt(np.maximum(1.0 - s, 0.0))
    if name == "kl_divergence":
        xlogx = _row_sums(_map_values(X, lambda v: np.where(v > 0, v * np.log(np.where(
            v > 0, v, 1.0)), 0.0)))
        logy = _map_values(Y, lambda v: np.where(v > 0, np.log(np.where(v > 0, v, 1.0)), 0.0))
        cross = _dot(X, logy)
        # x_i > 0 where y_i == 0 makes the divergence infinite: count the support x shares
        covered = _dot(_pattern(X), _pattern(Y))
        d = xlogx[:, None] - cross
        return np.where(covered < _row_sums(_pattern(X))[:, None], np.inf, d)
    raise AssertionError(name)


def _cosine_finish(dot: np.ndarray, sx: np.ndarray, sy: np.ndarray) -> np.ndarray:
    """1 - dot / (sx·sy) in place, clipped to [0, 2]; a row without length is at distance 1
    from every row."""
    den = np.multiply.outer(sx, sy)
    with np.errstate(divide="ignore", invalid="ignore"):
        dot /= den
    dot[den <= 0] = 0.0
    np.subtract(1.0, dot, out=dot)
    return np.clip(dot, 0.0, 2.0, out=dot)


def _centred_dense(Z: np.ndarray) -> np.ndarray:
    """Z's rows minus their means; a constant row (all entries equal, decided exactly) has
    its value as the mean, so that it becomes exactly 0 as the sparse form makes it."""
    lo, hi = Z.min(axis=1), Z.max(axis=1)
    mean = np.where(lo == hi, lo, Z.mean(axis=1))
    return Z - mean[:, None]


def _correlation(X: Any, Y: Any) -> np.ndarray:
    """Correlation from centred rows: dense rows are centred before the product (BLAS);
    sparse rows go through the backend's kernel, which centres them without densifying
    (:func:`mgpu.backends.numpy.correlation_csr`). A zero-variance row (constant, decided
    exactly; a zero row; any row without features) is at distance 1 from every row."""
    if X.shape[1] == 0:
        return np.ones((X.shape[0], Y.shape[0]))
    if sp.issparse(X) or sp.issparse(Y):
        return correlation_csr(sp.csr_matrix(X), sp.csr_matrix(Y))
    Xc, Yc = _centred_dense(X), _centred_dense(Y)
    sx = np.sqrt(np.einsum("ij,ij->i", Xc, Xc))
    sy = np.sqrt(np.einsum("ij,ij->i", Yc, Yc))
    dot = Xc @ Yc.T
    del Xc, Yc
    return _cosine_finish(dot, sx, sy)


def _namm(ring: Any, X: Any, Y: Any, p: float) -> np.ndarray:
    """The union metrics through the backend's merge kernel (rows as CSR)."""
    Xc, Yc = sp.csr_matrix(X), sp.csr_matrix(Y)
    if ring.name == "jensenshannon":  # scipy normalises each row to a distribution
        Xc = sp.csr_matrix(sp.diags(1.0 / _row_sums(Xc)) @ Xc)
        Yc = sp.csr_matrix(sp.diags(1.0 / _row_sums(Yc)) @ Yc)
    Xc, Yc = _canonical(Xc), _canonical(Yc)
    return namm_lookup(Xc, Yc, ring.namm_op, p)


def _canonical(Z: sp.csr_matrix) -> sp.csr_matrix:
    """Z with sorted indices and without stored zeros (a copy where it has any): the union
    kernels' partial sums are over the features a row holds, and a stored zero is held."""
    if Z.nnz and not bool(Z.data.all()):
        Z = Z.copy()
        Z.eliminate_zeros()
    Z.sort_indices()
    return Z


def distances(ring: Any, X: Any, Y: Any, p: float) -> np.ndarray:
    return _expanded(ring, X, Y) if ring.kind == "expanded" else _namm(ring, X, Y, p)



_TOP_K_PARTS = 8  # a batch's top k taken in this many slices (knn_checked)


def nbytes(X: Any) -> int:
    if sp.issparse(X):
        return int(X.data.nbytes + X.indices.nbytes + X.indptr.nbytes)
    return int(np.asarray(X).nbytes)


def working_memory_rows(n_index: int, budget: Any = None, ring: Any = None,
                        index_bytes: int = 0, func: str = "knn") -> int:
    """Query rows per batch so that what a batch holds fits the working-memory budget: its
    ``ring.batch_copies`` arrays of distances (8 bytes × rows × ``n_index`` each) and the
    ``ring.index_copies`` copies of the index (``index_bytes`` each) that it makes.

    Raises
    ------
    ValueError
        If the budget cannot hold one query row beside the index's copies.
    """
    nbytes = config.get_bytes("knn.working-memory", budget)
    copies, index_copies = (1.0, 0.0) if ring is None else (ring.batch_copies,
                                                            ring.index_copies)
    free = nbytes - index_copies * index_bytes
    row = copies * 8 * max(1, n_index)
    if ring is not None and free < row:
        need = working_memory_for(1, n_index, ring, index_bytes)
        raise ValueError(
            f"The working memory of {func} ({nbytes:,} bytes, mgpu.knn.working-memory or "
            f"working_memory=) cannot hold one query's work for metric '{ring.name}' against "
            f"this index: {index_copies:g} cop(ies) of the index ({index_bytes:,} bytes each) "
            f"and {copies:g} row(s) of {n_index:,} distances need {need:,} bytes. Raise it "
            "or split the index into tiles (mgpu.from_scipy).")
    return max(1, int(free // row))


def working_memory_for(rows: int, n_index: int, ring: Any, index_bytes: int) -> int:
    """The working memory that gives CPU kNN batches of ``rows`` queries against an index of
    ``n_index`` rows and ``index_bytes`` bytes (as checked: float64 CSR or dense), for
    metric ``ring``: what :func:`working_memory_rows` divides, the other way round."""
    return math.ceil(ring.index_copies * index_bytes + rows * ring.batch_copies * 8
                     * max(1, n_index))


def top_k(D: np.ndarray, k: int, largest: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The k best entries of each row of D, best first, ties to the lower column index.

    >>> top_k(np.array([[3.0, 1.0, 1.0, 0.5]]), 2)
    (array([[0.5, 1. ]]), array([[3, 1]]))
    """
    key = -D if largest else D
    nr, n = D.shape
    k = min(k, n)
    if k == n or nr == 0:
        order = np.argsort(key, axis=1, kind="stable")
    else:
        # every entry up to the k-th value is a candidate (k of them, more on ties); sort
        # the candidates by (row, value, column) and keep each row's first k
        kth = np.partition(key, k - 1, axis=1)[:, k - 1:k]
        rows, cols = np.nonzero(key <= kth)
        srt = np.lexsort((cols, key[rows, cols], rows))
        starts = np.searchsorted(rows, np.arange(nr))
        take = (starts[:, None] + np.arange(k)[None, :]).ravel()
        order = cols[srt[take]].reshape(nr, k)
    return np.take_along_axis(D, order, axis=1), order


def knn_checked(ring: Any, index: Any, queries: Any, k: int, p: float,
                step: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`knn` on input already checked and converted, ``step`` queries at a time; the
    top k of a batch are taken an eighth of it at a time, so that their sort's copies stay
    small beside the batch's distances."""
    nq = queries.shape[0]
    dist = np.empty((nq, k), dtype=np.float64)
    ids = np.empty((nq, k), dtype=np.int64)
    sub = max(1, -(-step // _TOP_K_PARTS))
    for s in range(0, nq, step):
        D = distances(ring, queries[s:s + step], index, p)
        for r in range(0, D.shape[0], sub):
            e = min(r + sub, D.shape[0])
            dist[s + r:s + e], ids[s + r:s + e] = top_k(D[r:e], k, ring.similarity)
        del D
    return dist, ids


@distances_lookup.register(_HOST)
def _pairwise_cpu(X: Any, Y: Any, ring: Any, p: float) -> np.ndarray:
    return distances(ring, X, Y, p)


@knn_lookup.register(_HOST)
def _knn_cpu(index: Any, queries: Any, k: int, ring: Any, p: float,
             working_memory: Any = None) -> tuple[np.ndarray, np.ndarray]:
    step = working_memory_rows(index.shape[0], working_memory, ring, nbytes(index))
    return knn_checked(ring, index, queries, k, p, step)


@knn_prepare_lookup.register(_HOST)
def _prepare_cpu(tile: Any, ring: Any, p: float) -> Any:
    return tile  # checked and converted is ready


@knn_prepared_lookup.register(_HOST)
def _knn_prepared_cpu(prepared: Any, queries: Any, k: int, ring: Any, p: float,
                      working_memory: Any = None) -> tuple[np.ndarray, np.ndarray]:
    step = working_memory_rows(prepared.shape[0], working_memory, ring, nbytes(prepared))
    return knn_checked(ring, prepared, queries, k, p, step)
