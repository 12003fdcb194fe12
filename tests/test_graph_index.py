"""mgpu.models.GraphIndex: approximate neighbours against mgpu's exact ones, its parameters'
effect, saving and loading."""
from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.utils.estimator_checks import parametrize_with_checks

import mgpu
from mgpu.distributed import merge_top_k
from mgpu.models import GraphIndex


def _clustered(seed, n, nq, d=16, centers=30):
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centers, d)) * 4
    X = c[rng.integers(0, centers, n + nq)] + rng.standard_normal((n + nq, d))
    return X[:n], X[n:]


def _recall(found, truth):
    return np.mean([np.intersect1d(f, t).size / t.size for f, t in zip(found, truth)])


@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean", "cosine", "inner_product"])
def test_neighbours_match_the_exact_ones(metric):
    """Recall@10 above 0.9 against mgpu.NearestNeighbors (exact), and each distance returned
    is the exact distance (inner products: the largest first)."""
    X, Q = _clustered(0, 3000, 200)
    index = GraphIndex(10, metric=metric, degree=24, candidates=48).fit(X)
    dist, ind = index.kneighbors(Q)
    assert dist.shape == ind.shape == (200, 10) and ind.dtype == np.int64
    _, truth = mgpu.NearestNeighbors(n_neighbors=10, metric=metric).fit(X).kneighbors(Q)
    assert _recall(ind, truth) > 0.9
    want = np.take_along_axis(mgpu.pairwise_distances(Q, X, metric=metric), ind, 1)
    np.testing.assert_allclose(dist, want, rtol=1e-9, atol=1e-9)
    order = -dist if metric == "inner_product" else dist
    assert (np.diff(order, axis=1) >= 0).all()


def test_more_candidates_find_more():
    """A search that keeps more candidates finds at least as many true neighbours here, and
    one that may explore only the nearest candidate finds fewer."""
    X, Q = _clustered(1, 3000, 200)
    _, truth = mgpu.NearestNeighbors(n_neighbors=10).fit(X).kneighbors(Q)
    small = GraphIndex(10, candidates=16, degree=16).fit(X)
    recalls = [_recall(clone(small).set_params(**p).fit(X).kneighbors(Q)[1], truth)
               for p in ({"candidates": 16, "explore": 1}, {"candidates": 16},
                         {"candidates": 64})]
    assert recalls[0] < recalls[1] <= recalls[2] and recalls[2] > 0.9, recalls


def test_save_and_load_give_the_same_index(tmp_path):
    X, Q = _clustered(2, 500, 20)
    index = GraphIndex(5, metric="cosine", degree=8, candidates=16, explore=12,
                       partition="clusters", probes=3).fit(X)
    index.save(tmp_path / "g.npz")
    with np.load(tmp_path / "g.npz", allow_pickle=False) as f:
        assert all(f[k].dtype != object for k in f.files)
    again = GraphIndex.load(tmp_path / "g.npz")
    assert again.get_params() == index.get_params()
    assert again.n_features_in_ == 16 and again.n_samples_fit_ == 500
    for a, b in zip(index.kneighbors(Q), again.kneighbors(Q)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("metric", ["euclidean", "cosine", "inner_product"])
def test_half_rows_search_the_same_graph_on_rounded_rows(metric, tmp_path):
    """half=True builds the graph of the rows as given (the same graph), then keeps the
    rows rounded to float16 (as float64 on the CPU): each distance is the exact one of the
    rounded row, the recall that of the full rows within 0.02; saved and loaded whole."""
    X, Q = _clustered(3, 3000, 200)
    X = X * 50  # values up to about 500: float16 rounds them to 0.25
    Q = Q * 50
    full = GraphIndex(10, metric=metric, degree=24, candidates=48).fit(X)
    half = clone(full).set_params(half=True).fit(X)
    np.testing.assert_array_equal(half.graph_, full.graph_)
    rounded = X.astype(np.float16).astype(np.float64)
    if metric == "cosine":
        unit = X / np.linalg.norm(X, axis=1, keepdims=True)
        rounded = unit.astype(np.float16).astype(np.float64)
    assert half._data.dtype == np.float64 and np.array_equal(half._data, rounded)
    assert not np.array_equal(rounded, full._data)  # the rounding is seen
    dist, ind = half.kneighbors(Q)
    _, truth = mgpu.NearestNeighbors(n_neighbors=10, metric=metric).fit(X).kneighbors(Q)
    assert abs(_recall(ind, truth) - _recall(full.kneighbors(Q)[1], truth)) < 0.02
    queries = Q / np.linalg.norm(Q, axis=1, keepdims=True) if metric == "cosine" else Q
    if metric == "euclidean":
        want = np.sqrt(((queries[:, None, :] - rounded[ind]) ** 2).sum(axis=2))
    else:
        dots = np.einsum("qd,qkd->qk", queries, rounded[ind])
        want = 1 - dots if metric == "cosine" else dots
    np.testing.assert_allclose(dist, want, rtol=1e-9, atol=1e-9)
    half.save(tmp_path / "h")
    again = GraphIndex.load(tmp_path / "h.npz")
    assert again.half is True
    for a, b in zip(half.kneighbors(Q), again.kneighbors(Q)):
        np.testing.assert_array_equal(a, b)


def test_half_rows_are_refused_before_the_build(client):
    """Sparse rows, and a value past float16's range (after cosine's scaling), are refused
    before any batch is built, on one machine and sharded."""
    X, _ = _clustered(4, 400, 1)
    seen = []
    with pytest.raises(ValueError, match="half=True keeps dense rows"):
        GraphIndex(5, half=True).fit(sp.csr_matrix(X), progress=lambda *a: seen.append(a))
    big = X.copy()
    big[7, 2] = 7e4
    with pytest.raises(ValueError, match="beyond float16's largest"):
        GraphIndex(5, half=True).fit(big, progress=lambda *a: seen.append(a))
    assert seen == []
    GraphIndex(5, half=True, metric="cosine").fit(big)  # unit rows: within range
    with pytest.raises(ValueError, match="half=True keeps dense rows"):
        GraphIndex(5, half=True).fit(da.from_array(sp.csr_matrix(X), chunks=(200, 16),
                                                   asarray=False))
    for partition in ("rows", "clusters"):
        with pytest.raises(ValueError, match="beyond float16's largest"):
            GraphIndex(5, half=True, partition=partition).fit(
                da.from_array(big, chunks=(200, 16)))


@pytest.mark.parametrize("partition", ["rows", "clusters"])
def test_half_rows_sharded(client, partition):
    """A sharded index with half=True answers as the one-device half index would: its
    shards' rows rounded (recall within 0.05 of the full rows' sharded index)."""
    X, Q = _clustered(5, 3000, 200)
    X, Q = X * 50, Q * 50
    _, truth = mgpu.NearestNeighbors(n_neighbors=10).fit(X).kneighbors(Q)
    got = {}
    for half in (False, True):
        index = GraphIndex(10, degree=16, candidates=32, batch=256, partition=partition,
                           probes=2, half=half).fit(da.from_array(X, chunks=(1500, 16)))
        got[half] = index.kneighbors(Q)
    assert abs(_recall(got[True][1], truth) - _recall(got[False][1], truth)) < 0.05
    rounded = X.astype(np.float16).astype(np.float64)
    dist, ind = got[True]
    want = np.sqrt(((Q[:, None, :] - rounded[ind]) ** 2).sum(axis=2))
    np.testing.assert_allclose(dist, want, rtol=1e-9, atol=1e-9)


def test_a_file_of_another_kind_is_refused(tmp_path):
    np.savez(tmp_path / "other.npz", x=np.ones(3))
    with pytest.raises(ValueError, match="is not a GraphIndex file"):
        GraphIndex.load(tmp_path / "other.npz")


def test_progress_and_index_only():
    X, Q = _clustered(3, 300, 5)
    seen = []
    index = GraphIndex(3, degree=8, candidates=8, batch=128).fit(
        X, progress=lambda done, n: seen.append((done, n)))
    assert seen == [(128, 300), (256, 300), (300, 300)]
    ind = index.kneighbors(Q, 2, return_distance=False)
    np.testing.assert_array_equal(ind, index.kneighbors(Q, 2)[1])


def test_more_neighbours_than_rows_are_refused():
    index = GraphIndex(2, degree=4, candidates=8).fit(np.eye(5))
    with pytest.raises(ValueError, match="at most candidates = 8 and the index's 5 rows"):
        index.kneighbors(np.eye(5), 6)
    assert index.kneighbors(np.eye(5), 5)[1].min() >= 0  # every row reached


def test_an_index_is_searched_under_its_own_metric():
    """Search parameters may change after fit; the metric may not (the rows were scaled
    and linked for it)."""
    X, Q = _clustered(8, 300, 5)
    index = GraphIndex(3, degree=8, candidates=8).fit(X)
    index.set_params(candidates=32, explore=16).kneighbors(Q)
    with pytest.raises(ValueError, match="built for 'euclidean': fit it again"):
        index.set_params(metric="cosine").kneighbors(Q)
    assert index.fit(X).effective_metric_ == "cosine"


def test_unfitted_index_is_refused():
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        GraphIndex().kneighbors(np.eye(2))


@parametrize_with_checks([GraphIndex(n_neighbors=2, degree=4, candidates=4, metric=m)
                          for m in ("euclidean", "cosine", "inner_product")])
def test_sklearn_estimator_checks(estimator, check):
    """scikit-learn's own suite of estimator checks (none expected to fail)."""
    check(estimator)


def _counts(seed, n, d, density=0.02):
    """n rows of d columns of small counts (a bag of words), every row non-empty."""
    rng = np.random.default_rng(seed)
    X = sp.random(n, d, density=density, format="lil", random_state=rng,
                  data_rvs=lambda k: rng.integers(1, 5, k).astype(np.float64))
    X[np.arange(n), rng.integers(0, d, n)] = 1.0
    return sp.csr_matrix(X)


@pytest.mark.parametrize("metric", ["sqeuclidean", "inner_product"])
def test_sparse_rows_give_the_dense_rows_graph(metric):
    """Counts make every dot product and norm exact in float64, so the sparse rows' scores
    (merged columns, expanded with the norms) equal the dense rows': the same graph, the
    same neighbours, whichever form the queries take."""
    X = _counts(4, 600, 300)
    Q = _counts(5, 30, 300)
    dense = GraphIndex(5, metric=metric, degree=8, candidates=16, batch=200).fit(X.toarray())
    sparse = GraphIndex(5, metric=metric, degree=8, candidates=16, batch=200).fit(X)
    np.testing.assert_array_equal(dense.graph_, sparse.graph_)
    want = dense.kneighbors(Q.toarray())
    for got in (sparse.kneighbors(Q), sparse.kneighbors(Q.toarray()), dense.kneighbors(Q)):
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-12)


def _topics(seed, n, d=2000, topics=20, words=30):
    """n documents of `words` word counts over d words, each drawn from one of `topics`
    topics (100 words each) four times in five, else from all d words."""
    rng = np.random.default_rng(seed)
    vocab = np.random.default_rng(0).permutation(d)[:topics * 100].reshape(topics, 100)
    doc = np.repeat(np.arange(n), words)
    own = vocab[rng.integers(0, topics, n)][doc, rng.integers(0, 100, n * words)]
    word = np.where(rng.random(n * words) < 0.8, own, rng.integers(0, d, n * words))
    return sp.csr_matrix((np.ones(n * words), (doc, word)), shape=(n, d))  # duplicates add


def test_sparse_neighbours_match_the_exact_ones(tmp_path):
    """Cosine over sparse word counts of 20 topics (3,000 × 2,000, 30 words a document):
    recall@10 above 0.9 against mgpu.NearestNeighbors on the same sparse rows; a saved
    sparse index loads as it was."""
    X, Q = _topics(6, 3000), _topics(7, 100)
    index = GraphIndex(10, metric="cosine", degree=24, candidates=64).fit(X)
    dist, ind = index.kneighbors(Q)
    _, truth = mgpu.NearestNeighbors(n_neighbors=10, metric="cosine").fit(X).kneighbors(Q)
    assert _recall(ind, truth) > 0.9
    want = np.take_along_axis(mgpu.pairwise_distances(Q, X, metric="cosine"), ind, 1)
    np.testing.assert_allclose(dist, want, rtol=1e-9, atol=1e-12)
    index.save(tmp_path / "sparse.npz")
    again = GraphIndex.load(tmp_path / "sparse.npz")
    for a, b in zip(index.kneighbors(Q), again.kneighbors(Q)):
        np.testing.assert_array_equal(a, b)


def test_ap_bag_of_words(data_dir):
    """The AP corpus (2,246 documents × 10,473 words), cosine, sparse rows: recall@10 of
    its last 246 documents among the first 2,000 above 0.9."""
    from mgpu import io

    S = sp.csr_matrix(io.load(str(data_dir / "bow" / "ap.dat.gz")), dtype=np.float64)
    X, Q = S[:2000], S[2000:]
    _, ind = GraphIndex(10, metric="cosine", degree=32, candidates=64).fit(X).kneighbors(Q)
    _, truth = mgpu.NearestNeighbors(n_neighbors=10, metric="cosine").fit(X).kneighbors(Q)
    assert _recall(ind, truth) > 0.9


def test_the_run_command_writes_an_index_that_loads(tmp_path):
    """``mgpu run ann-graph`` builds the index of a file's rows and writes it whole: it
    loads and answers as one built in Python."""
    from click.testing import CliRunner

    from mgpu.cli import main

    X, Q = _clustered(9, 700, 10)
    np.save(tmp_path / "rows.npy", X)
    out = tmp_path / "g.npz"
    r = CliRunner().invoke(main, ["run", "ann-graph", str(tmp_path / "rows.npy"), "--degree",
                                  "8", "--candidates", "16", "--batch", "100", "--out",
                                  str(out)])
    assert r.exit_code == 0, r.output
    assert "700 vertices" in r.output and sorted(p.name for p in tmp_path.iterdir()) == [
        "g.npz", "rows.npy"]
    want = GraphIndex(10, degree=8, candidates=16, batch=100).fit(X).kneighbors(Q)
    for a, b in zip(GraphIndex.load(out).kneighbors(Q), want):
        np.testing.assert_array_equal(a, b)


def test_save_adds_npz(tmp_path):
    index = GraphIndex(2, degree=4, candidates=4).fit(np.eye(6))
    index.save(tmp_path / "plain")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.npz"]


# GraphIndex fitted on a dask array: the index sharded over a CPU cluster's workers, each
# shard's graph built where its rows are, every shard searched and their lists merged.

@pytest.mark.parametrize("metric", ["euclidean", "cosine", "inner_product"])
def test_shards_answer_as_their_graphs_merged(client, metric):
    """Three shards (row chunks of 1,000, 1,200, 800): the answer is each shard's own
    index (built alone on its rows, with the same parameters) searched and merged, ids
    made global; its recall@10 against exact neighbours is above 0.9."""
    X, Q = _clustered(0, 3000, 60)
    params = dict(metric=metric, degree=16, candidates=32, batch=256)
    seen = []
    index = GraphIndex(10, **params).fit(da.from_array(X, chunks=((1000, 1200, 800), 16)),
                                         progress=lambda done, n: seen.append((done, n)))
    assert index.graph_ is None and index.n_samples_fit_ == 3000
    assert sorted(seen)[-1] == (3000, 3000) and len(seen) == 3
    dist, ids = index.kneighbors(Q)
    parts, start = [], 0
    for n in (1000, 1200, 800):
        d, i = GraphIndex(10, **params).fit(X[start:start + n]).kneighbors(Q)
        d = -d if metric == "inner_product" else d  # merged as the graph orders them
        parts.append((d, i + start))
        start += n
    want = merge_top_k(merge_top_k(parts[0], parts[1], 10, False), parts[2], 10, False)
    np.testing.assert_array_equal(ids, want[1])
    np.testing.assert_allclose(dist, -want[0] if metric == "inner_product" else want[0])
    _, truth = mgpu.NearestNeighbors(n_neighbors=10, metric=metric).fit(X).kneighbors(Q)
    assert _recall(ids, truth) > 0.9


def test_sparse_shards_and_refusals(client, tmp_path):
    """Sparse chunks stay sparse (dense queries made sparse on the workers); a shard
    smaller than k gives what it has; NaN in a chunk is refused from its worker; a sharded
    index is not saved."""
    rng = np.random.default_rng(1)
    X = sp.random(900, 300, density=0.05, format="csr", random_state=rng) + sp.eye(900, 300)
    Q = X[:40].toarray()
    index = GraphIndex(5, metric="cosine", degree=12, candidates=24).fit(
        da.from_array(sp.csr_matrix(X), chunks=((3, 897), 300), asarray=False))
    dist, ids = index.kneighbors(Q)
    np.testing.assert_array_equal(ids[:, 0], np.arange(40))
    np.testing.assert_allclose(dist[:, 0], 0, atol=1e-12)
    with pytest.raises(ValueError, match="sharded over a cluster"):
        index.save(tmp_path / "g")
    bad = np.array(_clustered(2, 200, 0)[0])
    bad[150, 3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        GraphIndex(5, degree=8, candidates=16).fit(da.from_array(bad, chunks=(100, 16)))
    with pytest.raises(TypeError, match="compute the queries first"):
        index.kneighbors(da.from_array(Q, chunks=(20, 300)))


# partition="clusters": each worker's shard holds the rows nearest its k-means centroids, and
# each query is searched, in one SPMD job, in the shards of its nearest centroids only.

def _exchange_rank(comm, parts, piece):
    from mgpu.distributed.ann_routed import _exchange

    n = 7 + 5 * comm.rank  # rank 0 sends nothing to rank 1, rank 1 most of its rows to 0
    dest = (np.ones(n, dtype=np.int64) if comm.rank == 0 else
            (np.arange(n) % 4 == 0).astype(np.int64))
    ids = np.arange(n, dtype=np.int64) * 10 + comm.rank
    rows = np.stack([ids, -ids, ids + 0.5], axis=1).astype(np.float64)
    (got, got_ids), source = _exchange(comm, dest, [rows, ids], piece)
    return {"dest": dest, "ids": ids, "got": got, "got_ids": got_ids, "source": source}


@pytest.mark.parametrize("piece", [1, 24, 1 << 28])
def test_the_exchange_sends_each_row_to_its_rank(client, piece):
    """Each row reaches the rank it is sent to, once, whole, after those of lower ranks,
    with its source rank: in rounds of a row (``piece`` bytes: 1, 24, the default),
    padded where the two ranks send different numbers."""
    from mgpu.distributed import spmd

    from mgpu.distributed import from_scipy

    tiles = from_scipy(sp.csr_matrix((2, 1)), 2, client=client)  # a tile a worker
    out = spmd(_exchange_rank, tiles, args=(piece,), client=client)
    assert len(out) == 2  # a rank a worker
    for r, mine in enumerate(out):
        want = [np.sort(o["ids"][o["dest"] == r]) for o in out]
        lengths = [w.size for w in want]
        assert mine["source"].tolist() == sum(([s] * m for s, m in enumerate(lengths)), [])
        at = np.cumsum([0] + lengths)
        for s in range(len(out)):
            np.testing.assert_array_equal(np.sort(mine["got_ids"][at[s]:at[s + 1]]), want[s])
        ids = mine["got_ids"]
        np.testing.assert_array_equal(mine["got"], np.stack([ids, -ids, ids + 0.5], axis=1))


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_cluster_shards_find_the_neighbours(client, metric):
    """Rows are in the shards under their own ids (found as their own nearest); recall@10
    above 0.9 with one shard a query; two shards a query find at least what one found, for
    every query; queries on the workers (a dask array) get the answers of host ones, held
    on the workers."""
    X, Q = _clustered(3, 3000, 80)
    index = GraphIndex(10, metric=metric, degree=16, candidates=32, batch=256,
                       partition="clusters")
    seen = []
    index.fit(da.from_array(X, chunks=((1000, 1200, 800), 16)),
              progress=lambda done, n: seen.append((done, n)))
    # the first shard's build reported as it goes (its end always), then the whole
    assert seen[-1] == (3000, 3000) and len(seen) >= 2 and index.graph_ is None
    assert all(n == 3000 for _, n in seen) and seen[-2][0] < 3000
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert sum(index._shards.rows) == 3000 and len(index._shards.rows) == 2
    assert min(index._shards.rows) > 600  # the centroids dealt out by their rows
    index.set_params(probes=2)
    dist, ids = index.kneighbors(X[:300], 1)
    assert np.mean(ids[:, 0] == np.arange(300)) > 0.98  # an approximate search's misses
    np.testing.assert_allclose(dist[ids[:, 0] == np.arange(300), 0], 0, atol=1e-6)
    _, truth = mgpu.NearestNeighbors(n_neighbors=10, metric=metric).fit(X).kneighbors(Q)
    found = {}
    for probes in (1, 2):
        index.set_params(probes=probes)
        d, found[probes] = index.kneighbors(Q)
        assert np.all(np.diff(d, axis=1) >= 0)
    assert _recall(found[1], truth) > 0.9
    hits = {p: np.array([np.intersect1d(f, t).size for f, t in zip(ids_, truth)])
            for p, ids_ in found.items()}
    assert np.all(hits[2] >= hits[1])
    d2, i2 = index.kneighbors(da.from_array(Q, chunks=(30, 16)))
    assert isinstance(i2, da.Array) and i2.numblocks == (2, 1)  # a tile a shard, held
    d2, i2 = d2.compute(), i2.compute()
    np.testing.assert_array_equal(i2, found[2])
    np.testing.assert_allclose(d2, d)
    if metric == "euclidean":  # the distances are those of the ids returned
        exact = np.linalg.norm(Q[:, None, :] - X[i2], axis=2)
        np.testing.assert_allclose(d2, exact, rtol=1e-10)


def test_cluster_shards_refusals(client, tmp_path):
    """Sparse rows and inner products are refused before anything runs; a sharded index is
    not saved; queries of the wrong width, or of unknown chunk sizes, are refused; NaN in a
    query tile is refused from its worker."""
    X, Q = _clustered(4, 600, 10)
    with pytest.raises(ValueError, match="takes dense rows"):
        GraphIndex(5, partition="clusters").fit(
            da.from_array(sp.csr_matrix(X), chunks=(300, 16), asarray=False))
    with pytest.raises(ValueError, match="does not route"):
        GraphIndex(5, metric="inner_product", partition="clusters").fit(
            da.from_array(X, chunks=(300, 16)))
    index = GraphIndex(5, degree=8, candidates=16, partition="clusters").fit(
        da.from_array(X, chunks=(300, 16)))
    with pytest.raises(ValueError, match="sharded over a cluster"):
        index.save(tmp_path / "g")
    with pytest.raises(ValueError, match="must have 16 columns"):
        index.kneighbors(Q[:, :3])
    with pytest.raises(ValueError, match="must have 16 columns"):
        index.kneighbors(da.from_array(Q[:, :3], chunks=(5, 3)))
    unknown = da.from_array(Q, chunks=(5, 16))
    unknown = unknown[unknown[:, 0] > -np.inf]  # rows by a condition: chunk sizes unknown
    with pytest.raises(ValueError, match="compute_chunk_sizes"):
        index.kneighbors(unknown)
    bad = Q.copy()
    bad[7, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        index.kneighbors(da.from_array(bad, chunks=(5, 16)))
    with pytest.raises(ValueError, match="NaN"):
        index.kneighbors(bad)


def test_centroids_are_dealt_in_groups_of_neighbours():
    """Four far-apart groups of eight centroids (each group's rows alike) go one group a
    shard; unequal rows are dealt within 5% of the equal share at each cut; three shards
    take a third each."""
    from mgpu.distributed.ann_routed import _deal

    rng = np.random.default_rng(0)
    corners = np.array([[0, 0], [0, 50], [50, 0], [50, 50]], dtype=float)
    C = np.repeat(corners, 8, axis=0) + rng.standard_normal((32, 2))
    owner = _deal(C, np.full(32, 100), 4)
    assert sorted(len(set(owner[g * 8:(g + 1) * 8])) for g in range(4)) == [1, 1, 1, 1]
    assert sorted(np.bincount(owner)) == [8, 8, 8, 8]
    counts = rng.integers(1, 1000, 64)
    C = rng.standard_normal((64, 5))
    for ranks in (2, 3, 4):
        rows = np.bincount(_deal(C, counts, ranks), weights=counts, minlength=ranks)
        assert rows.min() > 0 and rows.max() / rows.mean() < 1.1 ** np.ceil(np.log2(ranks))
