"""Pairwise distances and exact kNN through one semiring table (RAFT's design).

*Expanded* metrics need one dot-product pass (X·Yᵀ on the values, or on a transform of them:
the nonzero pattern, square roots, logarithms), per-row statistics and an element-wise
expansion. *NAMM* metrics ("non-annihilating multiply-monoid") need the full union of the
two rows' nonzeros: they run a merge over both rows. :data:`SEMIRINGS` drives both, and the
error messages and docs are made from it.

Conventions where scipy has none or gives NaN: a zero row is at cosine and correlation
distance 1 from everything (scikit-learn's cosine convention), and two empty rows are at
dice distance 0 (as at jaccard distance 0 in scipy). jaccard, dice and russellrao use the
nonzero pattern (scipy's boolean metrics on ``X != 0``). ``kl_divergence`` is
``Σ rel_entr(x, y)`` (infinite where y is 0 and x is not); ``jensenshannon`` is scipy's
(rows normalised to sum 1, natural logarithm). ``inner_product`` is a similarity: kNN keeps
the largest.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu import config
from mgpu.backends import (
    distances_lookup,
    is_gpu_array,
    knn_lookup,
    knn_prepare_lookup,
    namm_lookup,
)
from mgpu.backends.knn_codes import KNN_CODES
from mgpu.backends.numpy import csr_dot_dense
from mgpu.ops._validate import first_nonfinite, is_dask_array, is_sparse

__all__ = ["SEMIRINGS", "Semiring", "drop_self", "knn", "pairwise_distances", "resolve_metric"]


@dataclass(frozen=True)
class Semiring:
    """One metric: how it is computed and what input it takes."""

    name: str
    kind: str  # "expanded" or "namm"
    aliases: tuple[str, ...] = ()
    nonnegative: bool = False  # refuses negative values
    positive_rows: bool = False  # refuses rows that sum to zero
    similarity: bool = False  # larger is nearer
    # What a kNN batch holds on the CPU at its peak, for the working-memory budget: arrays of
    # the batch's distances, and copies of the index (its values mapped, its CSC form), both
    # measured with tracemalloc (tests/test_memory.py checks the budget holds).
    batch_copies: float = 2.4
    index_copies: float = 1.25

    @property
    def namm_op(self) -> int:
        """The operation code of the union kernels (kernels/knn.cu's KnnOp, the CPU's too)
        for a NAMM metric, from :data:`mgpu.backends.knn_codes.KNN_CODES`; -1 otherwise."""
        return int(KNN_CODES[self.name][0]) if self.kind == "namm" else -1


SEMIRINGS: dict[str, Semiring] = {s.name: s for s in (
    Semiring("euclidean", "expanded", ("l2",)),
    Semiring("sqeuclidean", "expanded"),
    Semiring("cosine", "expanded"),
    Semiring("correlation", "expanded"),
    Semiring("inner_product", "expanded", similarity=True, batch_copies=3.4),
    Semiring("dice", "expanded", batch_copies=5.6, index_copies=2.3),
    Semiring("jaccard", "expanded", batch_copies=5.6, index_copies=2.3),
    Semiring("russellrao", "expanded"),
    Semiring("hellinger", "expanded", nonnegative=True, batch_copies=3.3),
    Semiring("kl_divergence", "expanded", ("kullback_leibler",), nonnegative=True,
             batch_copies=8.6),
    Semiring("manhattan", "namm", ("l1", "cityblock")),
    Semiring("chebyshev", "namm", ("linf", "infinity")),
    Semiring("minkowski", "namm", ("lp",)),
    Semiring("canberra", "namm"),
    Semiring("hamming", "namm"),
    Semiring("jensenshannon", "namm", ("jensen_shannon",), nonnegative=True, positive_rows=True),
)}

_ALIASES: dict[str, str] = {a: s.name for s in SEMIRINGS.values() for a in (s.name, *s.aliases)}


def resolve_metric(metric: Any, p: Any = 2, *, func: str = "pairwise_distances") -> tuple[Semiring, float]:
    """The semiring of a metric name or alias, and the Minkowski ``p`` it runs with.

    >>> resolve_metric("cityblock")[0].name
    'manhattan'
    >>> resolve_metric("minkowski", 1)[0].name, resolve_metric("minkowski", 3)[1]
    ('manhattan', 3.0)
    """
    name = _ALIASES.get(metric) if isinstance(metric, str) else None
    if name is None:
        raise ValueError(
            f"The 'metric' parameter of {func} must be a str among "
            f"{{{', '.join(repr(a) for a in sorted(_ALIASES))}}}. Got {metric!r} instead."
        )
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)) \
            or not p > 0 or math.isnan(p):
        raise ValueError(f"The 'p' parameter of {func} must be a number > 0 (math.inf for "
                         f"chebyshev). Got {p!r} instead.")
    p = float(p)
    if name == "minkowski":
        if p == 1:
            name = "manhattan"
        elif p == 2:
            name = "euclidean"
        elif math.isinf(p):
            name = "chebyshev"
    return SEMIRINGS[name], p


def _check_input(X: Any, name: str, func: str) -> Any:
    """X as float64 CSR (sparse input) or float64 C-ordered array (dense), checked."""
    if is_gpu_array(X):
        raise TypeError(f"The '{name}' parameter of {func} is on the GPU while the other input "
                        "is not: pass both as numpy/scipy or both as cupy/cupyx.")
    if is_dask_array(X):
        raise TypeError(f"The '{name}' parameter of {func} is a dask array: a distributed "
                        "index goes to mgpu.knn, and queries are numpy/scipy.")
    if not (is_sparse(X) or isinstance(X, np.ndarray)):
        raise TypeError(f"The '{name}' parameter of {func} must be a 2-D numpy array or a scipy "
                        f"sparse matrix. Got {type(X).__name__} instead.")
    if X.ndim != 2:
        raise ValueError(f"The '{name}' parameter of {func} must be 2-D. Got shape "
                         f"{tuple(X.shape)} instead.")
    if np.dtype(X.dtype).kind not in "biuf":
        raise TypeError(f"The '{name}' parameter of {func} must hold real numbers. Got "
                        f"{X.dtype}.")
    if is_sparse(X):
        X = sp.csr_matrix(X, dtype=np.float64, copy=True)
        X.sum_duplicates()
    else:
        X = np.ascontiguousarray(X, dtype=np.float64)
    at = first_nonfinite(X)
    if at is not None:
        r, c = at
        raise ValueError(f"The '{name}' parameter of {func} holds NaN or infinity (first at row "
                         f"{r}, column {c}).")
    return X


def _first(X: Any, mask: np.ndarray) -> tuple[int, int]:
    if isinstance(X, np.ndarray):
        r, c = np.argwhere(mask)[0]
        return int(r), int(c)
    p = int(np.flatnonzero(mask)[0])
    return int(np.searchsorted(X.indptr, p, side="right") - 1), int(X.indices[p])


def _check_values(X: Any, name: str, func: str, ring: Semiring) -> None:
    vals = X.data if sp.issparse(X) else X
    if ring.nonnegative and vals.size and vals.min() < 0:
        r, c = _first(X, vals < 0)
        raise ValueError(f"The '{name}' parameter of {func} must be non-negative for metric "
                         f"'{ring.name}'. Got a negative value at row {r}, column {c}.")
    if ring.positive_rows:
        sums = np.asarray(X.sum(axis=1)).ravel()
        if (sums <= 0).any():
            raise ValueError(f"The '{name}' parameter of {func} has rows that sum to 0 (first: "
                             f"row {int(np.flatnonzero(sums <= 0)[0])}); metric '{ring.name}' "
                             "compares distributions and needs every row to have mass.")


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


def _expanded(ring: Semiring, X: Any, Y: Any) -> np.ndarray:
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
    if name in ("cosine", "correlation"):
        dot = _dot(X, Y)
        sx = np.sqrt(_row_sums(_map_values(X, np.square)))
        sy = np.sqrt(_row_sums(_map_values(Y, np.square)))
        if name == "correlation":
            # no features: every row is a zero row (distance 1), and no mean to divide out
            mx, my = (_row_sums(X) / n, _row_sums(Y) / n) if n else (
                np.zeros(X.shape[0]), np.zeros(Y.shape[0]))
            dot -= np.multiply.outer(n * mx, my)
            sx = np.sqrt(np.maximum(sx * sx - n * mx * mx, 0.0))
            sy = np.sqrt(np.maximum(sy * sy - n * my * my, 0.0))
        den = np.multiply.outer(sx, sy)
        with np.errstate(divide="ignore", invalid="ignore"):
            dot /= den
        dot[den <= 0] = 0.0  # a row without length is at distance 1 from every row
        np.subtract(1.0, dot, out=dot)
        return np.clip(dot, 0.0, 2.0, out=dot)
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


def _namm(ring: Semiring, X: Any, Y: Any, p: float) -> np.ndarray:
    """The union metrics through the backend's merge kernel (rows as CSR)."""
    Xc, Yc = sp.csr_matrix(X), sp.csr_matrix(Y)
    if ring.name == "jensenshannon":  # scipy normalises each row to a distribution
        Xc = sp.csr_matrix(sp.diags(1.0 / _row_sums(Xc)) @ Xc)
        Yc = sp.csr_matrix(sp.diags(1.0 / _row_sums(Yc)) @ Yc)
    for Z in (Xc, Yc):
        Z.sort_indices()
    return namm_lookup(Xc, Yc, ring.namm_op, p)


def _distances(ring: Semiring, X: Any, Y: Any, p: float) -> np.ndarray:
    return _expanded(ring, X, Y) if ring.kind == "expanded" else _namm(ring, X, Y, p)


def _checked_pair(X: Any, Y: Any, ring: Semiring, func: str, names: tuple[str, str]) -> tuple[Any, Any]:
    X = _check_input(X, names[0], func)
    Y = X if Y is None else _check_input(Y, names[1], func)
    if X.shape[1] != Y.shape[1]:
        raise ValueError(f"The '{names[0]}' and '{names[1]}' parameters of {func} must have the "
                         f"same number of columns. Got {X.shape[1]} and {Y.shape[1]}.")
    _check_values(X, names[0], func, ring)
    if Y is not X:
        _check_values(Y, names[1], func, ring)
    return X, Y


def pairwise_distances(X: Any, Y: Any = None, *, metric: str = "euclidean",
                       p: float = 2) -> np.ndarray:
    """Distances between the rows of X and the rows of Y (or of X).

    Parameters
    ----------
    X : {ndarray, sparse matrix} of shape (n_samples_X, n_features)
    Y : {ndarray, sparse matrix} of shape (n_samples_Y, n_features), optional
    metric : str, default='euclidean'
        A name or alias from :data:`SEMIRINGS` (scipy/scikit-learn names).
    p : float, default=2
        Minkowski's exponent (``metric='minkowski'``).

    Returns
    -------
    D : ndarray of shape (n_samples_X, n_samples_Y), float64

    Raises
    ------
    ValueError
        Unknown metric, ``p <= 0``, different numbers of columns, NaN/inf, negative values
        for hellinger/KL/Jensen-Shannon, rows without mass for Jensen-Shannon.

    Examples
    --------
    >>> import numpy as np
    >>> pairwise_distances(np.array([[0.0, 3.0], [4.0, 0.0]]), metric="euclidean")
    array([[0., 5.],
           [5., 0.]])
    """
    ring, p = resolve_metric(metric, p)
    return distances_lookup(X, Y, ring, p)


@distances_lookup.register(object)
def _pairwise_cpu(X: Any, Y: Any, ring: Semiring, p: float) -> np.ndarray:
    X, Y = _checked_pair(X, Y, ring, "pairwise_distances", ("X", "Y"))
    return _distances(ring, X, Y, p)


_TOP_K_PARTS = 8  # a batch's top k taken in this many slices (knn_checked)


def _nbytes(X: Any) -> int:
    if sp.issparse(X):
        return int(X.data.nbytes + X.indices.nbytes + X.indptr.nbytes)
    return int(np.asarray(X).nbytes)


def working_memory_rows(n_index: int, budget: Any = None, ring: Semiring | None = None,
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


def working_memory_for(rows: int, n_index: int, ring: Semiring, index_bytes: int) -> int:
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


def knn(index: Any, queries: Any, k: int, *, metric: str = "euclidean", p: float = 2,
        working_memory: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest rows of ``index`` for every row of ``queries``, exact, in batches.

    No step holds more than ``working_memory`` (default ``mgpu.knn.working-memory``) beyond
    the inputs: on the CPU a batch's distances and the metric's copies of the index, as the
    semiring table counts them (``batch_copies``, ``index_copies``); on the GPU a batch's
    distances. Ties go to the lower index, so the ids equal scikit-learn's brute force.

    Parameters
    ----------
    index : {ndarray, sparse matrix} of shape (n_index, n_features)
    queries : {ndarray, sparse matrix} of shape (n_queries, n_features)
    k : int
        Neighbours per query, 1 <= k <= n_index.
    metric, p
        As :func:`pairwise_distances`; for ``inner_product`` the largest are kept.
    working_memory : str or int, optional
        Bytes a batch may hold ("256 MiB").

    Returns
    -------
    distances : ndarray of shape (n_queries, k), float64, best first
    indices : ndarray of shape (n_queries, k), int64

    Raises
    ------
    ValueError
        As :func:`pairwise_distances`; k outside [1, n_index]; a working memory that cannot
        hold one query's work (the message gives the bytes needed).

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[0.0, 0.0], [1.0, 0.0], [5.0, 5.0]])
    >>> d, i = knn(X, np.array([[0.9, 0.0]]), 2)
    >>> i.tolist(), np.round(d, 3).tolist()
    ([[1, 0]], [[0.1, 0.9]])
    """
    ring, p = resolve_metric(metric, p, func="knn")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        n = getattr(index, "shape", ("?",))[0]
        raise ValueError(f"The 'k' parameter of knn must be an int in [1, {n}]. Got {k!r} "
                         "instead.")
    return knn_lookup(index, queries, int(k), ring, p, working_memory)


@knn_lookup.register(object)
def _knn_cpu(index: Any, queries: Any, k: int, ring: Semiring, p: float,
             working_memory: Any = None) -> tuple[np.ndarray, np.ndarray]:
    index, queries = _checked_pair(index, queries, ring, "knn", ("index", "queries"))
    n = index.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"The 'k' parameter of knn must be an int in [1, {n}] (the index has "
                         f"{n} rows). Got {k!r} instead.")
    step = working_memory_rows(n, working_memory, ring, _nbytes(index))
    return knn_checked(ring, index, queries, k, p, step)


def knn_checked(ring: Semiring, index: Any, queries: Any, k: int, p: float,
                step: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`knn` on input already checked and converted, ``step`` queries at a time; the
    top k of a batch are taken an eighth of it at a time, so that their sort's copies stay
    small beside the batch's distances."""
    nq = queries.shape[0]
    dist = np.empty((nq, k), dtype=np.float64)
    ids = np.empty((nq, k), dtype=np.int64)
    sub = max(1, -(-step // _TOP_K_PARTS))
    for s in range(0, nq, step):
        D = _distances(ring, queries[s:s + step], index, p)
        for r in range(0, D.shape[0], sub):
            e = min(r + sub, D.shape[0])
            dist[s + r:s + e], ids[s + r:s + e] = top_k(D[r:e], k, ring.similarity)
        del D
    return dist, ids


def prepare_index(tile: Any, ring: Semiring, p: float) -> Any:
    """An index (tile) checked and made ready for repeated queries: float64 CSR or dense on
    the CPU, an index prepared on its device for CuPy data."""
    return knn_prepare_lookup(tile, ring, p)


@knn_prepare_lookup.register(object)
def _prepare_cpu(tile: Any, ring: Semiring, p: float) -> Any:
    tile = _check_input(tile, "index", "knn")
    _check_values(tile, "index", "knn", ring)
    return tile


def knn_prepared(prepared: Any, queries: Any, k: int, ring: Semiring, p: float,
                 working_memory: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """kNN of checked host queries against :func:`prepare_index`'s result, on its device;
    numpy results (k capped at the index's rows)."""
    k = min(k, prepared.shape[0])
    if hasattr(prepared, "knn"):  # prepared on a GPU
        d, i = prepared.knn(queries, k, ring, working_memory)
        return d.get(), i.get()
    step = working_memory_rows(prepared.shape[0], working_memory, ring, _nbytes(prepared))
    return knn_checked(ring, prepared, queries, k, p, step)


def drop_self(dist: np.ndarray, ind: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """From k+1 neighbours of the index's own rows, the k that are not the row itself.

    As scikit-learn does it: drop each row's own id, or the last neighbour where the row
    is absent (an exact duplicate with a lower id took its place).

    >>> drop_self(np.array([[0.0, 0.0, 1.0]]), np.array([[1, 0, 2]]), 2)[1].tolist()
    [[1, 2]]
    """
    xp = np
    if is_gpu_array(ind):
        import cupy as xp
    own = ind == xp.arange(ind.shape[0])[:, None]
    own[~own.any(axis=1), -1] = True
    keep = ~own
    return dist[keep].reshape(ind.shape[0], k), ind[keep].reshape(ind.shape[0], k)
