"""The postings kernel of GPU kNN (mgpu/backends/cupy_knn_postings.py, kernels/knn.cu) and
the rule that chooses it: against a float64 reference of every dot-product metric and against
the fused kernel, to the bit, on inputs made to break it (empty rows in the index and the
queries, query features the index never holds, a feature in every row, duplicate rows across
tiles, a last tile shorter than k, float32 and float64)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import mgpu
from mgpu.backends.knn_codes import KNN_CODES, KnnOp
from mgpu.ops.distances import SEMIRINGS

pytestmark = pytest.mark.gpu

# the metrics whose distance is a function of the dot product and per-row statistics
EXPANDED = sorted(m for m, (op, _) in KNN_CODES.items() if op == KnnOp.DOT)
_BOOLEAN = ("dice", "jaccard", "russellrao")


def test_the_expanded_metrics_are_the_dot_product_ones():
    assert EXPANDED == ["cosine", "dice", "euclidean", "hellinger", "inner_product", "jaccard",
                        "russellrao", "sqeuclidean"]


def _reference(metric, X, Q):
    """float64 distances of every query to every row, by the definitions (with the kernels'
    values where a row has no mass: cosine 1, dice and jaccard 0)."""
    X, Q = X.toarray(), Q.toarray()
    n = X.shape[1]
    if metric in _BOOLEAN:
        X, Q = (X != 0).astype(float), (Q != 0).astype(float)
    if metric == "hellinger":
        X, Q = np.sqrt(X), np.sqrt(Q)
    dot = Q @ X.T
    xs, qs = (X * X).sum(1)[None, :], (Q * Q).sum(1)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        if metric in ("euclidean", "sqeuclidean"):
            d = np.maximum(xs + qs - 2 * dot, 0.0)
            return np.sqrt(d) if metric == "euclidean" else d
        if metric == "cosine":
            den = np.sqrt(xs) * np.sqrt(qs)
            return np.where(den > 0, np.clip(1 - dot / den, 0, 2), 1.0)
        if metric == "inner_product":
            return dot
        if metric == "hellinger":
            return np.sqrt(np.maximum(1 - dot, 0.0))
        if metric == "russellrao":
            return (n - dot) / n
        xc, qc = X.sum(1)[None, :], Q.sum(1)[:, None]
        den = xc + qc if metric == "dice" else xc + qc - dot
        return np.where(den > 0, (xc + qc - 2 * dot) / den, 0.0)


def _best(metric, ref, k):
    """The reference's k best per query, ties to the lower row."""
    key = -ref if metric == "inner_product" else ref
    order = np.argsort(key, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(ref, order, axis=1), order


def _corpus(metric, n_rows, seed, n_features=300):
    """An index of n_rows (several tiles) and queries made to break the postings kernel."""
    rng = np.random.default_rng(seed)
    nonneg = SEMIRINGS[metric].nonnegative or metric in _BOOLEAN
    values = ((lambda k: rng.uniform(0.1, 2.0, k)) if nonneg
              else (lambda k: rng.standard_normal(k)))
    X = sp.random(n_rows, n_features, density=0.02, format="lil", random_state=rng,
                  data_rvs=values)
    X[:, 0] = 1.0  # a feature in every row
    X[:, n_features - 10:] = 0  # features no row holds
    for r in (2, 7, n_rows - 2):
        X[r, :] = 0  # empty rows, one in the last tile
    for r in (n_rows // 2, n_rows - 1):
        X[r, :] = X[3, :]  # duplicates of row 3 in later tiles: ties
    Q = sp.random(60, n_features, density=0.03, format="lil", random_state=rng,
                  data_rvs=values)
    Q[0, :] = 0  # an empty query
    Q[1, :] = 0
    Q[1, n_features - 10:] = values(10)  # only features the index never holds
    Q[2, :] = X[3, :]  # equal to three index rows
    Q[3, :] = 0
    Q[3, 0] = 2.0  # only the feature every row holds
    return sp.csr_matrix(X), sp.csr_matrix(Q)


def _gpu(S, dtype):
    import cupyx.scipy.sparse as csp

    return csp.csr_matrix(S.astype(dtype))


def _run(kernel, X, Q, k, metric, dtype, blocks_per_sm=2, **kw):
    from mgpu.backends import cupy_knn_postings as postings

    with postings.forced(kernel, blocks_per_sm):
        d, i = mgpu.knn(_gpu(X, dtype), _gpu(Q, dtype), k, metric=metric, **kw)
        assert postings.last_choice()["kernel"] == kernel, postings.last_choice()
    assert d.dtype == dtype and i.dtype == np.int64
    return d.get(), i.get()


def _check_reference(metric, X, Q, d, i, k, dtype):
    """Distances as the reference's of the same (rounded) input, ids as its ids except among
    distances that tie to rounding, and equal keys ordered by id."""
    X, Q = X.astype(dtype).astype(np.float64), Q.astype(dtype).astype(np.float64)
    rtol = 1e-9 if dtype == np.float64 else 2e-5
    # the expanded forms near 0: sqrt of a difference of squared norms (docs/metrics.md)
    sq = max(1.0, float(X.multiply(X).sum(axis=1).max()), float(Q.multiply(Q).sum(axis=1).max()))
    atol = {"euclidean": 1e-7 * np.sqrt(sq), "sqeuclidean": 1e-13 * sq,
            "hellinger": 1e-7}.get(metric, 0.0) + rtol
    ref = _reference(metric, X, Q)
    rd, _ = _best(metric, ref, k)
    np.testing.assert_allclose(d, rd, rtol=rtol, atol=atol)
    got = np.take_along_axis(ref, i, axis=1)
    np.testing.assert_allclose(got, rd, rtol=rtol, atol=atol)
    exact = d[:, 1:] == d[:, :-1]
    assert (i[:, 1:][exact] > i[:, :-1][exact]).all()  # equal keys: lower id first


@pytest.mark.parametrize("blocks_per_sm", [2, 4])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("metric", EXPANDED)
def test_postings_equal_the_fused_kernel_to_the_bit_and_the_reference(metric, dtype,
                                                                      blocks_per_sm):
    """At both tile sizes the tuner weighs (the larger past 48 KiB of shared memory)."""
    from mgpu.backends.cupy_knn_postings import TILE_BLOCKS, tile_rows

    assert blocks_per_sm in TILE_BLOCKS
    R = tile_rows(blocks_per_sm)
    X, Q = _corpus(metric, 2 * R + 37, len(metric))  # a last tile of 37 rows
    for k in (1, 10, 40):  # lists of 16 and of 128; k beyond the last tile's rows
        d, i = _run("postings", X, Q, k, metric, dtype, blocks_per_sm)
        fd, fi = _run("fused", X, Q, k, metric, dtype)
        assert np.array_equal(i, fi) and np.array_equal(d, fd), (metric, k)
        _check_reference(metric, X, Q, d, i, k, dtype)
        if metric in ("euclidean", "sqeuclidean") and k >= 3:
            # the query equal to row 3 and its duplicates in the second and third tiles
            assert i[2, :3].tolist() == [3, X.shape[0] // 2, X.shape[0] - 1]
            assert d[2, 0] == d[2, 1] == d[2, 2]


@pytest.mark.parametrize("metric", ["cosine", "euclidean", "inner_product"])
def test_postings_in_many_launches_and_one_tile(metric):
    """A working memory of a few queries a launch; an index of one tile."""
    from mgpu.backends.cupy_knn_postings import tile_rows

    X, Q = _corpus(metric, tile_rows() + 500, 3)
    d, i = _run("postings", X, Q, 10, metric, np.float64, working_memory=4096)
    fd, fi = _run("fused", X, Q, 10, metric, np.float64)
    assert np.array_equal(i, fi) and np.array_equal(d, fd)
    X1, Q1 = _corpus(metric, 400, 4)
    d, i = _run("postings", X1, Q1, 16, metric, np.float64)
    _check_reference(metric, X1, Q1, d, i, 16, np.float64)


@pytest.mark.parametrize("metric", ["cosine", "dice"])
def test_postings_when_k_exceeds_the_index_rows(metric):
    """A prepared tile of distributed kNN smaller than k: k is capped at its rows."""
    from mgpu.backends import cupy_knn_postings as postings
    from mgpu.ops.distances import knn_prepared, prepare_index, resolve_metric

    X, Q = _corpus(metric, 12, 5, n_features=40)
    ring, p = resolve_metric(metric, 2, func="knn")
    tile = prepare_index(_gpu(X, np.float64), ring, p)
    with postings.forced("postings"):
        d, i = knn_prepared(tile, Q, 20, ring, p)
        assert postings.last_choice()["kernel"] == "postings"
    assert d.shape == (Q.shape[0], 12)
    _check_reference(metric, X, Q, d, i, 12, np.float64)
    assert sorted(i[5].tolist()) == list(range(12))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("metric", EXPANDED)
def test_the_rule_s_choice_is_right_and_said(metric, dtype):
    """Whichever kernel the measured rule takes, the answer is the reference's; the choice
    is recorded with its reason, measured once per shape class and then taken from it."""
    from mgpu.backends import cupy_knn_postings as postings
    from mgpu.backends.cupy_knn_postings import tile_rows

    X, Q = _corpus(metric, tile_rows() + 91, 11)
    Xg, Qg = _gpu(X, dtype), _gpu(Q, dtype)
    reasons = []
    for _ in range(2):
        d, i = mgpu.knn(Xg, Qg, 10, metric=metric)
        choice = postings.last_choice()
        assert choice["kernel"] in postings.KERNELS
        if choice["kernel"] == "postings":
            assert choice["tile_rows"] in [tile_rows(b) for b in postings.TILE_BLOCKS]
        reasons.append(choice["reason"])
        _check_reference(metric, X, Q, d.get(), i.get(), 10, dtype)
    # a shape class is timed once; the model may decide without timing
    assert reasons[1] in ("tuned for its shape class",) or reasons[1].startswith("model")


def test_the_rule_keeps_the_fused_kernel_where_postings_cannot_run():
    from mgpu.backends import cupy_knn_postings as postings

    X, Q = _corpus("manhattan", 300, 2)
    with postings.forced("postings"):
        mgpu.knn(_gpu(X, np.float64), _gpu(Q, np.float64), 5, metric="manhattan")
    assert postings.last_choice()["kernel"] == "fused"
    assert "not a dot-product metric" in postings.last_choice()["reason"]
    X, Q = _corpus("cosine", 300, 2)
    with postings.forced("postings"):
        mgpu.knn(_gpu(X, np.float64), _gpu(Q, np.float64), 150, metric="cosine")
    assert "beyond the lists" in postings.last_choice()["reason"]
    import cupy

    mgpu.knn(cupy.asarray(X.toarray()), cupy.asarray(Q.toarray()), 5, metric="cosine")
    assert postings.last_choice()["kernel"] == "cublas"
    with pytest.raises(ValueError, match="The 'kernel' parameter of forced must be one of "
                                         r"\['fused', 'postings'\] or None. Got 'bogus'"):
        with postings.forced("bogus"):
            pass


def test_the_tuner_s_sample_is_spread_over_the_call_s_queries():
    """Every (n // m)-th query with its features, values and statistics: the rates of the
    call's mix, where the first queries of a corpus are its longest documents."""
    import cupy

    from mgpu.backends import cupy_knn_postings as postings
    from mgpu.backends.cupy_knn import prepare_index, prepare_queries

    X, _ = _corpus("cosine", 500, 21)
    Q = sp.csr_matrix(X[:103])
    Q.sort_indices()
    index = prepare_index(_gpu(X, np.float64), "cosine", 2.0)
    qs = prepare_queries(index, _gpu(Q, np.float64))
    part = postings.sample(qs, 10, X.shape[1])
    sel = np.arange(10) * 10
    assert part.n == 10 and part.ptr.dtype == cupy.int32 and part.idx.dtype == cupy.int32
    got = sp.csr_matrix((part.val.get(), part.idx.get(), part.ptr.get()), shape=(10, X.shape[1]))
    want = sp.csr_matrix((qs.val.get(), qs.idx.get(), qs.ptr.get()), shape=Q.shape)[sel]
    assert (got != want).nnz == 0 and got.has_sorted_indices
    stats = [(a, b) for a, b in ((part.s1, qs.s1), (part.s2, qs.s2)) if b is not None]
    assert stats  # cosine's norms
    for a, b in stats:
        np.testing.assert_array_equal(a.get(), b.get()[sel])
    assert postings.sample(qs, 103, X.shape[1]) is qs


def test_the_postings_kernel_s_own_shared_memory_is_what_the_tiles_leave_it():
    """tile_rows leaves _STATIC_SMEM beside the tile: the kernel's static shared memory must
    fit in it, or two blocks would not share an SM (or a launch would fail)."""
    from mgpu.backends import cupy_knn_postings as postings
    from mgpu.backends.instances import KNN_GROUPS
    from mgpu.backends.loader import get_function

    for expression in KNN_GROUPS["postings"]:
        if expression.startswith("mgpu_knn_postings"):
            fn = get_function("knn.cu", expression, KNN_GROUPS["postings"])
            assert 0 < fn.shared_size_bytes <= postings._STATIC_SMEM, expression
    assert postings.tile_rows(2) > postings.tile_rows(4) >= 32
    assert postings.tile_rows(2) % 32 == 0 and postings.tile_rows(2) <= 65504


def test_forced_refuses_a_bad_blocks_per_sm():
    from mgpu.backends import cupy_knn_postings as postings

    with pytest.raises(ValueError, match="The 'blocks_per_sm' parameter of forced must be an "
                                         "int >= 1. Got 0 instead."):
        with postings.forced("postings", 0):
            pass


@pytest.mark.parametrize("metric", ["cosine", "euclidean", "inner_product"])
def test_postings_of_a_dense_index_with_sparse_queries(metric):
    """A dense index keeps no CSR for cuBLAS: the postings are made from the one the sparse
    queries make, and equal the fused kernel's answer to the bit."""
    import cupy

    from mgpu.backends import cupy_knn_postings as postings

    X, Q = _corpus(metric, 700, 8)
    got = {}
    for kernel in ("fused", "postings"):
        with postings.forced(kernel):
            d, i = mgpu.knn(cupy.asarray(X.toarray()), _gpu(Q, np.float64), 10, metric=metric)
            assert postings.last_choice()["kernel"] == kernel
        got[kernel] = (d.get(), i.get())
    assert np.array_equal(got["postings"][0], got["fused"][0])
    assert np.array_equal(got["postings"][1], got["fused"][1])
    _check_reference(metric, X, Q, *got["postings"], 10, np.float64)
