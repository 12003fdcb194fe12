"""Pairwise distances, kNN and NearestNeighbors against scipy and scikit-learn in float64."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.spatial.distance import cdist
from scipy.special import rel_entr

import mgpu
from mgpu.backends.numpy_knn import nbytes
from mgpu.ops.distances import SEMIRINGS, top_k, working_memory_for

# scipy's name of each metric, and the input it is defined on
_SCIPY = {"euclidean": "euclidean", "sqeuclidean": "sqeuclidean", "cosine": "cosine",
          "correlation": "correlation", "manhattan": "cityblock", "chebyshev": "chebyshev",
          "canberra": "canberra", "hamming": "hamming", "jensenshannon": "jensenshannon",
          "dice": "dice", "jaccard": "jaccard", "russellrao": "russellrao"}
_BOOLEAN = {"dice", "jaccard", "russellrao"}


def _reference(metric: str, X: np.ndarray, Y: np.ndarray, p: float = 2) -> np.ndarray:
    """float64 distances by scipy, or by their definition where scipy has none."""
    if metric == "minkowski":
        return cdist(X, Y, "minkowski", p=p)
    if metric == "inner_product":
        return X @ Y.T
    if metric == "hellinger":
        return np.sqrt(np.maximum(1.0 - np.sqrt(X) @ np.sqrt(Y).T, 0.0))
    if metric == "kl_divergence":
        return np.array([[rel_entr(x, y).sum() for y in Y] for x in X])
    if metric in _BOOLEAN:
        return cdist(X != 0, Y != 0, _SCIPY[metric])
    return cdist(X, Y, _SCIPY[metric])


def _matrix(rng, m, n, density=0.2, nonnegative=False):
    """Empty rows, a duplicated row and one long (dense) row; no constant rows."""
    S = sp.random(m, n, density=density, format="lil", random_state=rng,
                  data_rvs=(lambda k: rng.uniform(0.1, 2.0, k)) if nonnegative
                  else (lambda k: rng.standard_normal(k)))
    S[1, :] = rng.uniform(0.5, 1.5, n)  # long row
    S[2, :] = 0  # empty row
    S[3, :] = S[4, :]  # duplicate rows
    S = sp.csr_matrix(S)
    S.eliminate_zeros()
    return S


def _rows_with_mass(S):
    keep = np.flatnonzero(np.asarray(abs(S).sum(axis=1)).ravel() > 0)
    return S[keep]


@pytest.mark.parametrize("metric", sorted(SEMIRINGS))
@pytest.mark.parametrize("dense", [False, True])
def test_every_metric_matches_float64_reference(metric, dense):
    rng = np.random.default_rng(len(metric))
    ring = SEMIRINGS[metric]
    X = _matrix(rng, 40, 25, nonnegative=ring.nonnegative)
    Y = _matrix(rng, 23, 25, nonnegative=ring.nonnegative)
    if metric in ("cosine", "correlation", "jensenshannon", "dice"):
        # scipy gives NaN for zero rows here; those are checked on their own below
        X, Y = _rows_with_mass(X), _rows_with_mass(Y)
    p = 3.0 if metric == "minkowski" else 2
    ref = _reference(metric, X.toarray(), Y.toarray(), p)
    got = mgpu.pairwise_distances(X.toarray() if dense else X, Y.toarray() if dense else Y,
                                  metric=metric, p=p)
    assert got.shape == ref.shape and got.dtype == np.float64
    assert np.array_equal(np.isinf(got), np.isinf(ref))
    fin = np.isfinite(ref)
    scale = max(1.0, float(np.abs(ref[fin]).max(initial=0.0)))
    np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-5, atol=1e-7 * scale)


def test_kl_divergence_is_infinite_where_support_is_missing():
    X = sp.csr_matrix(np.array([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]))
    Y = sp.csr_matrix(np.array([[1.0, 0.0, 0.0], [0.2, 0.3, 0.5]]))
    d = mgpu.pairwise_distances(X, Y, metric="kl_divergence")
    assert math.isinf(d[0, 0]) and np.isfinite(d[0, 1]) and d[1, 0] == 0.0


def test_conventions_for_zero_rows():
    Z = np.zeros((1, 4))
    x = np.array([[1.0, 0.0, 2.0, 0.0]])
    for metric in ("cosine", "correlation"):
        assert mgpu.pairwise_distances(Z, x, metric=metric)[0, 0] == 1.0
    assert mgpu.pairwise_distances(Z, Z, metric="dice")[0, 0] == 0.0
    assert mgpu.pairwise_distances(Z, Z, metric="jaccard")[0, 0] == 0.0


def test_aliases_and_minkowski_special_cases():
    rng = np.random.default_rng(0)
    X, Y = rng.standard_normal((6, 5)), rng.standard_normal((4, 5))
    for alias, p in (("l1", 2), ("cityblock", 2), ("minkowski", 1)):
        np.testing.assert_allclose(mgpu.pairwise_distances(X, Y, metric=alias, p=p),
                                   cdist(X, Y, "cityblock"))
    np.testing.assert_allclose(mgpu.pairwise_distances(X, Y, metric="minkowski", p=math.inf),
                               cdist(X, Y, "chebyshev"))
    np.testing.assert_allclose(mgpu.pairwise_distances(X, metric="minkowski", p=0.5),
                               cdist(X, X, "minkowski", p=0.5))


@pytest.mark.parametrize("metric", ["euclidean", "cosine", "manhattan", "jaccard", "canberra"])
def test_knn_equals_scikit_learn_brute_force(metric):
    from sklearn.neighbors import NearestNeighbors as SkNN

    rng = np.random.default_rng(5)
    index = _matrix(rng, 300, 40, density=0.1)
    queries = _matrix(rng, 57, 40, density=0.1)
    if metric == "cosine":
        index, queries = _rows_with_mass(index), _rows_with_mass(queries)
    # a tiny budget: query batches of 10 (the metric's copies of the index and of a batch's
    # distances, as the semiring table counts them)
    budget = working_memory_for(10, 300, SEMIRINGS[metric], nbytes(index))
    d, i = mgpu.knn(index, queries, 7, metric=metric, working_memory=budget)
    sk_metric = "cityblock" if metric == "manhattan" else metric
    sk_X, sk_Q = (index.toarray() != 0, queries.toarray() != 0) if metric == "jaccard" else \
        (index.toarray(), queries.toarray())
    ref_d, ref_i = SkNN(n_neighbors=7, algorithm="brute", metric=sk_metric).fit(sk_X) \
        .kneighbors(sk_Q)
    np.testing.assert_allclose(d, ref_d, rtol=1e-5, atol=1e-9)
    _same_neighbours_up_to_ties(index, queries, metric, d, i, ref_i)


def _same_neighbours_up_to_ties(index, queries, metric, d, i, ref_i):
    """Where the ids differ from the reference the distances tie, and ours break ties
    toward the lower index."""
    full = mgpu.pairwise_distances(queries, index, metric=metric)
    ref_d = np.take_along_axis(full, ref_i, axis=1)
    differ = i != ref_i
    np.testing.assert_allclose(d[differ], ref_d[differ], rtol=1e-12, atol=1e-12)
    ties = d[:, 1:] == d[:, :-1]
    assert (i[:, 1:][ties] > i[:, :-1][ties]).all()


def test_knn_ties_go_to_the_lower_index():
    index = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [5.0, 5.0]])
    d, i = mgpu.knn(index, np.array([[0.5, 0.5]]), 3)
    assert i.tolist() == [[0, 1, 2]]
    assert top_k(np.array([[2.0, 1.0, 1.0, 1.0]]), 2)[1].tolist() == [[1, 2]]
    assert top_k(np.array([[2.0, 1.0, 3.0, 3.0]]), 2, largest=True)[1].tolist() == [[2, 3]]


def test_inner_product_keeps_the_largest():
    index = np.array([[1.0, 0.0], [3.0, 0.0], [2.0, 0.0]])
    d, i = mgpu.knn(index, np.array([[1.0, 0.0]]), 2, metric="inner_product")
    assert i.tolist() == [[1, 2]] and d.tolist() == [[3.0, 2.0]]


def test_nearest_neighbors_estimator_matches_scikit_learn():
    from sklearn.neighbors import NearestNeighbors as SkNN

    rng = np.random.default_rng(8)
    X = rng.standard_normal((80, 6))
    X[10] = X[11]  # an exact duplicate: ties, and self-exclusion as scikit-learn does it
    ours = mgpu.NearestNeighbors(n_neighbors=4, metric="manhattan").fit(sp.csr_matrix(X))
    ref = SkNN(n_neighbors=4, metric="manhattan", algorithm="brute").fit(X)
    for q in (None, X[:9] + 0.01):
        d, i = ours.kneighbors(q)
        rd, ri = ref.kneighbors(q)
        np.testing.assert_allclose(d, rd, atol=1e-12)
        _same_neighbours_up_to_ties(X, X if q is None else q, "manhattan", d, i, ri)
    # the duplicate: its twin at distance 0 comes first, itself excluded
    assert ours.kneighbors(n_neighbors=1)[1][[10, 11], 0].tolist() == [11, 10]
    G = ours.kneighbors_graph(mode="distance")
    assert G.shape == (80, 80) and G.nnz == 320 and G.diagonal().max() == 0
    np.testing.assert_allclose(np.sort(G.data.reshape(80, 4), axis=1),
                               ours.kneighbors()[0], atol=0)
    assert ours.kneighbors(n_neighbors=2, return_distance=False).shape == (80, 2)
    assert ours.get_params() == {"n_neighbors": 4, "metric": "manhattan", "p": 2}
    with pytest.raises(ValueError, match="Expected n_neighbors <= n_samples_fit"):
        ours.kneighbors(n_neighbors=80)
    with pytest.raises(ValueError, match="not fitted yet"):
        mgpu.NearestNeighbors().kneighbors(X)
    with pytest.raises(ValueError, match="'mode' parameter of kneighbors_graph"):
        ours.kneighbors_graph(mode="weights")


@pytest.mark.parametrize("call, exc, match", [
    (lambda X: mgpu.pairwise_distances(X, metric="braycurtis"), ValueError,
     r"'metric' parameter of pairwise_distances must be a str among \{.*'canberra'.*\}\. "
     r"Got 'braycurtis'"),
    (lambda X: mgpu.pairwise_distances(X, metric="minkowski", p=0), ValueError,
     r"'p' parameter of pairwise_distances must be a number > 0"),
    (lambda X: mgpu.pairwise_distances(X, X[:, :3]), ValueError,
     r"same number of columns\. Got 5 and 3"),
    (lambda X: mgpu.pairwise_distances(-abs(X) - 1, metric="hellinger"), ValueError,
     r"must be non-negative for metric 'hellinger'\. Got a negative value at row 0, column 0"),
    (lambda X: mgpu.pairwise_distances(np.vstack([abs(X), np.zeros((1, 5))]),
                                       metric="jensenshannon"), ValueError,
     r"rows that sum to 0 \(first: row 6\)"),
    (lambda X: mgpu.knn(X, X, 0), ValueError, r"'k' parameter of knn must be an int in \[1, 6\]"),
    (lambda X: mgpu.knn(X, X, 7), ValueError, r"Got 7 instead"),
    (lambda X: mgpu.knn(np.where(X > 1, np.nan, X), X, 2), ValueError,
     r"'index' parameter of knn holds NaN or infinity \(first at row"),
    (lambda X: mgpu.pairwise_distances(X.tolist()), TypeError,
     r"must be a 2-D numpy array or a scipy sparse matrix\. Got list"),
    (lambda X: mgpu.pairwise_distances(X.astype(complex)), TypeError, r"real numbers"),
])
def test_bad_input_is_refused(call, exc, match):
    X = np.random.default_rng(1).standard_normal((6, 5))
    X[0, 0] = 2.0
    with pytest.raises(exc, match=match):
        call(X)


# ------------------------------------------------- input refused at fit, in scikit-learn's words

def _fit(X, metric="euclidean"):
    return mgpu.NearestNeighbors(n_neighbors=2, metric=metric).fit(X)


_ENTRY_POINTS = [  # (function named in the refusal, call on X)
    ("NearestNeighbors.fit", lambda X: _fit(X).kneighbors()),
    ("knn", lambda X: mgpu.knn(X, X, 2)),
    ("pairwise_distances", lambda X: mgpu.pairwise_distances(X)),
]


@pytest.mark.parametrize("func, call", _ENTRY_POINTS, ids=[f for f, _ in _ENTRY_POINTS])
@pytest.mark.parametrize("sparse", [False, True])
def test_complex_data_is_a_value_error_as_in_scikit_learn(func, call, sparse):
    """scikit-learn refuses complex data with ValueError("Complex data not supported"); mgpu
    refused it with a TypeError only. The refusal is now both (existing handlers of either
    keep working)."""
    X = np.random.default_rng(0).uniform(size=(10, 3)) + 1j
    X = sp.csr_matrix(X) if sparse else X
    words = (rf"^The '(X|index)' parameter of {func} must hold real numbers \(bool, int or "
             r"float\)\. Got dtype complex128 instead\. Complex data not supported")
    with pytest.raises(ValueError, match=words):
        call(X)
    with pytest.raises(TypeError, match=words):
        call(X)


@pytest.mark.parametrize("func, call", _ENTRY_POINTS, ids=[f for f, _ in _ENTRY_POINTS])
def test_numbers_stored_as_objects_are_read_as_floats(func, call):
    X = np.random.default_rng(1).uniform(size=(10, 3))
    got, want = call(X.astype(object)), call(X)
    for g, w in zip(*(((o,) if isinstance(o, np.ndarray) else o) for o in (got, want))):
        assert g.dtype == w.dtype and np.array_equal(g, w)
    for bad, exc, why in (({"foo": "bar"}, TypeError, r"float\(\) argument must be a string "
                                                      r"or a (real )?number, not 'dict'"),
                          ("abc", ValueError, "could not convert string to float: 'abc'")):
        Xo = X.astype(object)
        Xo[4, 1] = bad
        with pytest.raises(exc, match=rf"^The '(X|index)' parameter of {func} must hold real "
                                      rf"numbers; its values \(dtype object\) do not convert to "
                                      rf"float: {why}"):
            call(Xo)


def test_nearest_neighbors_from_array_likes():
    X = np.random.default_rng(2).uniform(size=(8, 3))
    nn = _fit(X.tolist())
    assert nn.n_features_in_ == 3 and nn.n_samples_fit_ == 8
    assert np.array_equal(nn.kneighbors(X[:2].tolist())[1], _fit(X).kneighbors(X[:2])[1])
    with pytest.raises(ValueError, match=r"^The 'X' parameter of NearestNeighbors.fit must be "
                                         r"a 2-D array of numbers .*Got list that numpy does "
                                         r"not read as one"):
        _fit([[1.0, 2.0], [3.0]])
    with pytest.raises(ValueError, match=r"^The 'X' parameter of NearestNeighbors.fit must be "
                                         r"2-D\. Got shape \(3,\) instead"):
        _fit([1.0, 2.0, 3.0])


@pytest.mark.parametrize("shape, what", [((0, 3), "0 sample(s)"), ((12, 0), "0 feature(s)")])
@pytest.mark.parametrize("sparse", [False, True])
def test_data_without_rows_or_columns_is_refused_at_fit(shape, what, sparse):
    """Fitting 12 rows of 0 columns was taken, and every distance came out 0. The functions
    keep their results for such input: empty, or the distances of a space without
    dimensions (tests/test_properties.py holds them to these)."""
    X = sp.csr_matrix(shape) if sparse else np.empty(shape)
    words = (rf"must have at least 1 row\(s\) and 1 column\(s\)\. Found array with "
             rf"{re.escape(what)} \(shape={re.escape(str(shape))}\) while a minimum of 1 is "
             r"required\.$")
    with pytest.raises(ValueError, match=r"^The 'X' parameter of NearestNeighbors.fit " + words):
        _fit(X)
    fitted = _fit(np.ones((3, shape[1])) if shape[1] else np.ones((3, 2)))
    if shape[1]:  # queries without rows
        with pytest.raises(ValueError, match=r"^The 'X' parameter of NearestNeighbors"
                                             r"\.kneighbors " + words):
            fitted.kneighbors(X)
    assert mgpu.pairwise_distances(X, X).shape == (shape[0], shape[0])
    assert mgpu.knn(np.ones((2, shape[1])), X, 1)[1].shape == (shape[0], 1)


@pytest.mark.parametrize("metric", ["hellinger", "kl_divergence", "kullback_leibler",
                                    "jensenshannon"])
@pytest.mark.parametrize("sparse", [False, True])
def test_negative_data_is_refused_at_fit(metric, sparse):
    """hellinger, kl_divergence and jensenshannon took negative data at fit and refused it
    only at kneighbors."""
    X = np.random.default_rng(3).uniform(0.5, 1.0, size=(8, 3))
    X[2, 1] = -0.5
    name = mgpu.ops.distances.resolve_metric(metric)[0].name
    with pytest.raises(ValueError, match=rf"^The 'X' parameter of NearestNeighbors.fit must be "
                                         rf"non-negative for metric '{name}'\. Got a negative "
                                         r"value at row 2, column 1\. Negative values in data"):
        _fit(sp.csr_matrix(X) if sparse else X, metric)
    _fit(abs(X), metric)  # and the same data without the sign is taken


def test_jensenshannon_rows_without_mass_are_refused_at_fit():
    X = np.random.default_rng(4).uniform(size=(8, 3))
    X[5] = 0.0
    with pytest.raises(ValueError, match=r"^The 'X' parameter of NearestNeighbors.fit has rows "
                                         r"that sum to 0 \(first: row 5\)"):
        _fit(X, "jensenshannon")


# ------------------------------------------------- what the kNN docs say about scikit-learn

def test_drop_self_keeps_the_k_nearest_other_rows_and_the_docs_say_how_scikit_learn_differs():
    """A row missing from its own k+1 neighbours loses its farthest (mgpu) where scikit-learn
    drops its nearest; the docstrings said mgpu did as scikit-learn does, and that tied ids
    equal scikit-learn's."""
    from sklearn.neighbors import NearestNeighbors as SkNN

    from mgpu.ops.distances import drop_self

    # inner products: row 0 is the least similar to itself, so not among its 3 nearest
    X = np.array([[1.0, 0.0], [4.0, 0.0], [3.0, 0.0], [2.0, 0.0]])
    d, i = mgpu.NearestNeighbors(n_neighbors=2, metric="inner_product").fit(X).kneighbors()
    assert i[0].tolist() == [1, 2] and d[0].tolist() == [4.0, 3.0]
    # four equal rows: row 3 is crowded out of its 3 nearest by rows 0, 1, 2 (lower ids)
    X = np.vstack([np.ones((4, 2)), [[5.0, 5.0], [9.0, 1.0]]])
    d, i = mgpu.NearestNeighbors(n_neighbors=2).fit(X).kneighbors()
    assert i[3].tolist() == [0, 1] and d[3].tolist() == [0.0, 0.0]
    rd, ri = SkNN(n_neighbors=2, algorithm="brute").fit(X).kneighbors()
    np.testing.assert_array_equal(d, rd)  # the distances agree
    assert not (ri == np.arange(6)[:, None]).any()
    # the words
    assert "scikit-learn" in drop_self.__doc__ and "*first* neighbour" in drop_self.__doc__
    assert "As scikit-learn does it" not in drop_self.__doc__
    assert "ids equal scikit-learn's" not in mgpu.ops.distances.knn.__doc__
    assert "can differ from scikit-learn's" in mgpu.ops.distances.knn.__doc__


def test_real_corpus_neighbours(data_dir):
    from sklearn.neighbors import NearestNeighbors as SkNN

    from mgpu import io

    S = io.load(str(data_dir / "bow" / "ap.dat.gz")).tocsr()[:600].astype(np.float64)
    S = _rows_with_mass(S)
    d, i = mgpu.knn(S, S[:50], 5, metric="cosine")
    rd, ri = SkNN(n_neighbors=5, metric="cosine", algorithm="brute").fit(S).kneighbors(S[:50])
    np.testing.assert_allclose(d, rd, rtol=1e-5, atol=1e-9)
    _same_neighbours_up_to_ties(S, S[:50], "cosine", d, i, ri)
    assert (i[:, 0] == np.arange(50)).all()  # each document is its own nearest


# ----------------------------------------------------------------------------- distributed


@pytest.mark.parametrize("metric, parts", [("euclidean", 3), ("cosine", 5), ("manhattan", 2),
                                           ("jaccard", 4), ("inner_product", 3)])
def test_distributed_knn_equals_one_device(client, metric, parts):
    from mgpu.distributed import from_scipy

    rng = np.random.default_rng(parts)
    index = _rows_with_mass(_matrix(rng, 200, 30, density=0.15))
    index = sp.vstack([index, index[:20]]).tocsr()  # equal rows in different tiles
    queries = _matrix(rng, 45, 30, density=0.15)
    if metric == "cosine":
        queries = _rows_with_mass(queries)
    Xd = from_scipy(index, parts, axis=0, client=client)
    done = []
    d, i = mgpu.knn(Xd, queries, 9, metric=metric, working_memory=8 * 100 * 16,
                    progress=done.append)
    rd, ri = mgpu.knn(index, queries, 9, metric=metric)
    np.testing.assert_allclose(d, rd, rtol=1e-12, atol=1e-12)
    assert np.array_equal(i, ri)  # the same ties, broken the same way
    assert sum(done) == queries.shape[0] and len(done) > 1


def test_distributed_knn_with_k_larger_than_a_tile(client):
    from mgpu.distributed import from_scipy

    rng = np.random.default_rng(4)
    index = rng.standard_normal((12, 3))
    Xd = from_scipy(sp.csr_matrix(index), 6, axis=0, client=client)  # tiles of 2 rows
    d, i = mgpu.knn(Xd, index[:4], 10)
    rd, ri = mgpu.knn(index, index[:4], 10)
    # dense and sparse inputs round the expanded form differently near zero distance
    assert np.array_equal(i, ri) and np.allclose(d, rd, rtol=1e-12, atol=1e-7)


def test_distributed_knn_bad_input(client):
    from mgpu.distributed import from_scipy

    S = sp.random(50, 8, density=0.3, format="csr", random_state=0)
    # column tiles, once refused, are re-cut into row tiles (issue 35)
    np.testing.assert_array_equal(mgpu.knn(from_scipy(S, 2, axis=1, client=client), S, 3)[1],
                                  mgpu.knn(S, S, 3)[1])
    Xd = from_scipy(S, 2, axis=0, client=client)
    with pytest.raises(ValueError, match=r"'k' parameter of knn must be an int in \[1, 50\]"):
        mgpu.knn(Xd, S, 51)
    with pytest.raises(ValueError, match="same number of columns. Got 8 and 7"):
        mgpu.knn(Xd, S[:, :7], 3)
    with pytest.raises(ValueError, match="'metric' parameter of knn"):
        mgpu.knn(Xd, S, 3, metric="nope")
    bad = S.copy()
    bad.data[5] = np.nan
    with pytest.raises(ValueError, match="'index' parameter of knn holds NaN or infinity"):
        mgpu.knn(from_scipy(bad, 2, axis=0, client=client), S, 3)


def test_merge_top_k_breaks_ties_by_id():
    from mgpu.distributed import merge_top_k

    a = (np.array([[0.5, 1.0, 1.0]]), np.array([[4, 6, 8]]))
    b = (np.array([[1.0, 1.0, 2.0]]), np.array([[5, 7, 1]]))
    d, i = merge_top_k(a, b, 4, largest=False)
    assert i.tolist() == [[4, 5, 6, 7]] and d.tolist() == [[0.5, 1.0, 1.0, 1.0]]
    d, i = merge_top_k(a, b, 2, largest=True)
    assert i.tolist() == [[1, 5]]


@pytest.mark.parametrize("sparse", [False, True])
def test_mnist_neighbours_dense_and_sparse(data_dir, sparse):
    from sklearn.neighbors import NearestNeighbors as SkNN

    from mgpu import io

    X = io.load(str(data_dir / "vectors" / "mnist_t10k-images-idx3-ubyte.gz")).astype(np.float64)
    y = io.load(str(data_dir / "vectors" / "mnist_t10k-labels-idx1-ubyte.gz"))
    train, test = X[:3000], X[3000:3200]
    d, i = mgpu.knn(sp.csr_matrix(train) if sparse else train,
                    sp.csr_matrix(test) if sparse else test, 3, metric="euclidean")
    rd, ri = SkNN(n_neighbors=3, algorithm="brute").fit(train).kneighbors(test)
    np.testing.assert_allclose(d, rd, rtol=1e-5)
    _same_neighbours_up_to_ties(train, test, "euclidean", d, i, ri)
    assert (y[:3000][i[:, 0]] == y[3000:3200]).mean() > 0.85  # 1-NN labels on digits


def test_visium_spots_cosine_neighbours(data_dir):
    from sklearn.neighbors import NearestNeighbors as SkNN

    from mgpu import io

    spots = io.load(str(data_dir / "singlecell" / "visium_mouse_spaceranger3")).matrix.T.tocsr()
    spots = _rows_with_mass(spots.astype(np.float64))
    d, i = mgpu.knn(spots, spots[:100], 6, metric="cosine")
    rd, ri = SkNN(n_neighbors=6, metric="cosine", algorithm="brute").fit(spots).kneighbors(
        spots[:100])
    np.testing.assert_allclose(d, rd, rtol=1e-5, atol=1e-9)
    _same_neighbours_up_to_ties(spots, spots[:100], "cosine", d, i, ri)
    for metric in ("hellinger", "jensenshannon", "manhattan"):
        got = mgpu.pairwise_distances(spots[:20], spots[20:45], metric=metric)
        ref = _reference(metric, spots[:20].toarray(), spots[20:45].toarray())
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-9)


def test_mixed_dense_and_sparse_and_the_union_kernel_is_symmetric():
    rng = np.random.default_rng(12)
    X = _matrix(rng, 30, 20)
    Y = _matrix(rng, 25, 20)
    for metric in ("cosine", "manhattan", "canberra", "hamming"):
        ref = _reference(metric, X.toarray(), Y.toarray())
        ok = np.isfinite(ref)
        for a, b in ((X.toarray(), Y), (X, Y.toarray())):
            got = mgpu.pairwise_distances(a, b, metric=metric)
            np.testing.assert_allclose(got[ok], ref[ok], rtol=1e-9, atol=1e-12)
    # one merge over the union of two rows, whichever comes first: the same bits both ways,
    # from sparse or dense input
    xy = mgpu.pairwise_distances(X, Y, metric="minkowski", p=3)
    assert np.array_equal(xy, mgpu.pairwise_distances(Y, X, metric="minkowski", p=3).T)
    assert np.array_equal(xy, mgpu.pairwise_distances(X.toarray(), Y.toarray(),
                                                      metric="minkowski", p=3))
    np.testing.assert_allclose(xy, cdist(X.toarray(), Y.toarray(), "minkowski", p=3),
                               rtol=1e-12)
