"""scikit-learn's estimator checks on ``mgpu.NearestNeighbors``, for every metric.

``parametrize_with_checks`` runs scikit-learn's own suite (the API checks and the legacy
ones) on ``NearestNeighbors(metric=m)`` for each of the 16 metrics of ``SEMIRINGS``. A
check may only be skipped by scikit-learn itself (its ``SkipTest``: pandas or
``SCIPY_ARRAY_API`` missing), or listed in :func:`_expected_failed` with the reason (strict:
a check that starts to pass must leave the list). scikit-learn's checks call ``fit`` but
none of the ``kneighbors`` methods, so :data:`KNEIGHBORS_CHECKS` below add theirs, written
in the same way (an estimator in, assertions on its outputs).

The GPU variant runs both on :class:`NearestNeighborsOnGPU`, a test-only subclass that moves
every array CuPy can hold to the GPU before calling ``NearestNeighbors`` (scikit-learn's
checks make numpy and scipy data) and the results back, and asserts that the index did stay
on the device: the checks then run through the CuPy path of ``fit`` and ``kneighbors``.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.utils.estimator_checks import parametrize_with_checks

import mgpu
from mgpu.ops.distances import SEMIRINGS

METRICS = sorted(SEMIRINGS)

# jensenshannon refuses rows that sum to 0 (a distribution needs mass; scipy gives NaN
# there). These checks fit data with such rows: X - X.min() (the positive_only tag's data)
# has a zero row when X has one column, and the sparse and dtype checks zero most entries.
# No scikit-learn tag says "rows need mass"; the refusal is mgpu's documented behaviour.
_JS_ZERO_ROWS = "jensenshannon refuses rows that sum to 0, and this check's data has one"
_JS_EXPECTED = {c: _JS_ZERO_ROWS for c in (
    "check_estimators_dtypes", "check_estimator_sparse_tag", "check_estimator_sparse_array",
    "check_estimator_sparse_matrix", "check_fit2d_1feature")}


def _expected_failed(estimator) -> dict[str, str]:
    return _JS_EXPECTED if estimator.metric == "jensenshannon" else {}


# ------------------------------------------------------------------- scikit-learn's suite

@parametrize_with_checks([mgpu.NearestNeighbors(metric=m) for m in METRICS],
                         expected_failed_checks=_expected_failed, xfail_strict=True)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def test_the_checks_cover_every_metric_and_the_tags_tell_the_truth():
    from sklearn.utils import get_tags

    for m in METRICS:
        tags = get_tags(mgpu.NearestNeighbors(metric=m))
        assert tags.input_tags.sparse and not tags.input_tags.allow_nan
        assert tags.input_tags.positive_only == SEMIRINGS[m].nonnegative
        assert not tags.non_deterministic and tags.requires_fit
        assert not tags.target_tags.required
    assert {m for m in METRICS if SEMIRINGS[m].nonnegative} == {
        "hellinger", "kl_divergence", "jensenshannon"}
    # aliases and minkowski's p resolve as fit resolves them
    assert get_tags(mgpu.NearestNeighbors(metric="kullback_leibler")).input_tags.positive_only
    assert not get_tags(mgpu.NearestNeighbors(metric="nope")).input_tags.positive_only


def test_the_array_api_check_passes_where_scipy_array_api_is_set():
    """check_array_api_input skips unless SCIPY_ARRAY_API was set before scipy was imported:
    it runs here in a process of its own, for every metric."""
    code = (
        "import mgpu\n"
        "from sklearn.utils.estimator_checks import check_array_api_input\n"
        "from mgpu.ops.distances import SEMIRINGS\n"
        "for m in sorted(SEMIRINGS):\n"
        "    check_array_api_input('NearestNeighbors', mgpu.NearestNeighbors(metric=m),\n"
        "                          array_namespace='numpy', expect_only_array_outputs=False)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "SCIPY_ARRAY_API": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_import_mgpu_leaves_scikit_learn_until_nearest_neighbors_is_used():
    code = ("import sys, mgpu\n"
            "assert 'sklearn' not in sys.modules\n"
            "from mgpu import NearestNeighbors\n"
            "import mgpu.ops\n"
            "assert mgpu.ops.NearestNeighbors is NearestNeighbors is mgpu.NearestNeighbors\n"
            "assert 'sklearn.base' in sys.modules\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# ----------------------------------------------------------------- the kneighbors checks

def _data(seed=0, n=30, m=6):
    """Positive rows with mass (every metric takes them), no two equal."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(0.1, 3.0, size=(n, m))
    X[rng.uniform(size=X.shape) < 0.3] = 0.0
    X[:, 0] += 0.5  # every row keeps mass
    return X


def _brute(estimator, X, Q):
    """The k nearest by mgpu.pairwise_distances on the host and a stable sort: best first,
    ties to the lower row."""
    from mgpu.ops.distances import resolve_metric

    ring, _ = resolve_metric(estimator.metric, estimator.p)
    D = mgpu.pairwise_distances(Q, X, metric=estimator.metric, p=estimator.p)
    order = np.argsort(-D if ring.similarity else D, axis=1, kind="stable")
    k = estimator.n_neighbors
    return np.take_along_axis(D, order, axis=1)[:, :k], order[:, :k]


def check_kneighbors_equals_brute_force(estimator):
    X, Q = _data(1), _data(2, n=9)
    est = clone(estimator).set_params(n_neighbors=4).fit(X)
    d, i = est.kneighbors(Q)
    rd, ri = _brute(est, X, Q)
    assert d.shape == i.shape == (9, 4) and i.dtype.kind == "i"
    np.testing.assert_allclose(d, rd, rtol=1e-10, atol=1e-12)
    assert np.array_equal(i, ri)
    assert np.array_equal(est.kneighbors(Q, return_distance=False), i)
    d2, i2 = est.kneighbors(Q, n_neighbors=2)
    assert np.array_equal(i2, i[:, :2]) and np.array_equal(d2, d[:, :2])


def check_kneighbors_of_the_index_leave_each_row_out(estimator):
    X = _data(3)
    est = clone(estimator).set_params(n_neighbors=3).fit(X)
    d, i = est.kneighbors()
    assert i.shape == (30, 3)
    assert not (i == np.arange(30)[:, None]).any()
    # the 3 nearest other rows: the brute force with the diagonal taken out
    from mgpu.ops.distances import resolve_metric

    ring, _ = resolve_metric(est.metric, est.p)
    D = mgpu.pairwise_distances(X, metric=est.metric, p=est.p)
    np.fill_diagonal(D, -np.inf if ring.similarity else np.inf)
    order = np.argsort(-D if ring.similarity else D, axis=1, kind="stable")[:, :3]
    np.testing.assert_allclose(d, np.take_along_axis(D, order, axis=1), rtol=1e-10,
                               atol=1e-12)
    assert np.array_equal(i, order)


def check_kneighbors_graph_holds_the_neighbours(estimator):
    X, Q = _data(4), _data(5, n=7)
    est = clone(estimator).set_params(n_neighbors=3).fit(X)
    for q, n_q in ((Q, 7), (None, 30)):
        d, i = est.kneighbors(q)
        G = est.kneighbors_graph(q, mode="distance")
        C = est.kneighbors_graph(q)
        assert sp.issparse(G) and G.shape == (n_q, 30) and G.nnz == 3 * n_q
        assert np.array_equal(G.indices.reshape(n_q, 3), i)
        assert np.array_equal(G.data.reshape(n_q, 3), d)
        assert (C.data == 1).all() and np.array_equal(C.indices, G.indices)


def check_kneighbors_order_and_subset_invariance(estimator):
    X, Q = _data(6), _data(7, n=12)
    est = clone(estimator).set_params(n_neighbors=3).fit(X)
    d, i = est.kneighbors(Q)
    perm = np.random.default_rng(0).permutation(12)
    dp, ip = est.kneighbors(Q[perm])
    assert np.array_equal(ip, i[perm]) and np.array_equal(dp, d[perm])
    parts = [est.kneighbors(Q[s:s + 5]) for s in range(0, 12, 5)]
    assert np.array_equal(np.vstack([p[1] for p in parts]), i)
    assert np.array_equal(np.vstack([p[0] for p in parts]), d)


def check_kneighbors_same_for_every_input_kind(estimator):
    X, Q = _data(8), _data(9, n=5)
    est = clone(estimator).set_params(n_neighbors=3)
    d, i = est.fit(X).kneighbors(Q)
    kinds = [sp.csr_matrix, sp.csc_matrix, sp.coo_matrix, sp.csr_array,
             lambda a: np.asfortranarray(a), lambda a: a.tolist(), lambda a: a.astype(object)]
    for kind in kinds:
        dk, ik = clone(est).fit(kind(X)).kneighbors(kind(Q))
        assert np.array_equal(ik, i), kind
        np.testing.assert_allclose(dk, d, rtol=1e-10, atol=1e-12)


def check_kneighbors_after_pickle_and_refit(estimator):
    X, Q = _data(10), _data(11, n=5)
    est = clone(estimator).set_params(n_neighbors=2).fit(X)
    d, i = est.kneighbors(Q)
    again = pickle.loads(pickle.dumps(est))
    d2, i2 = again.kneighbors(Q)
    assert np.array_equal(i2, i) and np.array_equal(d2, d)
    d3, i3 = est.fit(X).kneighbors(Q)
    assert np.array_equal(i3, i) and np.array_equal(d3, d)


def check_kneighbors_refuses_what_fit_refuses(estimator):
    X = _data(12)
    est = clone(estimator).set_params(n_neighbors=2).fit(X)
    with pytest.raises(ValueError, match=r"X has 5 features, but NearestNeighbors is "
                                         r"expecting 6 features as input"):
        est.kneighbors(X[:, :5])
    bad = X[:3].copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="NaN or infinity"):
        est.kneighbors(bad)
    with pytest.raises(ValueError, match=r"0 sample\(s\) \(shape=\(0, 6\)\) while a minimum"):
        est.kneighbors(X[:0])
    with pytest.raises(ValueError, match="Complex data not supported"):
        est.kneighbors(X[:3] + 1j)
    if SEMIRINGS[estimator.metric].nonnegative:
        with pytest.raises(ValueError, match="Negative values in data"):
            est.kneighbors(-X[:3])


KNEIGHBORS_CHECKS = [check_kneighbors_equals_brute_force,
                     check_kneighbors_of_the_index_leave_each_row_out,
                     check_kneighbors_graph_holds_the_neighbours,
                     check_kneighbors_order_and_subset_invariance,
                     check_kneighbors_same_for_every_input_kind,
                     check_kneighbors_after_pickle_and_refit,
                     check_kneighbors_refuses_what_fit_refuses]


@pytest.mark.parametrize("check", KNEIGHBORS_CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("metric", METRICS)
def test_kneighbors_checks(metric, check):
    check(mgpu.NearestNeighbors(metric=metric))


# ------------------------------------------------------------------------- the GPU variant

def _to_gpu(X):
    """X on the GPU where CuPy can hold it: numeric numpy arrays as cupy arrays, scipy
    matrices as cupyx CSR/CSC/COO; anything else (lists, object arrays, strings) as given,
    for the host path to take or refuse."""
    import cupy
    import cupyx.scipy.sparse as csp

    if sp.issparse(X):
        fmt = X.format if X.format in ("csr", "csc", "coo") else "csr"
        kind = {"csr": csp.csr_matrix, "csc": csp.csc_matrix, "coo": csp.coo_matrix}[fmt]
        return kind(X.asformat(fmt))
    if isinstance(X, np.ndarray) and X.dtype.kind in "biufc":
        return cupy.asarray(X)
    return X


def _to_host(a):
    import cupy

    return cupy.asnumpy(a)


class NearestNeighborsOnGPU(mgpu.NearestNeighbors):
    """``NearestNeighbors`` fed CuPy data by the test: X moved to the GPU in every method,
    the results moved back (test-only)."""

    def fit(self, X, y=None):
        gpu = _to_gpu(X)
        super().fit(gpu, y)
        from mgpu.backends import is_gpu_array

        # the point of the variant: CuPy data stays on the device as the index
        assert is_gpu_array(self._fit_X) == is_gpu_array(gpu)
        return self

    def kneighbors(self, X=None, n_neighbors=None, return_distance=True):
        out = super().kneighbors(None if X is None else _to_gpu(X), n_neighbors,
                                 return_distance)
        return tuple(_to_host(a) for a in out) if return_distance else _to_host(out)

    def kneighbors_graph(self, X=None, n_neighbors=None, mode="connectivity"):
        # the graph as NearestNeighbors builds it (with its own kneighbors, on the device:
        # a cupyx graph, brought to the host here), not from this class's host results
        plain = mgpu.NearestNeighbors.__new__(mgpu.NearestNeighbors)
        plain.__dict__.update(self.__dict__)
        return plain.kneighbors_graph(None if X is None else _to_gpu(X), n_neighbors,
                                      mode).get()


def _gpu_estimators():
    return [NearestNeighborsOnGPU(metric=m) for m in METRICS]


@pytest.mark.gpu
@parametrize_with_checks(_gpu_estimators(), expected_failed_checks=_expected_failed,
                         xfail_strict=True)
def test_sklearn_estimator_checks_on_gpu(estimator, check):
    check(estimator)


@pytest.mark.gpu
@pytest.mark.parametrize("check", KNEIGHBORS_CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("metric", METRICS)
def test_kneighbors_checks_on_gpu(metric, check):
    check(NearestNeighborsOnGPU(metric=metric))
