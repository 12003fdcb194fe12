"""GPU pairwise distances and kNN (kernels/knn.cu) against the float64 references and the
CPU path, on random CSR with empty, duplicate and long rows, and on real data."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from test_distances import _matrix, _reference, _rows_with_mass

import mgpu
from mgpu.ops.distances import SEMIRINGS

pytestmark = pytest.mark.gpu

# metrics where scipy's reference is NaN on rows without mass
_NEED_MASS = ("cosine", "correlation", "jensenshannon", "dice")


def _inputs(metric, m, n, seed, density=0.2):
    rng = np.random.default_rng(seed)
    ring = SEMIRINGS[metric]
    X = _matrix(rng, m, 30, density=density, nonnegative=ring.nonnegative)
    Y = _matrix(rng, n, 30, density=density, nonnegative=ring.nonnegative)
    if metric in _NEED_MASS:
        X, Y = _rows_with_mass(X), _rows_with_mass(Y)
    return X, Y


def _gpu(S, dense, dtype=np.float64):
    import cupy
    import cupyx.scipy.sparse as csp

    return cupy.asarray(S.toarray(), dtype=dtype) if dense else csp.csr_matrix(S.astype(dtype))


@pytest.mark.parametrize("metric", sorted(SEMIRINGS))
@pytest.mark.parametrize("dense", [False, True])
def test_gpu_pairwise_matches_float64_reference(metric, dense):
    import cupy

    X, Y = _inputs(metric, 37, 29, len(metric))
    p = 3.0 if metric == "minkowski" else 2
    ref = _reference(metric, X.toarray(), Y.toarray(), p)
    got = mgpu.pairwise_distances(_gpu(X, dense), _gpu(Y, dense), metric=metric, p=p)
    assert isinstance(got, cupy.ndarray) and got.dtype == np.float64
    got = got.get()
    assert got.shape == ref.shape
    assert np.array_equal(np.isinf(got), np.isinf(ref))
    fin = np.isfinite(ref)
    scale = max(1.0, float(np.abs(ref[fin]).max(initial=0.0)))
    np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-5, atol=1e-7 * scale)
    # Y omitted: X against itself
    self_d = mgpu.pairwise_distances(_gpu(X, dense), metric=metric, p=p).get()
    ref_self = _reference(metric, X.toarray(), X.toarray(), p)
    fin = np.isfinite(ref_self)
    np.testing.assert_allclose(self_d[fin], ref_self[fin], rtol=1e-5, atol=1e-7 * scale)


def _ties_only(index, queries, metric, p, d, i, ref_i, rtol):
    """Ids equal to the reference's except where distances tie; ties to the lower id."""
    full = mgpu.pairwise_distances(queries, index, metric=metric, p=p)
    ref_d = np.take_along_axis(full, ref_i, axis=1)
    differ = i != ref_i
    np.testing.assert_allclose(d[differ], ref_d[differ], rtol=rtol, atol=rtol)
    ties = d[:, 1:] == d[:, :-1]
    assert (i[:, 1:][ties] > i[:, :-1][ties]).all()


@pytest.mark.parametrize("metric", sorted(SEMIRINGS))
@pytest.mark.parametrize("k", [1, 10, 40, 150])
def test_gpu_knn_equals_cpu_knn(metric, k):
    """Every metric through the fused lists (k <= 16, k <= 128) and the key tile (k > 128),
    with a budget small enough to need several query batches."""
    import cupy

    X, Q = _inputs(metric, 400, 90, k + len(metric), density=0.1)
    X = sp.vstack([X, X[:30]]).tocsr()  # equal rows far apart: ties across warps
    p = 3.0 if metric == "minkowski" else 2
    rd, ri = mgpu.knn(X, Q, k, metric=metric, p=p)
    d, i = mgpu.knn(_gpu(X, False), _gpu(Q, False), k, metric=metric, p=p,
                    working_memory=200_000)
    assert isinstance(d, cupy.ndarray) and d.shape == (Q.shape[0], k) and i.dtype == np.int64
    d, i = d.get(), i.get()
    assert np.array_equal(np.isinf(d), np.isinf(rd))
    fin = np.isfinite(rd)
    np.testing.assert_allclose(d[fin], rd[fin], rtol=1e-9, atol=1e-9)
    _ties_only(X, Q, metric, p, d, i, ri, 1e-9)


@pytest.mark.parametrize("metric", ["euclidean", "cosine", "inner_product", "manhattan",
                                    "chebyshev", "jensenshannon"])
def test_gpu_knn_float32_and_dense(metric):
    """float32 keeps float32 results to float32 accuracy; dense input (cuBLAS for the
    expanded metrics) gives what sparse input gives."""
    X, Q = _inputs(metric, 500, 70, 3, density=0.15)
    rd, ri = mgpu.knn(X, Q, 8, metric=metric)
    for dense in (False, True):
        d, i = mgpu.knn(_gpu(X, dense, np.float32), _gpu(Q, dense, np.float32), 8,
                        metric=metric)
        assert d.dtype == np.float32
        d, i = d.get(), i.get()
        np.testing.assert_allclose(d, rd, rtol=2e-5, atol=2e-5)
        _ties_only(X, Q, metric, 2, d, i, ri, 1e-4)
        d64, i64 = mgpu.knn(_gpu(X, dense), _gpu(Q, dense), 8, metric=metric)
        np.testing.assert_allclose(d64.get(), rd, rtol=1e-9, atol=1e-9)


def test_gpu_ties_go_to_the_lower_index():
    import cupy

    index = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [5.0, 5.0]] * 40)
    d, i = mgpu.knn(cupy.asarray(index), cupy.asarray([[0.5, 0.5]]), 12, metric="manhattan")
    assert i.get().tolist() == [[0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13]]
    d, i = mgpu.knn(sp.csr_matrix(index), sp.csr_matrix([[1.0, 0.0]]), 3,
                    metric="inner_product")
    gd, gi = mgpu.knn(_gpu(sp.csr_matrix(index), False), _gpu(sp.csr_matrix([[1.0, 0.0]]), False),
                      3, metric="inner_product")
    assert gi.get().tolist() == i.tolist() == [[4, 9, 14]] and gd.get().tolist() == [[5.0] * 3]


def test_gpu_bad_input_is_refused():
    import cupy
    import cupyx.scipy.sparse as csp

    X = cupy.asarray(np.random.default_rng(1).standard_normal((6, 5)))
    with pytest.raises(ValueError, match=r"'k' parameter of knn must be an int in \[1, 6\]"):
        mgpu.knn(X, X, 7)
    with pytest.raises(ValueError, match=r"same number of columns\. Got 5 and 3"):
        mgpu.knn(X, X[:, :3], 2)
    bad = X.copy()
    bad[2, 3] = cupy.nan
    with pytest.raises(ValueError, match=r"'queries' parameter of knn holds NaN or infinity "
                                         r"\(first at row 2, column 3\)"):
        mgpu.knn(X, bad, 2)
    S = csp.csr_matrix(abs(X))
    S.data[4] = -1.0
    with pytest.raises(ValueError, match=r"non-negative for metric 'hellinger'\. Got a "
                                         r"negative value at row 0, column 4"):
        mgpu.pairwise_distances(S, metric="hellinger")
    with pytest.raises(TypeError, match="is on the GPU while the other input is not"):
        mgpu.knn(X.get(), X, 2)
    with pytest.raises(ValueError, match="'metric' parameter of knn"):
        mgpu.knn(X, X, 2, metric="nope")


def test_gpu_tile_of_distributed_knn_stays_on_the_device():
    """What a GPU worker does with its tile: prepare once on the device, answer host query
    batches with host results and global ids."""
    from mgpu.backends.cupy_knn import GpuIndex
    from mgpu.distributed.knn import _local_knn, _prepare_tile

    X, Q = _inputs("cosine", 300, 40, 9)
    tile = _prepare_tile(_gpu(X, False), "cosine", 2)
    assert isinstance(tile, GpuIndex)
    d, i = _local_knn(tile, Q, 5, "cosine", 2, 1000, None)
    rd, ri = mgpu.knn(X, Q, 5, metric="cosine")
    assert isinstance(d, np.ndarray) and np.array_equal(i, ri + 1000)
    np.testing.assert_allclose(d, rd, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("metric", ["manhattan", "chebyshev", "canberra", "hamming",
                                    "jensenshannon", "minkowski"])
def test_naive_union_peer_matches(metric):
    """The benchmark's one-thread-per-pair union kernel computes the same sums."""
    from mgpu.backends.cupy_knn import FORMS, naive_union

    X, Q = _inputs(metric, 60, 20, 4)
    if metric == "jensenshannon":
        X = sp.csr_matrix(sp.diags(1.0 / np.asarray(X.sum(1)).ravel()) @ X)
        Q = sp.csr_matrix(sp.diags(1.0 / np.asarray(Q.sum(1)).ravel()) @ Q)
    for S in (X, Q):
        S.sort_indices()  # the merge walks sorted rows (a product leaves them unsorted)
    got = naive_union(_gpu(X, False), _gpu(Q, False), FORMS[metric].op, 3.0).get()
    ref = _reference(metric, Q.toarray(), X.toarray(), 3.0)
    if metric == "minkowski":
        ref = ref ** 3
    elif metric == "hamming":
        ref = ref * X.shape[1]
    elif metric == "jensenshannon":
        ref = 2 * ref ** 2
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-12)


def test_gpu_real_corpus_neighbours(data_dir):
    import cupyx.scipy.sparse as csp
    from sklearn.neighbors import NearestNeighbors as SkNN

    from mgpu import io

    S = _rows_with_mass(io.load(str(data_dir / "bow" / "ap.dat.gz")).tocsr().astype(np.float64))
    Q = S[:200]
    for metric in ("cosine", "euclidean", "manhattan"):
        d, i = mgpu.knn(csp.csr_matrix(S), csp.csr_matrix(Q), 10, metric=metric)
        sk = "cityblock" if metric == "manhattan" else metric
        rd, ri = SkNN(n_neighbors=10, metric=sk, algorithm="brute").fit(S).kneighbors(Q)
        np.testing.assert_allclose(d.get(), rd, rtol=1e-5, atol=1e-9)
        _ties_only(S, Q, metric, 2, d.get(), i.get(), ri, 1e-7)


@pytest.mark.parametrize("metric", ["manhattan", "minkowski", "canberra", "hamming",
                                    "jensenshannon", "chebyshev"])
def test_gpu_equal_rows_are_at_exactly_zero(metric):
    """A query equal to index rows finds them at distance 0 (the union sums cancel exactly,
    Minkowski's root included), first the lower id."""
    X, _ = _inputs(metric, 120, 5, 6)
    X = sp.vstack([X, X[:30]]).tocsr()
    d, i = mgpu.knn(_gpu(X, False), _gpu(X[:30], False), 2, metric=metric, p=3)
    d, i = d.get(), i.get()
    has_mass = np.diff(X[:30].indptr) > 0
    assert (d[has_mass] == 0).all()
    assert (i[:, 0] <= np.arange(30)).all()
    assert np.array_equal(i, mgpu.knn(X, X[:30], 2, metric=metric, p=3)[1])


def test_gpu_nearest_neighbors_estimator_equals_cpu():
    import cupyx.scipy.sparse as csp

    X, Q = _inputs("manhattan", 150, 20, 11)
    X = sp.vstack([X, X[:10]]).tocsr()
    cpu = mgpu.NearestNeighbors(n_neighbors=4, metric="manhattan").fit(X)
    gpu = mgpu.NearestNeighbors(n_neighbors=4, metric="manhattan").fit(_gpu(X, False))
    for q in (None, Q):
        d, i = cpu.kneighbors(q)
        gd, gi = gpu.kneighbors(None if q is None else _gpu(q, False))
        np.testing.assert_allclose(gd.get(), d, rtol=1e-12, atol=1e-12)
        assert np.array_equal(gi.get(), i)
    G = gpu.kneighbors_graph(mode="distance")
    assert isinstance(G, csp.csr_matrix) and G.shape == (160, 160)
    ref = cpu.kneighbors_graph(mode="distance")
    assert abs(G.get() - ref).max() == 0 and G.nnz == ref.nnz


# ------------------------------------------- cancellation and symmetry (union, correlation)


@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gpu_a_large_shared_entry_keeps_a_small_unshared_one(dense, dtype):
    """The issue's examples: minkowski p=3 on [1e6, 1] vs [1e6, 0] is 1 both ways (it was 0
    one way), manhattan on [1e16, 1] vs [1e16, 0] is 1 (it was 0); also through kNN's lists
    and its key tile."""
    def g(a):
        return _gpu(sp.csr_matrix(np.array(a)), dense, dtype)

    a, b = g([[1e6, 1.0]]), g([[1e6, 0.0]])
    assert float(mgpu.pairwise_distances(a, b, metric="minkowski", p=3)[0, 0]) == 1.0
    assert float(mgpu.pairwise_distances(b, a, metric="minkowski", p=3)[0, 0]) == 1.0
    if dtype == np.float64:  # 1e16 + 1 is not a float32
        a, b = g([[1e16, 1.0]]), g([[1e16, 0.0]])
        for metric in ("manhattan", "canberra"):
            assert float(mgpu.pairwise_distances(a, b, metric=metric)[0, 0]) == 1.0
            assert float(mgpu.pairwise_distances(b, a, metric=metric)[0, 0]) == 1.0
        index = g([[1e16, 0.0], [1e16, 1.0]] * 100)
        for k in (2, 150):
            d, i = mgpu.knn(index, b, k, metric="manhattan")
            assert d.get()[0, :2].tolist() == [0.0, 0.0] and i.get()[0, :2].tolist() == [0, 2]
            assert (d.get()[0, 100:] == 1.0).all()


def _shared_big(seed, m, n=40):
    """Rows that share large entries (up to 1e16) and hold small unshared ones."""
    rng = np.random.default_rng(seed)
    S = _matrix(rng, m, n, density=0.25, nonnegative=True).toarray()
    S *= 10.0 ** rng.integers(-8, 2, S.shape)
    S[:, :3] = np.where(rng.random((m, 3)) < 0.8, [1e16, 3e12, 1e8], 0.0)
    S[2] = 0.0
    return S


@pytest.mark.parametrize("metric", ["manhattan", "minkowski", "canberra", "hamming",
                                    "jensenshannon", "chebyshev"])
@pytest.mark.parametrize("dense", [False, True])
def test_gpu_union_metrics_are_symmetric_to_the_bit_and_right(metric, dense):
    """d(x, y) == d(y, x) bitwise (pairwise, both orders), kNN's distances are the pairwise
    ones, and every distance is scipy's float64 within the sum's rounding (n + 2)·eps·d."""
    from test_metric_fuzz import reference

    X, Y = _shared_big(1, 50), _shared_big(2, 37)
    if metric == "jensenshannon":
        X, Y = X[X.sum(1) > 0], Y[Y.sum(1) > 0]
    p = 3.0 if metric == "minkowski" else 2
    Xg, Yg = _gpu(sp.csr_matrix(X), dense), _gpu(sp.csr_matrix(Y), dense)
    xy = mgpu.pairwise_distances(Xg, Yg, metric=metric, p=p).get()
    yx = mgpu.pairwise_distances(Yg, Xg, metric=metric, p=p).get()
    assert np.array_equal(xy, yx.T)
    ref, tol = reference(metric, X, Y, p)
    assert (np.abs(xy - ref) <= 4 * tol + 1e-300).all()
    for k in (5, Y.shape[0]):  # the fused lists, and all of them
        d, i = mgpu.knn(Yg, Xg, k, metric=metric, p=p)
        assert np.array_equal(d.get(), np.take_along_axis(xy, i.get(), axis=1))


@pytest.mark.parametrize("metric", ["manhattan", "canberra", "hamming"])
def test_gpu_fused_union_walk_equals_the_naive_merge_to_the_bit(metric):
    """Both kernels take the same three partial sums over the union in feature order, of the
    same IEEE terms (no pow or log): the same bits (hamming: exact integer sums)."""
    from mgpu.backends.cupy_knn import FORMS, naive_union

    X, Q = sp.csr_matrix(_shared_big(3, 60)), sp.csr_matrix(_shared_big(4, 20))
    got = mgpu.pairwise_distances(_gpu(Q, False), _gpu(X, False), metric=metric).get()
    sums = naive_union(_gpu(X, False), _gpu(Q, False), FORMS[metric].op, 2.0).get()
    if metric == "hamming":
        sums = sums / X.shape[1]
    assert np.array_equal(got, sums)


@pytest.mark.parametrize("dense", [False, True])
def test_gpu_manhattan_of_counts_takes_the_exact_form_and_the_walks_bits(dense):
    """Rows of integer counts take manhattan's dense-block form (sums exact below 2^53):
    the same bits as the union merge, and the CPU's; one non-integer value, or a row whose
    Σ|x| reaches 2^52, sends the pair to the union walk."""
    from mgpu.backends.cupy_knn import (FORMS, _counts, naive_union, prepare_index,
                                        prepare_queries)
    from mgpu.backends.knn_codes import KnnOp
    from mgpu.synthetic import powerlaw_corpus

    X = powerlaw_corpus(400, 120, 0.05, seed=5).astype(np.float64)
    Q = X[:40].copy()
    Q.data = Q.data * 3.0 - 7.0  # negative counts too
    Xg, Qg = _gpu(X, dense), _gpu(Q, dense)
    index = prepare_index(_gpu(X, False), "manhattan", 2.0)
    assert index.counts
    assert prepare_queries(index, _gpu(Q, False)).form.op == KnnOp.L1_COUNTS
    got = mgpu.pairwise_distances(Qg, Xg, metric="manhattan").get()
    sums = naive_union(_gpu(X, False), _gpu(Q, False), FORMS["manhattan"].op, 2.0).get()
    assert np.array_equal(got, sums)
    assert np.array_equal(got, mgpu.pairwise_distances(Q, X, metric="manhattan"))
    d, i = mgpu.knn(Xg, Qg, 7, metric="manhattan")
    cd, ci = mgpu.knn(X, Q, 7, metric="manhattan")
    assert np.array_equal(d.get(), cd) and np.array_equal(i.get(), ci)
    # a half, or a sum past 2^52: the walk
    H = Q.copy()
    H.data[0] += 0.5
    assert prepare_queries(index, _gpu(H, False)).form.op == KnnOp.L1
    big = sp.csr_matrix(np.array([[2.0**52, 1.0, 0.0]]))
    assert not _counts(_gpu(big, False)) and _counts(_gpu(big[:, 1:], False))
    assert _counts(_gpu(sp.csr_matrix((2, 3)), False))


@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("offset", [1e6, 1e8, 1e12])
def test_gpu_correlation_of_rows_with_a_large_offset(dense, offset):
    """standard_normal((4, 20)) + 1e8 gives scipy's 0, 1.23, 0.77, 1.06 (the GPU gave 1
    everywhere), within the condition-derived bound; also as kNN and against sparse
    rows that keep some zeros."""
    from test_metric_fuzz import reference

    X = np.random.default_rng(2).standard_normal((4, 20)) + offset
    ref, tol = reference("correlation", X, X, 2)
    got = mgpu.pairwise_distances(_gpu(sp.csr_matrix(X), dense), metric="correlation").get()
    assert (np.abs(got - ref) <= tol).all(), (got, ref, tol)
    Z = X.copy()
    Z[:, ::3] = 0.0  # implicit zeros beside the offset
    ref, tol = reference("correlation", Z, X, 2)
    got = mgpu.pairwise_distances(_gpu(sp.csr_matrix(Z), dense), _gpu(sp.csr_matrix(X), dense),
                                  metric="correlation").get()
    assert (np.abs(got - ref) <= tol).all(), (got, ref, tol)
    d, i = mgpu.knn(_gpu(sp.csr_matrix(X), dense), _gpu(sp.csr_matrix(Z), dense), 4,
                    metric="correlation")
    assert np.allclose(d.get(), np.take_along_axis(got, i.get(), axis=1), rtol=0, atol=1e-12)


def test_gpu_constant_rows_agree_dense_and_sparse():
    """Constant rows (decided exactly) are at distance 1 from every row, dense or CSR, as on
    the CPU (dense gave [[0.5, 1], [1, 1]] and CSR [[0.5, 2], [2, 1]] before)."""
    c = 0.5717852652004325
    Z = np.array([[c] * 3, [c / 2 + 0.01] * 3, [1.0, 2.0, 4.0], [0.0, 0.0, 0.0]])
    S = sp.csr_matrix(Z)
    cpu = mgpu.pairwise_distances(Z, metric="correlation")
    for dense in (False, True):
        got = mgpu.pairwise_distances(_gpu(S, dense), metric="correlation").get()
        off = np.ones((4, 4), dtype=bool)
        off[2, 2] = False
        assert (got[off] == 1.0).all() and abs(got[2, 2]) <= 1e-15
        np.testing.assert_allclose(got, cpu, rtol=0, atol=1e-15)
