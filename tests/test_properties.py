"""Hostile input, property-based: every local public op against a float64 dense reference on
small random sparse matrices that are empty, have empty rows or columns, one nonzero,
duplicate entries left unsummed, unsorted column indices, int32 or int64 index arrays,
values from 1e-31 to 1e31 in magnitude, explicit zeros, and NaN or infinity.

Each property decides from the input alone whether the op must compute or must refuse, and
then checks that it did exactly that: the result within a tolerance of the reference, or the
documented ValueError whose message names the operand and the problem.

Tolerances are forward error bounds of the computation each op documents, in float64
(``EPS``) with a constant ``C`` per term, plus the rounding of the output dtype:

- sums of products (SpMV, SpMM, SDDMM, inner products, row norms): ``C·(terms+2)·EPS`` times
  the same sum taken over absolute values (the standard bound of a dot product);
- expanded distances (``|x|² + |y|² - 2x·y`` and the like) lose what cancels:
  ``C·EPS·(|x|² + |y|²)`` for squared euclidean, its square root for euclidean (and for
  hellinger, whose ``1 - Σ√(xy)`` cancels too); cosine and correlation relative to the norms
  they divide by;
- union (NAMM) distances over dense rows subtract the terms of the shared columns from the
  sum over x's row: ``C·EPS`` times that sum.

Duplicates are summed by scipy's ``sum_duplicates`` (what every op that sums them documents),
so the reference sums them the same way and matches bit for bit; only SpMV/SpMM sum them in
the kernel, within the bound above.

``MGPU_PROPERTY_EXAMPLES=N`` runs N random examples per property instead of the fixed,
derandomised set CI runs.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import jensenshannon as scipy_js
from scipy.special import rel_entr

import mgpu
from mgpu.ops import NORMS, SEMIRINGS
from mgpu.backends.numpy_knn import nbytes
from mgpu.ops.distances import working_memory_for

EPS = np.finfo(np.float64).eps
C = 4.0

_RANDOM = int(os.environ.get("MGPU_PROPERTY_EXAMPLES", "0"))


def _settings(n: int) -> settings:
    return settings(max_examples=_RANDOM or n, deadline=None, derandomize=not _RANDOM,
                    database=None, suppress_health_check=[HealthCheck.too_slow,
                                                          HealthCheck.filter_too_much])


# ---------------------------------------------------------------------------- the inputs

@dataclass
class Case:
    """A CSR matrix as a user may hand it over, and what is known about it."""

    A: sp.csr_matrix
    nonfinite: bool  # some stored value is NaN or infinite
    duplicates: bool  # some coordinate is stored more than once

    def summed(self, dtype=np.float64) -> np.ndarray:
        """Dense float64 of the values in ``dtype`` with duplicates summed as scipy does."""
        B = sp.csr_matrix((self.A.data.astype(dtype), self.A.indices.copy(),
                           self.A.indptr.copy()), shape=self.A.shape)
        B.sum_duplicates()
        return B.toarray().astype(np.float64)

    def absolute(self) -> np.ndarray:
        """Dense float64 of the absolute stored values, duplicates added up."""
        out = np.zeros(self.A.shape)
        rows = np.repeat(np.arange(self.A.shape[0]), np.diff(self.A.indptr))
        np.add.at(out, (rows, self.A.indices), np.abs(self.A.data.astype(np.float64)))
        return out


_MANTISSA = st.floats(1.0, 9.99, allow_nan=False, allow_infinity=False)


@st.composite
def magnitudes(draw, lo: int = -31, hi: int = 30) -> float:
    """A float from 1e-31 to 1e31 in magnitude, either sign, or an explicit 0 or 1."""
    kind = draw(st.sampled_from(["wide", "wide", "unit", "zero"]))
    if kind == "zero":
        return 0.0
    sign = draw(st.sampled_from([-1.0, 1.0]))
    if kind == "unit":
        return sign * draw(st.sampled_from([1.0, 0.5, 3.0]))
    return sign * draw(_MANTISSA) * 10.0 ** draw(st.integers(lo, hi))


@st.composite
def sparse_matrices(draw, shape=None, *, max_side: int = 5, nonfinite: bool = True,
                    nonnegative: bool = False, mirror: bool = False,
                    duplicates: bool = True) -> Case:
    """A small scipy CSR matrix in any of the states a caller may pass one in.

    ``shape`` fixes rows and/or columns (None entries are drawn, 0 included); ``mirror``
    stores every entry (i, j) also as (j, i) (a square matrix with a symmetric pattern).
    """
    m, n = shape if shape is not None else (None, None)
    m = draw(st.integers(0, max_side)) if m is None else m
    n = draw(st.integers(0, max_side)) if n is None else n
    cells = m * n
    size = draw(st.sampled_from(["empty", "one", "some", "some"])) if cells else "empty"
    nnz = {"empty": 0, "one": 1}[size] if size != "some" else draw(
        st.integers(2, min(2 * cells + 2, 14)))
    rows = draw(st.lists(st.integers(0, max(m - 1, 0)), min_size=nnz, max_size=nnz))
    cols = draw(st.lists(st.integers(0, max(n - 1, 0)), min_size=nnz, max_size=nnz))
    vals = draw(st.lists(magnitudes(), min_size=nnz, max_size=nnz))
    if nonnegative:
        vals = [abs(v) for v in vals]
    if duplicates and nnz and draw(st.booleans()):  # repeat some coordinates, new values
        extra = draw(st.lists(st.integers(0, nnz - 1), min_size=1, max_size=3))
        rows += [rows[e] for e in extra]
        cols += [cols[e] for e in extra]
        new = draw(st.lists(magnitudes(), min_size=len(extra), max_size=len(extra)))
        vals += [abs(v) for v in new] if nonnegative else new
    if mirror:
        rows, cols, vals = rows + cols, cols + rows, vals + vals
    bad = False
    if nonfinite and vals and draw(st.integers(0, 5)) == 0:
        for _ in range(draw(st.integers(1, 2))):
            vals[draw(st.integers(0, len(vals) - 1))] = draw(
                st.sampled_from([math.nan, math.inf, -math.inf]))
        bad = True
    dtype = draw(st.sampled_from([np.float64, np.float32]))
    itype = draw(st.sampled_from([np.int32, np.int64]))
    rows_a, cols_a = np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64)
    # rows in order, columns within a row left in drawn order (unsorted), or sorted
    order = np.argsort(rows_a, kind="stable")
    if draw(st.booleans()):
        order = np.lexsort((cols_a, rows_a))
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows_a, minlength=m)[:m], out=indptr[1:])
    A = sp.csr_matrix((np.array(vals, dtype=dtype)[order], cols_a[order].astype(np.int32),
                       indptr.astype(np.int32)), shape=(m, n))
    # scipy narrows index arrays that fit int32 when it builds a matrix: set them afterwards
    A.indices, A.indptr = cols_a[order].astype(itype), indptr.astype(itype)
    keys = rows_a * max(n, 1) + cols_a
    return Case(A, bad, len(set(keys.tolist())) < len(keys))


@st.composite
def dense(draw, shape, *, nonfinite: bool = True, lo: int = -31, hi: int = 30) -> np.ndarray:
    """A float64 or float32 array of ``shape``, wide magnitudes, NaN/inf now and then."""
    size = int(np.prod(shape))
    vals = draw(st.lists(magnitudes(lo, hi), min_size=size, max_size=size))
    if nonfinite and size and draw(st.integers(0, 7)) == 0:
        vals[draw(st.integers(0, size - 1))] = draw(st.sampled_from([math.nan, math.inf]))
    dtype = draw(st.sampled_from([np.float64, np.float32]))
    return np.array(vals, dtype=dtype).reshape(shape)


# ------------------------------------------------------------------------------ checking

def assert_close(got, ref: np.ndarray, tol: np.ndarray, dtype) -> None:
    """``got`` equals the float64 ``ref`` within ``tol`` after rounding to ``dtype``.

    NaN in ``got`` is never close to anything but a NaN in ``ref``; an infinite ``got``
    needs an infinite ``ref`` of its sign, or (float32 output) one past float32's range.
    """
    got = np.asarray(got)
    assert got.shape == ref.shape
    assert got.dtype == np.dtype(dtype), (got.dtype, dtype)
    g = got.astype(np.float64)
    fin = np.finfo(dtype)
    tol = np.asarray(tol, dtype=np.float64) + fin.eps * np.abs(ref) + fin.tiny
    with np.errstate(invalid="ignore"):
        ok = np.abs(g - ref) <= tol
        ok |= (g == ref)  # equal infinities
        ok |= np.isnan(g) & np.isnan(ref)
        past = np.abs(ref) + tol > fin.max  # overflows the output dtype, or may
        ok |= past & np.isinf(g) & (np.sign(g) == np.sign(ref))
    if not ok.all():
        bad = tuple(np.argwhere(~ok)[0])
        raise AssertionError(f"at {bad}: got {g[bad]!r}, reference {ref[bad]!r}, tolerance "
                             f"{tol[bad]!r}")


def refused(call, exc, pattern: str) -> None:
    with pytest.raises(exc, match=pattern):
        call()


# ------------------------------------------------------------------------------- SpMV/SpMM

@st.composite
def spmv_problems(draw, width):
    case = draw(sparse_matrices())
    n = case.A.shape[1]
    x = draw(dense((n,) if width is None else (n, width), lo=-10, hi=10))
    return case, x


def _spmv_check(case: Case, x: np.ndarray, func, name: str) -> None:
    if np.dtype(x.dtype).kind == "f" and not np.isfinite(x).all():
        return refused(lambda: func(case.A, x), ValueError,
                       rf"^The '{name}' parameter of {func.__name__} holds NaN or infinity "
                       r"\(first at (index|row) \d+")
    if case.nonfinite:
        return refused(lambda: func(case.A, x), ValueError,
                       rf"^The 'A' parameter of {func.__name__} holds NaN or infinity \(first "
                       r"at row \d+, column \d+\)")
    dtype = np.result_type(case.A.dtype, x.dtype)
    xs = x.astype(np.float64)
    absA = case.absolute()
    raw = sp.csr_matrix((case.A.data.astype(np.float64), case.A.indices, case.A.indptr),
                        shape=case.A.shape)
    ref = np.asarray(raw @ xs)  # every stored entry times x, duplicates included
    terms = np.diff(case.A.indptr).max(initial=0)
    tol = C * (terms + 2) * EPS * (absA @ np.abs(xs))
    assert_close(func(case.A, x), ref, tol, dtype)


@_settings(120)
@given(spmv_problems(None))
def test_spmv_is_right_or_refused(problem):
    _spmv_check(*problem, mgpu.spmv, "x")


@_settings(80)
@given(spmv_problems(3))
def test_spmm_is_right_or_refused(problem):
    _spmv_check(*problem, mgpu.spmm, "X")


# ------------------------------------------------------------------------------------ SDDMM

@st.composite
def sddmm_problems(draw):
    case = draw(sparse_matrices())
    m, n = case.A.shape
    K = draw(st.integers(0, 3))
    return case, draw(dense((m, K), lo=-10, hi=10)), draw(dense((n, K), lo=-10, hi=10)), \
        draw(st.booleans())


@_settings(120)
@given(sddmm_problems())
def test_sddmm_is_right_or_refused(problem):
    case, A, B, hadamard = problem
    S = case.A
    call = lambda: mgpu.sddmm(S, A, B, hadamard=hadamard)  # noqa: E731
    for X, name in ((A, "A"), (B, "B")):
        if not np.isfinite(X).all():
            return refused(call, ValueError, rf"^The '{name}' parameter of sddmm holds NaN or "
                                             r"infinity \(first at row \d+, column \d+\)")
    if case.duplicates:  # documented: refused, the pattern would be ambiguous
        return refused(call, ValueError, r"^The 'S' parameter of sddmm has duplicate entries "
                                         r"\(row \d+, column \d+ is stored \d+ times\)")
    if case.nonfinite and hadamard:
        return refused(call, ValueError, r"^The 'S' parameter of sddmm holds NaN or infinity "
                                         r"\(row \d+, column \d+\); clean it, or pass "
                                         r"hadamard=False")
    P = call()
    # S's pattern in S's own (CSR, possibly unsorted) order
    assert sp.issparse(P) and P.shape == S.shape
    np.testing.assert_array_equal(P.indptr, S.indptr)
    np.testing.assert_array_equal(P.indices, S.indices)
    rows = np.repeat(np.arange(S.shape[0]), np.diff(S.indptr))
    a, b = A.astype(np.float64)[rows], B.astype(np.float64)[S.indices]
    ref = (a * b).sum(axis=1)
    bound = (np.abs(a) * np.abs(b)).sum(axis=1)
    if hadamard:
        s = S.data.astype(np.float64)
        ref, bound = ref * s, bound * np.abs(s)
    dtype = np.float32 if all(d == np.float32 for d in (
        S.dtype if hadamard else A.dtype, A.dtype, B.dtype)) else np.float64
    assert_close(P.data, ref, C * (A.shape[1] + 2) * EPS * bound, dtype)


# ------------------------------------------------------------------------------- row norms

@_settings(100)
@given(sparse_matrices(), st.sampled_from(sorted(NORMS)))
def test_row_norms_are_right_and_propagate_nan(case, norm):
    """row_norms documents that NaN propagates (nothing is refused) and that duplicates are
    summed first: in the input's dtype, by scipy."""
    got = mgpu.row_norms(case.A, norm=norm)
    X = case.summed(case.A.dtype)  # what the op reduces, in float64
    absX = np.abs(X)
    k = C * (X.shape[1] + 2) * EPS
    with np.errstate(invalid="ignore", over="ignore"):
        if norm == "sum":
            ref, tol = X.sum(axis=1), k * absX.sum(axis=1)
        elif norm == "l1":
            ref, tol = absX.sum(axis=1), k * absX.sum(axis=1)
        elif norm == "sqeuclidean":
            ref = (X * X).sum(axis=1)
            tol = k * ref
        elif norm == "l2":
            ref = np.sqrt((X * X).sum(axis=1))
            tol = k * ref
        else:
            ref = absX.max(axis=1, initial=0.0)
            ref = np.where(np.isnan(X).any(axis=1), np.nan, ref)
            tol = np.zeros_like(ref)
    tol = np.where(np.isfinite(tol), tol, 0.0)
    assert_close(got, ref, tol, case.A.dtype)


# --------------------------------------------------------------------- distances and kNN

_P = {"minkowski": [1.5, 3.0]}
_METRICS = [(m, p) for m in sorted(SEMIRINGS) for p in _P.get(m, [2.0])]


def reference_distances(metric: str, X: np.ndarray, Y: np.ndarray, p: float
                        ) -> tuple[np.ndarray, np.ndarray]:
    """float64 distances by their definition (and the documented conventions), and the
    tolerance of the way mgpu computes them (module docstring)."""
    n = X.shape[1]
    k = C * (n + 2) * EPS
    x, y = X[:, None, :], Y[None, :, :]
    nx2, ny2 = (X * X).sum(1)[:, None], (Y * Y).sum(1)[None, :]
    absdot = np.abs(X) @ np.abs(Y).T
    if metric in ("euclidean", "sqeuclidean"):
        sq = ((x - y) ** 2).sum(-1)
        err = k * (nx2 + ny2)
        if metric == "sqeuclidean":
            return sq, err
        d = np.sqrt(sq)
        return d, np.sqrt(err) + k * d
    if metric == "inner_product":
        return X @ Y.T, k * absdot
    if metric in ("cosine", "correlation"):
        if metric == "correlation":
            mx = X.mean(1) if n else np.zeros(X.shape[0])
            my = Y.mean(1) if n else np.zeros(Y.shape[0])
            Xc, Yc = X - mx[:, None], Y - my[:, None]
            # what cancels in Σx² - n·mean², x·y - n·mx·my
            ex = k * (nx2[:, 0] + n * mx * mx)
            ey = k * (ny2[0] + n * my * my)
            edot = k * (absdot + n * np.abs(mx)[:, None] * np.abs(my)[None, :])
        else:
            Xc, Yc = X, Y
            ex, ey, edot = k * nx2[:, 0], k * ny2[0], k * absdot
        cx2, cy2 = (Xc * Xc).sum(1), (Yc * Yc).sum(1)
        den = np.sqrt(cx2)[:, None] * np.sqrt(cy2)[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            rho = np.where(den > 0, (Xc @ Yc.T) / np.where(den > 0, den, 1), 0.0)
            tol = (edot / np.where(den > 0, den, 1) + np.abs(rho) * (
                (ex / np.where(cx2 > 0, cx2, 1))[:, None] + (ey / np.where(cy2 > 0, cy2, 1))
                [None, :]) + k)
        d = np.clip(1.0 - rho, 0.0, 2.0)
        # a centred norm within rounding of 0 (a constant, non-zero row) leaves the
        # expanded form's answer anywhere in [0, 2]
        vague = (cx2 <= ex)[:, None] | (cy2 <= ey)[None, :]
        exact_zero = (cx2 == 0)[:, None] | (cy2 == 0)[None, :]
        if metric == "cosine":
            vague = np.zeros_like(vague)
        tol = np.where(vague & ~exact_zero, 2.0, tol)
        return np.where(exact_zero, 1.0, d), np.where(exact_zero, 0.0, tol)
    if metric in ("dice", "jaccard", "russellrao"):
        px, py = (x != 0), (y != 0)
        both = (px & py).sum(-1).astype(float)
        cx, cy = px.sum(-1), py.sum(-1)
        if metric == "russellrao":
            d = (n - both) / n if n else np.zeros_like(both)
        else:
            den = cx + cy - (both if metric == "jaccard" else 0)
            d = np.where(den > 0, (cx + cy - 2 * both) / np.where(den > 0, den, 1), 0.0)
        return d, np.full(d.shape, k)
    if metric == "hellinger":
        s = np.sqrt(X) @ np.sqrt(Y).T
        d = np.sqrt(np.maximum(1.0 - s, 0.0))
        return d, np.sqrt(k * (1.0 + s)) + k * d
    if metric == "kl_divergence":
        d = rel_entr(x, y).sum(-1)
        with np.errstate(divide="ignore"):
            lx, ly = np.where(x > 0, np.abs(np.log(np.where(x > 0, x, 1))), 0), \
                np.where(y > 0, np.abs(np.log(np.where(y > 0, y, 1))), 0)
        return d, k * (x * (lx + ly)).sum(-1)
    if metric == "manhattan":
        d = np.abs(x - y).sum(-1)
        return d, k * (np.abs(x).sum(-1) + np.abs(y).sum(-1) + d)
    if metric == "chebyshev":
        d = np.abs(x - y).max(-1, initial=0.0)
        return d, k * d
    if metric == "minkowski":
        t = np.abs(x - y) ** p
        d = t.sum(-1) ** (1 / p)
        err = k * (np.abs(x) ** p + t).sum(-1)
        return d, err ** (1 / p) + k * d
    if metric == "canberra":
        s = np.abs(x) + np.abs(y)
        d = np.where(s > 0, np.abs(x - y) / np.where(s > 0, s, 1), 0.0).sum(-1)
        return d, np.full(d.shape, k * (n + 1))
    if metric == "hamming":
        d = (x != y).mean(-1) if n else np.zeros((X.shape[0], Y.shape[0]))
        return d, np.full(d.shape, k)
    if metric == "jensenshannon":
        d = np.array([[scipy_js(a, b) for b in Y] for a in X]).reshape(X.shape[0], Y.shape[0])
        return d, np.sqrt(np.full(d.shape, k * (n + 1))) + k * d
    raise AssertionError(metric)


def _refusal(metric: str, named: list[tuple[str, Case]], func: str) -> tuple[str, str] | None:
    """The documented refusal for these operands, checked in the op's order, if any."""
    ring = SEMIRINGS[metric]
    for name, case in named:
        if case.nonfinite:
            return name, rf"^The '{name}' parameter of {func} holds NaN or infinity \(first at " \
                         r"row \d+, column \d+\)"
    for name, case in named:
        X = case.summed()
        if ring.nonnegative and (X < 0).any():
            return name, rf"^The '{name}' parameter of {func} must be non-negative for metric " \
                         rf"'{metric}'\. Got a negative value at row \d+, column \d+"
        if ring.positive_rows and (X.sum(axis=1) <= 0).any():
            return name, rf"^The '{name}' parameter of {func} has rows that sum to 0 \(first: " \
                         rf"row {int(np.flatnonzero(X.sum(axis=1) <= 0)[0])}\); metric " \
                         rf"'{metric}' compares distributions"
    return None


@st.composite
def distance_problems(draw):
    metric, p = draw(st.sampled_from(_METRICS))
    nonneg = SEMIRINGS[metric].nonnegative and draw(st.integers(0, 3)) > 0
    X = draw(sparse_matrices(nonnegative=nonneg))
    Y = draw(st.none() | sparse_matrices((None, X.A.shape[1]), nonnegative=nonneg))
    return metric, p, X, Y


def _check_distances(got: np.ndarray, metric: str, p: float, X: Case, Y: Case) -> None:
    ref, tol = reference_distances(metric, X.summed(), Y.summed(), p)
    assert_close(got, ref, tol, np.float64)


@_settings(250)
@given(distance_problems())
def test_pairwise_distances_are_right_or_refused(problem):
    metric, p, X, Y = problem
    call = lambda: mgpu.pairwise_distances(X.A, None if Y is None else Y.A,  # noqa: E731
                                           metric=metric, p=p)
    named = [("X", X)] + ([] if Y is None else [("Y", Y)])
    why = _refusal(metric, named, "pairwise_distances")
    if why is not None:
        return refused(call, ValueError, why[1])
    _check_distances(call(), metric, p, X, X if Y is None else Y)


@st.composite
def knn_problems(draw):
    metric, p = draw(st.sampled_from(_METRICS))
    nonneg = SEMIRINGS[metric].nonnegative and draw(st.integers(0, 3)) > 0
    index = draw(sparse_matrices(nonnegative=nonneg))
    queries = draw(sparse_matrices((None, index.A.shape[1]), nonnegative=nonneg))
    n = index.A.shape[0]
    k = draw(st.integers(1, n) if n and draw(st.integers(0, 5)) else st.sampled_from([0, n + 1]))
    one = draw(st.booleans())  # the working memory of one-query batches, or the default
    return metric, p, index, queries, k, one


@_settings(200)
@given(knn_problems())
def test_knn_is_right_or_refused(problem):
    metric, p, index, queries, k, one = problem
    budget = None
    if one:  # as the index is checked: float64 CSR, duplicates summed
        X = sp.csr_matrix(index.A, dtype=np.float64, copy=True)
        X.sum_duplicates()
        budget = working_memory_for(1, X.shape[0], SEMIRINGS[metric], nbytes(X))
    call = lambda: mgpu.knn(index.A, queries.A, k, metric=metric, p=p,  # noqa: E731
                            working_memory=budget)
    why = _refusal(metric, [("index", index), ("queries", queries)], "knn")
    n = index.A.shape[0]
    if why is not None:
        return refused(call, ValueError, why[1])
    if not 1 <= k <= n:
        return refused(call, ValueError, rf"^The 'k' parameter of knn must be an int in "
                                         rf"\[1, {n}\] \(the index has {n} rows\)\. Got {k} ")
    dist, ids = call()
    nq = queries.A.shape[0]
    assert dist.shape == ids.shape == (nq, k) and ids.dtype == np.int64
    ref, tol = reference_distances(metric, queries.summed(), index.summed(), p)
    largest = SEMIRINGS[metric].similarity
    for q in range(nq):
        assert len(set(ids[q].tolist())) == k and ids[q].min(initial=0) >= 0
        # each neighbour is at the distance reported for it ...
        assert_close(dist[q], ref[q, ids[q]], tol[q, ids[q]], np.float64)
        # ... and the k reported are the k best, up to the tolerance (rounding may swap ties)
        best = np.sort(-ref[q] if largest else ref[q])[:k] * (-1 if largest else 1)
        assert_close(dist[q], best, np.full(k, tol[q].max(initial=0.0)), np.float64)


# ---------------------------------------------------------------------------------- Jaccard

@st.composite
def graphs(draw):
    m = draw(st.integers(0, 6))
    weighted = draw(st.booleans())
    symmetrize = draw(st.booleans())
    mirror = not symmetrize and draw(st.integers(0, 4)) > 0
    case = draw(sparse_matrices((m, m), nonnegative=weighted and draw(st.integers(0, 3)) > 0,
                                mirror=mirror))
    return case, weighted, symmetrize


def _jaccard_reference(W: np.ndarray, weighted: bool) -> np.ndarray:
    n = W.shape[0]
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if W[i, j] == 0:
                continue
            if weighted:
                out[i, j] = np.minimum(W[i], W[j]).sum() / np.maximum(W[i], W[j]).sum()
            else:
                a, b = W[i] != 0, W[j] != 0
                out[i, j] = (a & b).sum() / (a | b).sum()
    return out


@_settings(150)
@given(graphs())
def test_jaccard_is_right_or_refused(problem):
    case, weighted, symmetrize = problem
    call = lambda: mgpu.jaccard(case.A, weighted=weighted, symmetrize=symmetrize)  # noqa: E731
    if case.nonfinite:
        return refused(call, ValueError, r"^The 'G' parameter of jaccard holds NaN or infinity "
                                         r"\(first at row \d+, column \d+\)")
    W = case.summed(case.A.dtype)
    if weighted and (W < 0).any():
        return refused(call, ValueError, r"^The 'G' parameter of jaccard has negative edge "
                                         r"weights; weighted=True needs non-negative ones")
    np.fill_diagonal(W, 0)  # self-loops are dropped, stored zeros are not edges
    if symmetrize:
        W = np.maximum(W, W.T) if weighted else ((W != 0) | (W != 0).T).astype(float)
    elif not (np.array_equal(W, W.T) if weighted else np.array_equal(W != 0, W.T != 0)):
        return refused(call, ValueError, r"^The 'G' parameter of jaccard must be an undirected "
                                         r"graph, but its (weights|pattern) is not symmetric "
                                         r"\(first: row \d+, column \d+\)\. Pass symmetrize=True")
    if not weighted:
        W = (W != 0).astype(float)
    J = call()
    assert sp.issparse(J) and J.shape == W.shape and J.dtype == np.float64
    coo = J.tocoo()
    stored = np.zeros(W.shape, dtype=bool)
    stored[coo.row, coo.col] = True
    np.testing.assert_array_equal(stored, W != 0)  # G's pattern, no self-loops
    assert J.has_canonical_format
    ref = _jaccard_reference(W, weighted)
    assert_close(J.toarray(), ref, np.full(ref.shape, C * (W.shape[0] + 2) * EPS), np.float64)


# ---------------------------------------------------------------- examples found above

def test_float32_overflow_to_inf_is_not_a_warning():
    """A float32 result past float32's range is inf (as SDDMM's float32 output gives it);
    numpy's cast warning named no operation and failed a run under ``-W error``."""
    A = sp.csr_matrix(np.array([[3e38, 3e38]], dtype=np.float32))
    one = np.ones(2, dtype=np.float32)
    assert np.isposinf(mgpu.spmv(A, one)).all()
    assert np.isposinf(mgpu.spmm(A, one[:, None])).all()
    assert np.isposinf(mgpu.row_norms(A, norm="sum")).all()


def test_float32_l2_norm_is_rooted_before_rounding():
    """The squares of float32 values above ~1.8e19 overflow float32; their norm does not."""
    for X in (sp.csr_matrix(np.array([[1e20], [3e19]], dtype=np.float32)),
              np.array([[1e20], [3e19]], dtype=np.float32)):
        got = mgpu.row_norms(X)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, [1e20, 3e19], rtol=1e-6)


def test_correlation_without_features_is_the_zero_row_convention():
    """No columns: every row is a zero row, at correlation distance 1 (the mean was 0/0)."""
    for X in (sp.csr_matrix((2, 0)), np.zeros((2, 0))):
        np.testing.assert_array_equal(mgpu.pairwise_distances(X, metric="correlation"),
                                      np.ones((2, 2)))
        d, i = mgpu.knn(X, X[:1], 1, metric="correlation")
        assert d.tolist() == [[1.0]] and i.tolist() == [[0]]


def test_jaccard_of_an_empty_float32_graph_is_float64():
    """The documented float64 result, also when there is no node to run the kernel on."""
    J = mgpu.jaccard(sp.csr_matrix((0, 0), dtype=np.float32))
    assert J.dtype == np.float64 and J.shape == (0, 0)
