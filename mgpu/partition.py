"""nnz prefix-sum splits of sparse matrices: rows, columns and 2-D grids, and splits of
rows by their work in a product (:func:`spgemm_split`).

A split cuts a sequence of non-negative counts (the nnz of each row or column, or each row's
work) into ``P`` contiguous parts. mgpu's splits are *balanced in nonzeros* (or work), not in
rows or columns: the cuSDDMM paper found that an even column cut of NYTimes put 91% of the
nonzeros on one of two GPUs.

The split chosen here is, among all contiguous splits,

1. one whose largest part is as small as possible (the bottleneck optimum ``B*``), and
2. among those, one whose smallest part is at least ``B* - w``, where ``w`` is the largest
   single count, so that **any two parts differ by at most the largest row/column**.

Both are found exactly with prefix sums and binary searches (``O(P log n)`` per probe), so a
split of a matrix with billions of nonzeros costs milliseconds.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.sparse as sp

logger = logging.getLogger(__name__)

__all__ = [
    "Grid",
    "axis_counts",
    "grid",
    "imbalance",
    "part_sums",
    "spgemm_row_work",
    "spgemm_split",
    "split",
    "split_counts",
]


def _validate_parts(parts: int) -> int:
    if isinstance(parts, bool) or not isinstance(parts, (int, np.integer)):
        raise TypeError(f"The 'parts' parameter must be an int >= 1. Got {parts!r} instead.")
    if parts < 1:
        raise ValueError(f"The 'parts' parameter must be an int >= 1. Got {parts} instead.")
    return int(parts)


def _prefix(counts: np.ndarray) -> np.ndarray:
    c = np.empty(counts.size + 1, dtype=np.int64)
    c[0] = 0
    np.cumsum(counts, out=c[1:])
    return c


def _greedy_fits(c: np.ndarray, parts: int, cap: int) -> bool:
    """Whether ``parts`` parts of at most ``cap`` each, filled greedily, cover everything."""
    pos = 0
    n = c.size - 1
    for _ in range(parts):
        pos = int(np.searchsorted(c, c[pos] + cap, side="right")) - 1
        if pos >= n:
            return True
    return False


def _reachable(c: np.ndarray, parts: int, lo: int, hi: int) -> list[tuple[int, int]] | None:
    """Index intervals of the prefix positions reachable after k parts with sums in [lo, hi].

    Exact as long as ``hi - lo`` is at least the largest count: then the windows of two
    neighbouring start positions touch, so the reachable set after each part is an interval.
    Returns None when position ``n`` is not reachable after exactly ``parts`` parts.
    """
    n = c.size - 1
    total = int(c[-1])
    p = q = 0
    out = [(0, 0)]
    for _ in range(parts):
        # Start positions whose window still lies inside the matrix.
        q = min(q, int(np.searchsorted(c, total - lo, side="right")) - 1)
        if q < p:
            return None
        p, q = (
            int(np.searchsorted(c, c[p] + lo, side="left")),
            int(np.searchsorted(c, c[q] + hi, side="right")) - 1,
        )
        if p > q:
            return None
        out.append((p, q))
    return out if p <= n <= q else None


def split_counts(counts: np.ndarray, parts: int) -> np.ndarray:
    """Cut non-negative counts into ``parts`` contiguous parts balanced by their sums.

    Parameters
    ----------
    counts : array-like of int of shape (n,)
        Non-negative weights, usually the nnz of each row or column.
    parts : int
        Number of parts ``P``; may exceed ``n`` or the number of nonzero counts, in which
        case some parts are empty.

    Returns
    -------
    bounds : ndarray of int64 of shape (parts + 1,)
        ``bounds[0] == 0``, ``bounds[-1] == n``, non-decreasing; part ``i`` holds
        ``counts[bounds[i]:bounds[i + 1]]``. The largest part sum is the smallest possible,
        and any two part sums differ by at most ``max(counts)``.

    Raises
    ------
    ValueError
        If ``counts`` is not one-dimensional, holds negative or non-finite values, or
        ``parts < 1``.

    Examples
    --------
    >>> split_counts([5, 5, 1], 3)
    array([0, 1, 2, 3])
    >>> split_counts([1] * 10, 3)
    array([ 0,  3,  7, 10])
    """
    parts = _validate_parts(parts)
    a = np.asarray(counts)
    if a.ndim != 1:
        raise ValueError(f"The 'counts' parameter must be one-dimensional. Got shape {a.shape}.")
    if a.dtype.kind == "f":
        if not np.all(np.isfinite(a)) or np.any(a != np.floor(a)):
            raise ValueError("The 'counts' parameter must hold whole, finite numbers.")
    elif a.dtype.kind not in "iub":
        raise ValueError(f"The 'counts' parameter must be integer. Got dtype {a.dtype}.")
    a = a.astype(np.int64, copy=False)
    if a.size and a.min() < 0:
        raise ValueError(
            f"The 'counts' parameter must be non-negative. Got a minimum of {a.min()}."
        )
    n = a.size
    c = _prefix(a)
    total = int(c[-1])
    if total == 0:
        # Nothing to balance: spread the (empty) rows evenly over the parts.
        return np.linspace(0, n, parts + 1).round().astype(np.int64)
    if parts == 1:
        return np.array([0, n], dtype=np.int64)
    w = int(a.max())
    mean_ceil = -(-total // parts)
    # Bottleneck optimum: the smallest cap for which P greedy parts cover everything.
    lo_cap, hi_cap = max(mean_ceil, w), max(mean_ceil, w) + w
    while lo_cap < hi_cap:
        mid = (lo_cap + hi_cap) // 2
        if _greedy_fits(c, parts, mid):
            hi_cap = mid
        else:
            lo_cap = mid + 1
    best = lo_cap
    # Largest floor (at most best - w) that still admits a split; best - w has held on every
    # case we have tried, the search is there so that a counter-example still gets a split.
    lo_floor, hi_floor = 0, max(0, best - w)
    reach = _reachable(c, parts, hi_floor, best)
    if reach is None:
        logger.debug("split_counts: floor %d infeasible for cap %d, searching", hi_floor, best)
        while lo_floor < hi_floor:
            mid = (lo_floor + hi_floor + 1) // 2
            if _reachable(c, parts, mid, best) is not None:
                lo_floor = mid
            else:
                hi_floor = mid - 1
        reach = _reachable(c, parts, lo_floor, best)
        floor = lo_floor
    else:
        floor = hi_floor
    assert reach is not None  # floor 0 with the optimal cap is always feasible
    # Walk back from the end, choosing at each cut the reachable position nearest the ideal
    # k * total / P prefix, so parts stay close to the mean inside the [floor, best] band.
    bounds = np.empty(parts + 1, dtype=np.int64)
    bounds[parts] = n
    j = n
    for k in range(parts - 1, 0, -1):
        p, q = reach[k]
        first = max(p, int(np.searchsorted(c, c[j] - best, side="left")))
        last = min(q, int(np.searchsorted(c, c[j] - floor, side="right")) - 1)
        target = k * total / parts
        i = int(np.searchsorted(c[first : last + 1], target, side="left")) + first
        if i > last or (i > first and target - c[i - 1] <= c[i] - target):
            i -= 1
        i = min(max(i, first), last)
        bounds[k] = i
        j = i
    bounds[0] = 0
    return bounds


def axis_counts(S: sp.spmatrix | sp.sparray, axis: int) -> np.ndarray:
    """nnz of each row (``axis=0``) or column (``axis=1``) of a sparse matrix, as int64.

    Explicitly stored zeros count: they cost the same memory and work as any nonzero.
    """
    if axis not in (0, 1):
        raise ValueError(f"The 'axis' parameter must be 0 (rows) or 1 (columns). Got {axis!r}.")
    if not sp.issparse(S):
        raise TypeError(
            f"Expected a scipy sparse matrix, got {type(S).__name__}; convert with "
            "scipy.sparse.csr_matrix(X)."
        )
    fmt = S.format
    if (fmt == "csr" and axis == 0) or (fmt == "csc" and axis == 1):
        return np.diff(S.indptr).astype(np.int64, copy=False)
    if fmt in ("csr", "csc"):
        return np.bincount(S.indices, minlength=S.shape[axis]).astype(np.int64, copy=False)
    coo = S.tocoo()
    idx = coo.row if axis == 0 else coo.col
    return np.bincount(idx, minlength=S.shape[axis]).astype(np.int64, copy=False)


def split(S: sp.spmatrix | sp.sparray, parts: int, *, axis: Literal[0, 1] = 0) -> np.ndarray:
    """Row (``axis=0``) or column (``axis=1``) boundaries of ``parts`` nnz-balanced slabs.

    Parameters
    ----------
    S : sparse matrix of shape (n_rows, n_cols)
        Any scipy sparse format; CSR (rows) and CSC (columns) need no conversion.
    parts : int
        Number of slabs.
    axis : {0, 1}, default=0
        0 cuts rows, 1 cuts columns.

    Returns
    -------
    bounds : ndarray of int64 of shape (parts + 1,)
        Slab ``i`` is ``S[bounds[i]:bounds[i+1]]`` (rows) or ``S[:, bounds[i]:bounds[i+1]]``.

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> S = sp.csr_matrix([[1, 1, 1, 1], [0, 1, 0, 0], [1, 0, 0, 1], [1, 1, 0, 0]])
    >>> split(S, 2)
    array([0, 1, 4])
    """
    return split_counts(axis_counts(S, axis), parts)


def spgemm_row_work(A: sp.spmatrix | sp.sparray, B: sp.spmatrix | sp.sparray) -> np.ndarray:
    """Each row's work in the product ``A @ B``: its intermediate products, the sum over the
    stored entries ``A[i, k]`` of row i of the length of row k of B (int64).

    A row's cost in a row-by-row product (Gustavson's, or the GPU's merge path over the
    intermediate products), where its nnz is not: one entry of A that meets a long row of B
    costs as much as that row. Stored zeros count, as in :func:`axis_counts`.

    Parameters
    ----------
    A : sparse matrix of shape (n_rows, n_inner)
    B : sparse matrix of shape (n_inner, n_cols)
        scipy sparse matrices, any format (CSR A and B need no conversion).

    Returns
    -------
    work : ndarray of int64 of shape (n_rows,)

    Raises
    ------
    TypeError
        A or B is not a scipy sparse matrix.
    ValueError
        A's columns are not B's rows.

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> A = sp.csr_matrix([[1, 1, 0], [0, 0, 1]])
    >>> B = sp.csr_matrix([[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 1]])
    >>> spgemm_row_work(A, B)
    array([5, 1])
    """
    for name, X in (("A", A), ("B", B)):
        if not sp.issparse(X):
            raise TypeError(f"The '{name}' parameter of spgemm_row_work must be a scipy sparse "
                            f"matrix. Got {type(X).__name__} instead.")
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"The 'B' parameter of spgemm_row_work must have A.shape[1] = "
                         f"{A.shape[1]} rows. Got shape {tuple(B.shape)} instead.")
    A = A.tocsr()
    # the products of each stored entry of A, summed row by row through one prefix sum (no
    # reduceat, which misreads empty rows)
    c = _prefix(axis_counts(B, 0)[A.indices])
    indptr = np.asarray(A.indptr, dtype=np.int64)
    return c[indptr[1:]] - c[indptr[:-1]]


def spgemm_split(A: sp.spmatrix | sp.sparray, B: sp.spmatrix | sp.sparray,
                 parts: int) -> np.ndarray:
    """Row boundaries of ``parts`` tiles of A balanced by their work in ``A @ B``
    (:func:`spgemm_row_work`), not by their nnz: :func:`split_counts` of the rows' work.

    Returns
    -------
    bounds : ndarray of int64 of shape (parts + 1,)
        Tile ``i`` is ``A[bounds[i]:bounds[i+1]]``; a tile may be empty where one row's work
        outweighs a part's share.

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> A = sp.csr_matrix([[1, 0], [1, 0], [0, 1], [0, 1]])
    >>> B = sp.csr_matrix([[1, 0, 0], [1, 1, 1]])  # row 1 of B is three times row 0
    >>> split(A, 2), spgemm_split(A, B, 2)
    (array([0, 2, 4]), array([0, 3, 4]))
    """
    return split_counts(spgemm_row_work(A, B), parts)


def part_sums(counts: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Sum of ``counts`` in each part given by ``bounds`` (int64)."""
    c = _prefix(np.asarray(counts, dtype=np.int64))
    b = np.asarray(bounds, dtype=np.int64)
    return c[b[1:]] - c[b[:-1]]


def imbalance(part_nnz: np.ndarray) -> float:
    """Load imbalance of a split: largest part over the mean part (1.0 is perfect).

    An empty matrix (all parts zero) has imbalance 1.0.
    """
    a = np.asarray(part_nnz, dtype=np.float64)
    if a.size == 0:
        raise ValueError("imbalance of zero parts is undefined")
    mean = a.mean()
    return 1.0 if mean == 0 else float(a.max() / mean)


@dataclass(frozen=True)
class Grid:
    """A 2-D block grid: row strata × column strata, each cut at nnz prefix sums.

    Attributes
    ----------
    row_bounds : ndarray of int64 of shape (row_parts + 1,)
    col_bounds : ndarray of int64 of shape (col_parts + 1,)
    nnz : ndarray of int64 of shape (row_parts, col_parts)
        Nonzeros in each block.
    """

    row_bounds: np.ndarray
    col_bounds: np.ndarray
    nnz: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.nnz.shape  # type: ignore[return-value]

    def block(self, i: int, j: int) -> tuple[slice, slice]:
        """Row and column slices of block ``(i, j)``."""
        rb, cb = self.row_bounds, self.col_bounds
        return slice(int(rb[i]), int(rb[i + 1])), slice(int(cb[j]), int(cb[j + 1]))


def grid(S: sp.spmatrix | sp.sparray, row_parts: int, col_parts: int) -> Grid:
    """Cut a sparse matrix into ``row_parts × col_parts`` blocks for block algorithms.

    Row strata are balanced by row nnz and column strata by column nnz (each exactly as
    :func:`split`); the nnz of every block is counted without materialising the blocks.

    Parameters
    ----------
    S : sparse matrix of shape (n_rows, n_cols)
    row_parts, col_parts : int
        Number of row and column strata.

    Returns
    -------
    Grid

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> g = grid(sp.identity(6, format="csr"), 2, 3)
    >>> g.nnz
    array([[2, 1, 0],
           [0, 1, 2]])
    """
    rb = split(S, row_parts, axis=0)
    cb = split(S, col_parts, axis=1)
    coo = S.tocoo()
    ri = np.searchsorted(rb, coo.row, side="right") - 1
    ci = np.searchsorted(cb, coo.col, side="right") - 1
    nnz = np.bincount(ri * len(cb[:-1]) + ci, minlength=(len(rb) - 1) * (len(cb) - 1))
    return Grid(rb, cb, nnz.reshape(len(rb) - 1, len(cb) - 1).astype(np.int64))
