"""The CPU graph search and construction (mgpu.backends.numpy_ann: GANNS's search with the
arrays N and T and the lazy check, GGraphCon's batched construction), against exact
neighbours."""
from __future__ import annotations

import numpy as np
import pytest

from mgpu.backends import numpy_ann as ann


def _clustered(rng, n, nq, d, centers=40):
    """n points and nq queries around the same `centers` centres (spread 4, noise 1) in d
    dimensions."""
    c = rng.standard_normal((centers, d)) * 4
    X = c[rng.integers(0, centers, n + nq)] + rng.standard_normal((n + nq, d))
    return X[:n], X[n:]


def _exact(data, queries, metric):
    """All distances of the queries to the rows (float64), as the kernels define them."""
    if metric == "sqeuclidean":
        return ((queries[:, None, :] - data[None]) ** 2).sum(-1)
    dots = queries @ data.T
    return 1 - dots if metric == "cosine" else -dots


def _recall(found, truth):
    return np.mean([np.intersect1d(f, t).size / t.size for f, t in zip(found, truth)])


def _graph_is_sound(graph, degree, n, d_min, d_max):
    """Every vertex but the first has d_min to d_max neighbours (the first: those made to
    it), none itself, none twice, -1 past its degree."""
    assert degree[1:].min() >= d_min and degree.max() <= d_max
    for v in range(n):
        nb = graph[v, :degree[v]]
        assert (graph[v, degree[v]:] == -1).all()
        assert v not in nb and np.unique(nb).size == nb.size and (nb >= 0).all()


@pytest.mark.parametrize("metric", ann.METRICS)
def test_search_finds_the_nearest(metric):
    """Recall@10 of 300 queries of clustered data (4,000 × 32) at N of 64 is above 0.9; the
    distances returned are the exact ones, nearest first, each vertex once."""
    rng = np.random.default_rng(0)
    X, Q = _clustered(rng, 4000, 300, 32)
    data, queries = ann.prepare(X, metric), ann.prepare(Q, metric)
    graph, degree = ann.build_graph(data, metric, 16, 32, 64, 64, 256)
    _graph_is_sound(graph, degree, len(data), 16, 32)
    dist, ids = ann.search_graph(data, graph, degree, queries, 10, metric, 64, 64)
    full = _exact(data, queries, metric)
    truth = np.argsort(full, axis=1, kind="stable")[:, :10]
    assert _recall(ids, truth) > 0.9
    np.testing.assert_allclose(dist, np.take_along_axis(full, ids, 1), rtol=1e-12, atol=1e-9)
    assert (np.diff(dist, axis=1) >= 0).all()
    assert all(np.unique(row).size == row.size for row in ids)


@pytest.mark.parametrize("metric", ann.METRICS)
def test_a_search_that_may_explore_everything_is_exact(metric):
    """With N as long as the index and every entry of N open to exploration, the search
    explores every vertex it can reach; with d_max high enough that no link is dropped the
    graph is connected, so the k nearest are the exact ones (ties by the lower index)."""
    rng = np.random.default_rng(5)
    data = ann.prepare(rng.standard_normal((500, 8)), metric)
    queries = ann.prepare(rng.standard_normal((40, 8)), metric)
    graph, degree = ann.build_graph(data, metric, 8, 500, 16, 16, 64)
    dist, ids = ann.search_graph(data, graph, degree, queries, 10, metric, 512, 512)
    full = _exact(data, queries, metric)
    np.testing.assert_array_equal(ids, np.argsort(full, axis=1, kind="stable")[:, :10])


def test_the_exploration_limit_trades_recall():
    """e = 1 explores only N's nearest entry each time: it stops sooner and finds fewer of
    the true neighbours than e = N's length."""
    rng = np.random.default_rng(2)
    X, Q = _clustered(rng, 3000, 200, 24)
    data, queries = ann.prepare(X, "sqeuclidean"), ann.prepare(Q, "sqeuclidean")
    graph, degree = ann.build_graph(data, "sqeuclidean", 12, 24, 48, 48, 256)
    truth = np.argsort(_exact(data, queries, "sqeuclidean"), axis=1, kind="stable")[:, :10]
    low = _recall(ann.search_graph(data, graph, degree, queries, 10, "sqeuclidean", 48, 1)[1],
                  truth)
    high = _recall(ann.search_graph(data, graph, degree, queries, 10, "sqeuclidean", 48,
                                    48)[1], truth)
    assert low < high and high > 0.9, (low, high)


@pytest.mark.parametrize("metric", ann.METRICS)
def test_a_point_links_to_its_nearest_predecessors(metric):
    """In one batch each point's list starts with the d_min nearest of the points
    inserted before it, nearest first (NSW's links), whatever links are made to it later;
    with no room for those (d_max = d_min), that is its whole list once it has d_min
    predecessors."""
    rng = np.random.default_rng(9)
    data = ann.prepare(rng.standard_normal((300, 6)), metric)
    tight, tight_degree = ann.build_graph(data, metric, 5, 5, 16, 16, 300)
    roomy, roomy_degree = ann.build_graph(data, metric, 5, 12, 16, 16, 300)
    full = _exact(data, data, metric)
    for p in range(1, 300):
        want = np.argsort(full[p, :p], kind="stable")[:5]
        np.testing.assert_array_equal(tight[p, :want.size], want)
        np.testing.assert_array_equal(roomy[p, :want.size], want)
        if p >= 5:
            assert tight_degree[p] == 5 and roomy_degree[p] >= 5


def test_the_build_is_the_same_every_time():
    """The batch's searches run on all cores, its links are added in order: one graph."""
    data = ann.prepare(_clustered(np.random.default_rng(4), 1500, 0, 16)[0], "cosine")
    first = ann.build_graph(data, "cosine", 10, 20, 32, 32, 100)
    again = ann.build_graph(data, "cosine", 10, 20, 32, 32, 100)
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])


def test_cosine_takes_rows_of_zeros():
    """A row of zeros is at cosine distance 1 from every row, as in scikit-learn."""
    X = np.random.default_rng(6).standard_normal((50, 4))
    X[7] = 0
    data = ann.prepare(X, "cosine")
    assert (data[7] == 0).all()
    np.testing.assert_allclose(np.linalg.norm(np.delete(data, 7, 0), axis=1), 1.0)
    graph, degree = ann.build_graph(data, "cosine", 4, 8, 16, 16, 10)
    dist, ids = ann.search_graph(data, graph, degree, data[7][None], 3, "cosine", 50, 50)
    np.testing.assert_allclose(dist, 1.0)


def test_progress_is_reported_after_each_batch():
    data = ann.prepare(np.random.default_rng(7).standard_normal((250, 4)), "sqeuclidean")
    seen = []
    ann.build_graph(data, "sqeuclidean", 4, 8, 16, 16, 100,
                    progress=lambda done, n: seen.append((done, n)))
    assert seen == [(100, 250), (200, 250), (250, 250)]


def test_mnist_recall(data_dir):
    """MNIST (3,000 training images of the test set as the index, 200 others as queries,
    784 pixels): recall@10 above 0.9."""
    from mgpu import io

    X = io.load(str(data_dir / "vectors" / "mnist_t10k-images-idx3-ubyte.gz"))
    X = X.reshape(len(X), -1).astype(np.float64) / 255
    data = ann.prepare(X[:3000], "sqeuclidean")
    queries = ann.prepare(X[5000:5200], "sqeuclidean")
    graph, degree = ann.build_graph(data, "sqeuclidean", 16, 32, 64, 64, 256)
    truth = np.argsort(_exact(data, queries, "sqeuclidean"), axis=1, kind="stable")[:, :10]
    ids = ann.search_graph(data, graph, degree, queries, 10, "sqeuclidean", 64, 64)[1]
    assert _recall(ids, truth) > 0.9


def test_diverse_links_follow_the_heuristic():
    """One batch (no search: a row's candidates are the rows before it): with ``diverse``,
    row p links to the rows, taken in order of distance among its max(l_n, d_min) nearest
    predecessors, that lie nearer to p than to every row linked before them; a brute-force
    walk of the same rule gives the same links."""
    rng = np.random.default_rng(11)
    X = _clustered(rng, 400, 0, 6, centers=8)[0]
    data = ann.prepare(X, "sqeuclidean")
    graph, degree = ann.build_graph(data, "sqeuclidean", 5, 10, 12, 12, 400, diverse=True)
    full = _exact(data, data, "sqeuclidean")
    for p in range(1, 400):
        nearest = np.argsort(full[p, :p], kind="stable")[:12]
        want = []
        for c in nearest:
            if all(full[c, k] >= full[p, c] for k in want):
                want.append(c)
            if len(want) == 5:
                break
        assert list(graph[p, :len(want)]) == want
        assert len(want) == 5 or graph[p, len(want)] in (-1, *range(p + 1, 400))


def test_diverse_links_find_more_at_few_candidates():
    """On clustered data (6,000 x 24, 60 centres), the diverse graph's recall@10 at 16
    candidates is well above the nearest-links graph's, with fewer links a vertex."""
    rng = np.random.default_rng(12)
    X, Q = _clustered(rng, 6000, 200, 24, centers=60)
    data, queries = ann.prepare(X, "sqeuclidean"), ann.prepare(Q, "sqeuclidean")
    truth = np.argsort(_exact(data, queries, "sqeuclidean"), axis=1, kind="stable")[:, :10]
    found = {}
    for diverse in (False, True):
        graph, degree = ann.build_graph(data, "sqeuclidean", 16, 32, 64, 64, 512,
                                        diverse=diverse)
        ids = ann.search_graph(data, graph, degree, queries, 10, "sqeuclidean", 16, 16)[1]
        found[diverse] = (_recall(ids, truth), degree.mean())
    assert found[True][0] > found[False][0] + 0.05, found
    assert found[True][1] < found[False][1], found
