"""GraphIndex fitted on a dask array: the index sharded over a CPU cluster's workers, each
shard's graph built where its rows are, every shard searched and their lists merged."""
from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp

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
