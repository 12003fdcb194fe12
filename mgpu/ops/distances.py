"""Pairwise distances and exact kNN through one semiring table (RAFT's design).

Every metric's definition, the input it takes, its convention where scipy gives NaN and how
it differs from scipy/scikit-learn are on one page: ``docs/metrics.md``.

*Expanded* metrics need one dot-product pass (X·Yᵀ on the values, or on a transform of them:
the nonzero pattern, square roots, logarithms), per-row statistics and an element-wise
expansion; correlation's pass is over centred rows (never ``Σxy - n·mx·my``, which cancels).
*NAMM* metrics ("non-annihilating multiply-monoid") need the full union of the two rows'
nonzeros: they sum their term over the union without subtracting anything, symmetric in the
two rows to the last bit. :data:`SEMIRINGS` drives both, and the error messages and docs are
made from it.

Conventions where scipy has none or gives NaN: a zero row is at cosine distance 1 from
everything, and a zero-variance row (constant, decided exactly; a zero row) at correlation
distance 1 (scikit-learn's cosine convention); two empty rows are at dice distance 0 (as at
jaccard distance 0 in scipy). jaccard, dice and russellrao use the nonzero pattern (scipy's
boolean metrics on ``X != 0``). ``hellinger`` is ``sqrt(max(1 - Σ√(xy), 0))`` and
``kl_divergence`` is ``Σ rel_entr(x, y)`` (infinite where y is 0 and x is not), both on rows
as given: normalise them to sum 1 first (``sklearn.preprocessing.normalize(X, norm="l1")``;
the page has the CuPy recipe). ``jensenshannon`` is scipy's (rows normalised to sum 1,
natural logarithm). ``inner_product`` is a similarity: kNN keeps the largest.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import numpy as np

from mgpu.backends import (
    array_module,
    distances_lookup,
    is_gpu_array,
    is_sparse,
    knn_input_lookup,
    knn_lookup,
    knn_prepare_lookup,
    knn_prepared_lookup,
    place_of,
    to_host,
)
from mgpu.backends.knn_codes import KNN_CODES
# The CPU computation lives in the backends layer; these names are part of this module's API.
from mgpu.backends.numpy_knn import knn_checked, top_k, working_memory_for, working_memory_rows
from mgpu.ops.routes import route
from mgpu.ops.validation import (Bytes, Interval, StrOptions, check_array, check_param,
                                 is_dask_array)

__all__ = ["SEMIRINGS", "Semiring", "check_knn_input", "check_knn_pair", "check_knn_values",
           "drop_self", "knn", "knn_checked", "knn_prepared", "pairwise_distances",
           "prepare_index", "resolve_metric", "top_k", "working_memory_for",
           "working_memory_rows"]


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
    check_param(metric, "metric", func, StrOptions(_ALIASES))
    check_param(p, "p", func, Interval(Real, 0, None, closed="neither"),
                " (math.inf for chebyshev)")
    name = _ALIASES[metric]
    p = float(p)
    if name == "minkowski":
        if p == 1:
            name = "manhattan"
        elif p == 2:
            name = "euclidean"
        elif math.isinf(p):
            name = "chebyshev"
    return SEMIRINGS[name], p


# ---------------------------------------------------------------------------- input checks
# One check for the CPU and the GPU: kinds and shapes here, the conversion to what the
# kernels of the device take by the backend (knn_input_lookup), then the values.


def check_knn_input(X: Any, name: str, func: str, on: Any = None, *,
                    min_samples: int = 0, min_features: int = 0) -> Any:
    """X checked and converted for the device of ``on`` (the data that chooses it; the host
    when None): float64 CSR with summed duplicates or a float64 C-ordered array on the CPU;
    float32/float64 canonical CSR without stored zeros, or a C-ordered array, on the GPU
    (host data moved there). Refuses what is not a real 2-D matrix (complex values with a
    :class:`~mgpu.ops.validation.ComplexDataError`, a ValueError too), data on the GPU for
    the host, fewer than ``min_samples`` rows or ``min_features`` columns (scikit-learn's
    estimators ask for 1 of each; :func:`knn` and :func:`pairwise_distances` take none, and
    give empty results or the distances of a space without dimensions), and NaN or
    infinity; a numpy array of numbers stored as objects is converted to float64, as
    scikit-learn's ``check_array`` does."""
    # the device is the data's, as the lookups choose it; this only words the refusals
    on_gpu = is_gpu_array(on)
    if is_gpu_array(X) and not on_gpu:
        raise TypeError(f"The '{name}' parameter of {func} is on the GPU while the other input "
                        "is not: pass both as numpy/scipy or both as cupy/cupyx.")
    if is_dask_array(X):
        raise TypeError(f"The '{name}' parameter of {func} is a dask array, and {func} here "
                        "runs on one device: pass dask arrays to mgpu.knn, "
                        "mgpu.pairwise_distances or mgpu.NearestNeighbors.")
    if isinstance(X, np.ndarray) and X.dtype == object:
        X = _object_to_float(X, name, func)
    # host data goes to the GPU when the other input is there, never the other way
    check_array(X, name, func, devices=("cpu", "gpu") if on_gpu else ("cpu",))
    n, m = X.shape
    if n < min_samples or m < min_features:
        # scikit-learn's words (its estimator checks match them) after mgpu's
        what, least = (f"{n} sample(s)", min_samples) if n < min_samples else \
            (f"{m} feature(s)", min_features)
        raise ValueError(f"The '{name}' parameter of {func} must have at least {min_samples} "
                         f"row(s) and {min_features} column(s). Found array with {what} "
                         f"(shape={(n, m)}) while a minimum of {least} is required.")
    # the values are scanned as the kernels will read them (after the conversion)
    return check_array(knn_input_lookup(on, X), name, func, ensure_all_finite=True)


def _object_to_float(X: np.ndarray, name: str, func: str) -> np.ndarray:
    """A numpy object array as float64, or its refusal (numpy's own reason kept)."""
    try:
        return X.astype(np.float64)
    except (TypeError, ValueError) as e:
        raise type(e)(f"The '{name}' parameter of {func} must hold real numbers; its values "
                      f"(dtype object) do not convert to float: {e}.") from None


def check_knn_values(X: Any, name: str, func: str, ring: Semiring) -> None:
    """Refuse the values ``ring`` does not take in a checked X (:func:`check_knn_input`):
    negative ones, rows without mass."""
    vals = X.data if is_sparse(X) else X
    if ring.nonnegative and vals.size and bool(vals.min() < 0):
        r, c = place_of(X, int((vals < 0).ravel().argmax()))
        # "Negative values in data": scikit-learn's words for a positive-only estimator
        raise ValueError(f"The '{name}' parameter of {func} must be non-negative for metric "
                         f"'{ring.name}'. Got a negative value at row {r}, column {c}. "
                         f"Negative values in data are not defined for '{ring.name}', which "
                         "compares nonnegative vectors (counts, frequencies): use another "
                         "metric for signed data.")
    if ring.positive_rows:
        empty = array_module(X).asarray(X.sum(axis=1)).ravel() <= 0
        if bool(empty.any()):
            raise ValueError(f"The '{name}' parameter of {func} has rows that sum to 0 (first: "
                             f"row {int(empty.argmax())}); metric '{ring.name}' "
                             "compares distributions and needs every row to have mass.")


def check_knn_pair(X: Any, Y: Any, ring: Semiring, func: str, names: tuple[str, str], *,
                   min_samples: int = 0, min_features: int = 0) -> tuple[Any, Any]:
    """X and Y (X itself when None) checked for ``ring`` on X's device, with as many columns;
    kinds, sizes and finiteness of both first, then their values."""
    least = {"min_samples": min_samples, "min_features": min_features}
    X = check_knn_input(X, names[0], func, on=X, **least)
    Y = X if Y is None else check_knn_input(Y, names[1], func, on=X, **least)
    if X.shape[1] != Y.shape[1]:
        raise ValueError(f"The '{names[0]}' and '{names[1]}' parameters of {func} must have the "
                         f"same number of columns. Got {X.shape[1]} and {Y.shape[1]}.")
    check_knn_values(X, names[0], func, ring)
    if Y is not X:
        check_knn_values(Y, names[1], func, ring)
    return X, Y


def pairwise_distances(X: Any, Y: Any = None, *, metric: str = "euclidean",
                       p: float = 2) -> np.ndarray:
    """Distances between the rows of X and the rows of Y (or of X).

    Parameters
    ----------
    X : {ndarray, sparse matrix, dask array} of shape (n_samples_X, n_features)
    Y : {ndarray, sparse matrix, dask array} of shape (n_samples_Y, n_features), optional
        With a dask array among them, D is a lazy dask array: one task per row chunk of X
        against all of Y (a dask Y is gathered into one chunk), the values checked there.
    metric : str, default='euclidean'
        A name or alias from :data:`SEMIRINGS` (scipy/scikit-learn names); definitions and
        conventions in docs/metrics.md. hellinger and kl_divergence take rows as given:
        normalise them to sum 1 first (``sklearn.preprocessing.normalize(X, norm="l1")``).
    p : float, default=2
        Minkowski's exponent (``metric='minkowski'``).

    Returns
    -------
    D : ndarray or dask array of shape (n_samples_X, n_samples_Y), float64

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
    if is_dask_array(X) or is_dask_array(Y):  # a lazy dask array, from mgpu.distributed
        return route("pairwise_distances")(X, Y, metric=metric, p=p)
    ring, p = resolve_metric(metric, p)
    X, Y = check_knn_pair(X, Y, ring, "pairwise_distances", ("X", "Y"))
    return distances_lookup(X, Y, ring, p)


def knn(index: Any, queries: Any, k: int, *, metric: str = "euclidean", p: float = 2,
        working_memory: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest rows of ``index`` for every row of ``queries``, exact, in batches.

    No step holds more than ``working_memory`` (default ``mgpu.knn.working-memory``) beyond
    the inputs: on the CPU a batch's distances and the metric's copies of the index, as the
    semiring table counts them (``batch_copies``, ``index_copies``); on the GPU a batch's
    distances. Among equal distances the lower row of the index comes first (and is the one
    kept at the k-th place), on the CPU and the GPU alike. scikit-learn's brute force does
    not order ties by index (its order among them comes from ``argpartition`` and an
    unstable sort), so where distances tie, mgpu's ids can differ from scikit-learn's; the
    distances agree.

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
    check_param(working_memory, "working_memory", "knn", [Bytes(), None])
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        n = getattr(index, "shape", ("?",))[0]
        raise ValueError(f"The 'k' parameter of knn must be an int in [1, {n}]. Got {k!r} "
                         "instead.")
    index, queries = check_knn_pair(index, queries, ring, "knn", ("index", "queries"))
    n = index.shape[0]
    check_param(k, "k", "knn", Interval(Integral, 1, n), f" (the index has {n} rows)")
    return knn_lookup(index, queries, int(k), ring, p, working_memory)


def prepare_index(tile: Any, ring: Semiring, p: float) -> Any:
    """An index (tile) checked and made ready for repeated queries: float64 CSR or dense on
    the CPU, an index prepared on its device for CuPy data."""
    tile = check_knn_input(tile, "index", "knn", on=tile)
    check_knn_values(tile, "index", "knn", ring)
    return knn_prepare_lookup(tile, ring, p)


def knn_prepared(prepared: Any, queries: Any, k: int, ring: Semiring, p: float,
                 working_memory: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """kNN of checked host queries against :func:`prepare_index`'s result, on its device;
    numpy results (k capped at the index's rows)."""
    k = min(k, prepared.shape[0])
    d, i = knn_prepared_lookup(prepared, queries, k, ring, p, working_memory)
    return to_host(d), to_host(i)


def drop_self(dist: np.ndarray, ind: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """From k+1 neighbours of the index's own rows, the k nearest that are not the row itself.

    Each row's own id is dropped. A row can be missing from its own k+1 neighbours: k+1 or
    more exact duplicates tie with it at distance 0 and come first by their lower ids, or,
    under a metric where a row need not be its own nearest (``inner_product``, hellinger
    and kl_divergence on rows that do not sum to 1), k+1 rows are nearer or tie ahead of
    it. Then the last (farthest) neighbour is dropped, so the result is always the k
    nearest other rows.

    scikit-learn's ``kneighbors(X=None)`` also drops each row's own id, but where the row is
    missing it drops the *first* neighbour (``sklearn/neighbors/_base.py``: "mask the first
    duplicate"). With duplicates the distances agree (all 0) and the ids can differ; they
    can differ anyway among tied distances, which scikit-learn does not order by index.

    >>> drop_self(np.array([[0.0, 0.0, 1.0]]), np.array([[1, 0, 2]]), 2)[1].tolist()
    [[1, 2]]
    >>> # inner products: row 0 is not among its 3 nearest, and the farthest of them goes
    >>> # (scikit-learn would keep [[1, 3]])
    >>> drop_self(np.array([[9.0, 8.0, 7.0]]), np.array([[2, 1, 3]]), 2)[1].tolist()
    [[2, 1]]
    """
    xp = array_module(ind)
    own = ind == xp.arange(ind.shape[0])[:, None]
    own[~own.any(axis=1), -1] = True
    keep = ~own
    return dist[keep].reshape(ind.shape[0], k), ind[keep].reshape(ind.shape[0], k)
