"""GPU kNN in one launch for the whole query set against the same call cut into many
launches by a small working memory, and both against float64 references: sparse and dense,
the key tile of small indexes and the per-warp lists of large ones, ties from duplicate rows,
empty rows, k from 1 to the index's rows."""
from __future__ import annotations

import dask.config
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.spatial.distance import cdist
from test_distances import _matrix, _rows_with_mass
from test_knn_gpu import _gpu

import mgpu

pytestmark = pytest.mark.gpu

_SCIPY = {"manhattan": "cityblock", "chebyshev": "chebyshev"}


def _data(metric: str, n_index: int, n_queries: int, n_features: int, seed: int,
          density: float = 0.2) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """An index with rows repeated far apart (ties across warps and groups) and an empty
    row where the metric defines it; queries that include copies of index rows."""
    rng = np.random.default_rng(seed)
    X = _matrix(rng, n_index, n_features, density=density, nonnegative=False)
    Q = _matrix(rng, n_queries, n_features, density=density, nonnegative=False)
    X = sp.vstack([X, X[: n_index // 10]]).tocsr()
    Q = sp.vstack([Q, X[5: 5 + n_queries // 5]]).tocsr()
    if metric == "cosine":
        X, Q = _rows_with_mass(X), _rows_with_mass(Q)
    else:
        X = sp.vstack([X, sp.csr_matrix((1, n_features))]).tocsr()
        Q = sp.vstack([sp.csr_matrix((1, n_features)), Q]).tocsr()
    return X, Q


def _reference(metric: str, X: sp.csr_matrix, Q: sp.csr_matrix) -> np.ndarray:
    if metric == "inner_product":
        return -(Q.toarray() @ X.toarray().T)
    return cdist(Q.toarray(), X.toarray(), _SCIPY.get(metric, metric))


def _check(d, i, ref: np.ndarray, k: int, similarity: bool = False,
           rtol: float = 1e-6) -> None:
    """Distances as the float64 reference's k smallest keys (the expanded forms lose about
    half the digits of an almost-zero distance); ids among each distance's ties, lower ids
    first among equal distances."""
    want = np.sort(ref, axis=1)[:, :k]
    atol = rtol * max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(-d if similarity else d, want, rtol=rtol, atol=atol)
    np.testing.assert_allclose(np.take_along_axis(ref, i, axis=1), want, rtol=rtol, atol=atol)
    assert (np.diff(np.sort(i, axis=1), axis=1) > 0).all()  # distinct ids
    ties = d[:, 1:] == d[:, :-1]
    assert (i[:, 1:][ties] > i[:, :-1][ties]).all()


def _launches(X, Q, k, metric, working_memory=None) -> int:
    from mgpu.backends.cupy_knn import knn_batches

    return knn_batches(X, Q, k, metric, working_memory).launches


@pytest.mark.parametrize("metric", ["cosine", "euclidean", "manhattan", "chebyshev",
                                    "inner_product"])
@pytest.mark.parametrize("dense", [False, True])
def test_one_launch_equals_many_and_the_float64_reference(metric, dense):
    X, Q = _data(metric, 300, 260, 40, len(metric) + dense)
    n = X.shape[0]
    Xg, Qg = _gpu(X, dense), _gpu(Q, dense)
    ref = _reference(metric, X, Q)
    for k in (1, 10, 40, n):
        assert _launches(Xg, Qg, k, metric) == 1
        d1, i1 = mgpu.knn(Xg, Qg, k, metric=metric)
        small = 3 * (Q.shape[1] + n) * 8 + 1  # bytes for about three queries a launch
        assert _launches(Xg, Qg, k, metric, small) > 50
        dn, in_ = mgpu.knn(Xg, Qg, k, metric=metric, working_memory=small)
        d1, i1, dn, in_ = d1.get(), i1.get(), dn.get(), in_.get()
        assert d1.shape == (Q.shape[0], k) and i1.dtype == np.int64
        if dense:  # cuBLAS may sum a product in another order at another batch size,
            # which moves an almost-zero expanded distance by about sqrt(eps) · scale
            scale = max(1.0, float(np.abs(ref).max()))
            np.testing.assert_allclose(d1, dn, rtol=1e-9, atol=1e-6 * scale)
        else:  # the same kernel computes each pair the same way in any launch
            assert np.array_equal(d1, dn) and np.array_equal(i1, in_)
        for d, i in ((d1, i1), (dn, in_)):
            _check(d, i, ref, k, metric == "inner_product")
    with pytest.raises(ValueError, match=rf"'k' parameter of knn must be an int in \[1, {n}\]"):
        mgpu.knn(Xg, Qg, n + 1, metric=metric)


@pytest.mark.parametrize("metric", ["cosine", "euclidean", "inner_product"])
def test_dense_and_sparse_sides_mixed(metric):
    """A dense index keeps no CSR copy for cuBLAS; sparse queries make it on first use."""
    from mgpu.backends.cupy_knn import prepare_index, prepare_queries

    X, Q = _data(metric, 250, 120, 30, 21)
    ref = _reference(metric, X, Q)
    for xd, qd in ((True, False), (False, True)):
        d, i = mgpu.knn(_gpu(X, xd), _gpu(Q, qd), 7, metric=metric)
        _check(d.get(), i.get(), ref, 7, metric == "inner_product")
    index = prepare_index(_gpu(X, True), metric, 2.0)
    assert index.X is None and index.dense is not None and index.shape == X.shape
    assert prepare_queries(index, _gpu(Q, True)).dense is not None and index.X is None
    X_csr, order = index.csr()
    assert X_csr.nnz == X.nnz and sorted(order.get().tolist()) == list(range(X.shape[0]))


@pytest.mark.parametrize("k", [1, 2])
def test_the_lists_of_a_large_index_in_one_launch_and_in_many(k):
    """An index with more rows than the warps' lists hold keeps the lists (not every key):
    one launch of many groups and many launches agree, and match the reference."""
    from mgpu.backends.cupy import current_facts
    from mgpu.backends.cupy_knn import knn_batches

    n = current_facts().sms * 4 * 8 * k + 700
    X, Q = _data("euclidean", n, 300, 12, k, density=0.4)
    Xg, Qg = _gpu(X, False), _gpu(Q, False)
    plan = knn_batches(Xg, Qg, k, "euclidean")
    assert not plan.tile and plan.launches == 1 and plan.groups >= 3
    d1, i1 = mgpu.knn(Xg, Qg, k, metric="euclidean")
    wm = 5 * plan.query_bytes
    assert knn_batches(Xg, Qg, k, "euclidean", wm).launches > 50
    dn, in_ = mgpu.knn(Xg, Qg, k, metric="euclidean", working_memory=wm)
    d1, i1 = d1.get(), i1.get()
    assert np.array_equal(d1, dn.get()) and np.array_equal(i1, in_.get())
    _check(d1, i1, _reference("euclidean", X, Q), k)


@pytest.mark.parametrize("metric", ["euclidean", "manhattan", "canberra", "hamming"])
def test_float32_one_launch_equals_the_cpu_path(metric):
    """float32 keys (the benchmarks' dtype) in one launch: the CPU's float64 neighbours up to
    float32 rounding, ties to the lower id."""
    X, Q = _data(metric, 500, 400, 30, 3)
    if metric == "hamming":
        X.data, Q.data = np.round(X.data), np.round(Q.data)
        X.eliminate_zeros()
        Q.eliminate_zeros()
    Xg, Qg = _gpu(X, False, np.float32), _gpu(Q, False, np.float32)
    assert _launches(Xg, Qg, 10, metric) == 1
    d, i = mgpu.knn(Xg, Qg, 10, metric=metric)
    rd, _ = mgpu.knn(X.astype(np.float32).astype(np.float64),
                     Q.astype(np.float32).astype(np.float64), 10, metric=metric)
    assert d.dtype == np.float32
    np.testing.assert_allclose(d.get(), rd, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("metric", ["euclidean", "chebyshev", "canberra"])
def test_pairwise_distances_in_one_launch_and_in_many(metric):
    X, Q = _data(metric, 200, 150, 25, 8)
    ref = _reference(metric, X, Q)
    got = mgpu.pairwise_distances(_gpu(Q, False), _gpu(X, False), metric=metric).get()
    with dask.config.set({"mgpu.knn.working-memory": 3 * 25 * 8}):
        cut = mgpu.pairwise_distances(_gpu(Q, False), _gpu(X, False), metric=metric).get()
    assert np.array_equal(got, cut)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6 * max(1.0, np.abs(ref).max()))


def test_real_corpus_in_one_launch(data_dir):
    """AP, every document a query (the benchmark's call): one launch, neighbours as the
    float64 brute force gives them up to ties."""
    import cupyx.scipy.sparse as csp
    from sklearn.neighbors import NearestNeighbors as SkNN

    from mgpu import io

    S = _rows_with_mass(io.load(str(data_dir / "bow" / "ap.dat.gz")).tocsr().astype(np.float64))
    Sg = csp.csr_matrix(S)
    assert _launches(Sg, Sg, 10, "cosine") == 1
    d, i = mgpu.knn(Sg, Sg, 10, metric="cosine")
    rd, ri = SkNN(n_neighbors=10, metric="cosine", algorithm="brute").fit(S).kneighbors(S[:300])
    np.testing.assert_allclose(d.get()[:300], rd, rtol=1e-5, atol=1e-9)
    same = i.get()[:300] == ri
    np.testing.assert_allclose(d.get()[:300][~same], rd[~same], rtol=1e-9, atol=1e-9)
