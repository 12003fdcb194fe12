"""Every metric on adversarial magnitudes, against an exact reference, within a tolerance
derived from the condition of the distance on the data at hand (not a blanket one).

The rows are what breaks a formula that cancels: offsets up to 1e12 on a spread down to
1e-8, values from 1e-8 to 1e8 in one row, constant rows, rows that differ in one tiny entry,
and large shared entries beside small unshared ones. The references are exact where they
can be: sums of rational terms in :class:`fractions.Fraction` (manhattan, minkowski's sum,
canberra, hamming, chebyshev, correlation's centred sums), rounded once at the end;
Jensen-Shannon's terms are scipy's ``rel_entr``, summed exactly rounded (``math.fsum``),
their logarithms' error in the bound.

Tolerances, with ``e = (n + 2)·EPS`` for n features (a sum of n rounded terms):

- sums of nonnegative terms (manhattan, canberra, minkowski's sum before the root): ``C·e·d``;
  the root divides the relative error by p; hamming and chebyshev are exact up to one rounding;
- Jensen-Shannon: each feature's term is a difference of two products, so the sum's error is
  ``C·e·Σ (x|ln(2x/m)| + y|ln(2y/m)|)`` (rows normalised, m = x + y), and the distance's
  ``sqrt`` of half of that (it halves the digits near 0);
- correlation, computed from centred rows: ``C·(e + (e·(κx + κy))²)`` with ``κ = max|x| /
  rms(x - mean)`` the row's offset over its spread; the computed mean is off by about
  ``e·max|x|``, which moves the centred products by the square of ``e·κ``, never by ``κ``
  alone as ``Σxy - n·mx·my`` does (``e·κ²``). A constant row (exactly: every entry equal) is at
  distance exactly 1.
"""
from __future__ import annotations

import math
import os
from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import cdist
from scipy.special import rel_entr

import mgpu
from mgpu.ops import SEMIRINGS

EPS = np.finfo(np.float64).eps
C = 8.0
UNION = ("manhattan", "minkowski", "canberra", "hamming", "jensenshannon", "chebyshev")
_RANDOM = int(os.environ.get("MGPU_PROPERTY_EXAMPLES", "0"))


def _settings(n: int) -> settings:
    return settings(max_examples=_RANDOM or n, deadline=None, derandomize=not _RANDOM,
                    database=None, suppress_health_check=[HealthCheck.too_slow,
                                                          HealthCheck.filter_too_much])


# ---------------------------------------------------------------------------- the inputs

def _value(draw, lo: int = -8, hi: int = 8) -> float:
    return draw(st.sampled_from([-1.0, 1.0])) * draw(st.floats(1.0, 9.99)) * 10.0 ** draw(
        st.integers(lo, hi))


@st.composite
def hostile_pairs(draw, nonnegative: bool = False):
    """Two float64 matrices (X, Y) of one width whose rows are chosen to cancel."""
    n = draw(st.integers(1, 9))
    rows: list[np.ndarray] = []

    def row(kind: str) -> np.ndarray:
        if kind == "offset":  # a large offset on a small spread, some entries zero
            off = draw(st.sampled_from([0.0, 1.0, 1e4, -1e8, 1e8, 1e12, -1e12]))
            scale = 10.0 ** draw(st.integers(-8, 8))
            r = off + scale * np.array([draw(st.integers(-999, 999)) / 1000 for _ in range(n)])
            if draw(st.booleans()):
                r[np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))] = 0.0
            return r
        if kind == "spread":  # magnitudes from 1e-8 to 1e8 in one row
            return np.array([_value(draw) if draw(st.integers(0, 3)) else 0.0
                             for _ in range(n)])
        if kind == "constant":
            return np.full(n, draw(st.sampled_from([0.0, 0.5717852652004325, 1e12, -3.0])))
        if kind == "tiny" and rows:  # another row with one entry moved by a hair
            r = rows[draw(st.integers(0, len(rows) - 1))].copy()
            f = draw(st.integers(0, n - 1))
            if r[f] == 0:
                r[f] = 1e-8
            elif draw(st.booleans()):
                r[f] += draw(st.sampled_from([1e-8, -1e-12, 1.0])) * abs(r[f])
            else:
                r[f] = np.nextafter(r[f], np.inf)  # one unit in the last place
            return r
        if kind == "shared" and rows:  # another row's large entries, own small ones
            base = rows[draw(st.integers(0, len(rows) - 1))]
            r = np.where(np.abs(base) >= 1e4, base, 0.0)
            big = draw(st.integers(0, n - 1))
            r[big] = r[big] or 1e16
            small = [f for f in range(n) if f != big and draw(st.booleans())]
            r[small] = [_value(draw, -8, 0) for _ in small]
            return r
        return np.array([_value(draw) for _ in range(n)])

    kinds = st.sampled_from(["offset", "spread", "constant", "tiny", "shared", "shared"])
    m_x, m_y = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    for _ in range(m_x + m_y):
        rows.append(row(draw(kinds)))
    A = np.array(rows)
    if nonnegative:
        A = np.abs(A)
        A[A.sum(axis=1) <= 0, 0] = 1.0  # every row with mass
    return A[:m_x], A[m_x:]


# ------------------------------------------------------------------------- the references

def _exact_union(metric: str, x: np.ndarray, y: np.ndarray, p: float) -> tuple[float, float]:
    """The distance, exact to one rounding, and the tolerance of a float64 computation."""
    n = x.size
    e = (n + 2) * EPS
    fx, fy = [Fraction(float(v)) for v in x], [Fraction(float(v)) for v in y]
    if metric == "manhattan":
        d = float(sum(abs(a - b) for a, b in zip(fx, fy)))
        return d, C * e * d
    if metric == "chebyshev":
        d = float(max(abs(a - b) for a, b in zip(fx, fy)))
        return d, EPS * d
    if metric == "hamming":
        return float(Fraction(sum(a != b for a, b in zip(fx, fy)), n)), EPS
    if metric == "canberra":
        d = float(sum(abs(a - b) / (abs(a) + abs(b)) for a, b in zip(fx, fy) if a or b))
        return d, C * e * d
    if metric == "minkowski":  # the sum exact, its root in float64 as mgpu takes it
        s = float(sum(abs(a - b) ** int(p) for a, b in zip(fx, fy)))
        d = s ** (1.0 / p)
        return d, C * e * d
    raise AssertionError(metric)


def _js(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    # scipy's definition (rows normalised, natural logarithm) with exactly rounded sums of
    # its terms; scipy's own cdist gives NaN where the sum rounds below 0 (equal rows)
    px, py = x / x.sum(), y / y.sum()
    m = px + py
    s = math.fsum(rel_entr(px, m / 2)) + math.fsum(rel_entr(py, m / 2))
    d = math.sqrt(max(s, 0.0) / 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        wx = np.where(px > 0, px * np.abs(np.log(2 * px / m)), 0.0)
        wy = np.where(py > 0, py * np.abs(np.log(2 * py / m)), 0.0)
    err = C * (x.size + 2) * EPS * float((wx + wy).sum() + 1.0)
    return d, math.sqrt(err / 2) + C * EPS * d


def _exact_correlation(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    n = x.size
    fx, fy = [Fraction(float(v)) for v in x], [Fraction(float(v)) for v in y]
    mx, my = sum(fx) / n, sum(fy) / n
    vx = sum((a - mx) ** 2 for a in fx)
    vy = sum((b - my) ** 2 for b in fy)
    if vx == 0 or vy == 0:  # a constant row (exactly): the convention, exactly
        return 1.0, 0.0
    cov = sum((a - mx) * (b - my) for a, b in zip(fx, fy))
    rho = math.copysign(math.sqrt(float(cov * cov / (vx * vy))), float(cov))
    e = (n + 2) * EPS
    kx = float(np.abs(x).max()) / math.sqrt(float(vx) / n)
    ky = float(np.abs(y).max()) / math.sqrt(float(vy) / n)
    return min(max(1.0 - rho, 0.0), 2.0), C * (e + (e * (kx + ky)) ** 2)


def reference(metric: str, X: np.ndarray, Y: np.ndarray, p: float
              ) -> tuple[np.ndarray, np.ndarray]:
    d = np.empty((X.shape[0], Y.shape[0]))
    tol = np.empty_like(d)
    for i, x in enumerate(X):
        for j, y in enumerate(Y):
            if metric == "correlation":
                d[i, j], tol[i, j] = _exact_correlation(x, y)
            elif metric == "jensenshannon":
                d[i, j], tol[i, j] = _js(x, y)
            else:
                d[i, j], tol[i, j] = _exact_union(metric, x, y, p)
    return d, tol


def _check(got: np.ndarray, ref: np.ndarray, tol: np.ndarray, what: str) -> None:
    bad = ~(np.abs(got - ref) <= tol)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise AssertionError(f"{what} at ({i}, {j}): got {got[i, j]!r}, exact {ref[i, j]!r}, "
                             f"tolerance {tol[i, j]!r}")


_FUZZED = [("manhattan", 1), ("minkowski", 3), ("canberra", 2), ("hamming", 2),
           ("chebyshev", 2), ("jensenshannon", 2), ("correlation", 2)]


@pytest.mark.parametrize("metric, p", _FUZZED)
def test_hostile_magnitudes_within_the_condition_bound(metric, p):
    ring = SEMIRINGS[metric]

    @_settings(60)
    @given(hostile_pairs(nonnegative=ring.nonnegative))
    def check(pair):
        X, Y = pair
        ref, tol = reference(metric, X, Y, p)
        dense = mgpu.pairwise_distances(X, Y, metric=metric, p=p)
        csr = mgpu.pairwise_distances(sp.csr_matrix(X), sp.csr_matrix(Y), metric=metric, p=p)
        _check(dense, ref, tol, f"{metric} (dense)")
        _check(csr, ref, tol, f"{metric} (CSR)")
        if metric == "correlation":  # the conventions, decided exactly, agree exactly
            assert np.array_equal(dense[tol == 0], csr[tol == 0])
        else:  # one merge whichever row comes first, stored zeros or not: the same bits
            swapped = mgpu.pairwise_distances(sp.csr_matrix(Y), sp.csr_matrix(X),
                                              metric=metric, p=p)
            assert np.array_equal(csr, swapped.T), f"{metric} is not symmetric to the bit"
            assert np.array_equal(dense, csr)

    check()


# ------------------------------------------------------------------ the examples


@pytest.mark.parametrize("kind", [np.array, sp.csr_matrix])
def test_a_large_shared_entry_keeps_a_small_unshared_one(kind):
    """minkowski p=3 on [1e6, 1] vs [1e6, 0] is 1 (it was 0 one way and 1 the other), and
    manhattan on [1e16, 1] vs [1e16, 0] is 1 (it was 0)."""
    a, b = kind(np.array([[1e6, 1.0]])), kind(np.array([[1e6, 0.0]]))
    assert mgpu.pairwise_distances(a, b, metric="minkowski", p=3)[0, 0] == 1.0
    assert mgpu.pairwise_distances(b, a, metric="minkowski", p=3)[0, 0] == 1.0
    a, b = kind(np.array([[1e16, 1.0]])), kind(np.array([[1e16, 0.0]]))
    for metric in ("manhattan", "canberra"):
        ref = cdist(np.array([[1e16, 1.0]]), np.array([[1e16, 0.0]]),
                    "cityblock" if metric == "manhattan" else metric)[0, 0]
        assert mgpu.pairwise_distances(a, b, metric=metric)[0, 0] == ref == 1.0
        assert mgpu.pairwise_distances(b, a, metric=metric)[0, 0] == 1.0
    d, i = mgpu.knn(kind(np.array([[1e16, 0.0], [1e16, 1.0]])), b, 2, metric="manhattan")
    assert d.tolist() == [[0.0, 1.0]] and i.tolist() == [[0, 1]]


@pytest.mark.parametrize("kind", [np.array, sp.csr_matrix])
def test_correlation_of_rows_with_a_large_offset(kind):
    """Rows of standard_normal((4, 20)) + 1e8: scipy's 0, 1.23, 0.77, 1.06 (all came out 1);
    and at an offset of 1e6 (an error of 1.7e-3 before)."""
    for offset in (1e8, 1e6, 1e12):
        X = np.random.default_rng(2).standard_normal((4, 20)) + offset
        ref, tol = reference("correlation", X, X, 2)
        got = mgpu.pairwise_distances(kind(X), metric="correlation")
        _check(got, ref, tol, f"correlation at offset {offset:g}")
        np.testing.assert_allclose(got, cdist(X, X, "correlation"), rtol=0, atol=1e-6)
    X = np.random.default_rng(2).standard_normal((4, 20)) + 1e8
    np.testing.assert_allclose(mgpu.pairwise_distances(kind(X), metric="correlation")[0],
                               [0.0, 1.22966509, 0.76638369, 1.06167446], atol=1e-8)


def test_constant_rows_agree_dense_and_sparse():
    """Two constant rows [c]*3 and [c/2 + 0.01]*3: dense gave [[0.5, 1], [1, 1]] and CSR
    [[0.5, 2], [2, 1]]; both are zero-variance rows, at distance 1 from every row."""
    c = 0.5717852652004325
    Z = np.array([[c] * 3, [c / 2 + 0.01] * 3, [1.0, 2.0, 4.0], [0.0, 0.0, 0.0]])
    dense = mgpu.pairwise_distances(Z, metric="correlation")
    csr = mgpu.pairwise_distances(sp.csr_matrix(Z), metric="correlation")
    conventional = np.ones((4, 4), dtype=bool)
    conventional[2, 2] = False  # the one row with variance, against itself
    assert (dense[conventional] == 1.0).all() and (csr[conventional] == 1.0).all()
    assert dense[2, 2] <= 4 * EPS and csr[2, 2] <= 4 * EPS
    d, i = mgpu.knn(sp.csr_matrix(Z), Z[:1], 4, metric="correlation")
    assert d.tolist() == [[1.0] * 4] and i.tolist() == [[0, 1, 2, 3]]
