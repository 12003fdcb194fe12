"""Jaccard edge weights against networkx and a float64 brute force, on CPU, GPU and the
cluster, and the refusals of what is not an undirected graph."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import mgpu


def _graph(rng, n, density, hub=True):
    """An undirected graph with self-loops, stored duplicates and (optionally) a hub."""
    A = sp.random(n, n, density=density, format="coo", random_state=rng)
    rows, cols = list(A.row), list(A.col)
    if hub:
        rows += [0] * (n - 1)
        cols += list(range(1, n))
    rows += [3, 3, 5]  # a duplicate entry and self-loops
    cols += [3, 7, 5]
    G = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, n))
    return ((G + G.T) > 0).astype(np.float64).tocsr()


def _networkx_weights(G):
    import networkx as nx

    H = nx.from_scipy_sparse_array(G)
    H.remove_edges_from(list(nx.selfloop_edges(H)))
    coo = sp.triu(G, k=1).tocoo()
    # networkx walks the edge list twice: a list, not an iterator
    edges = [(int(u), int(v)) for u, v in zip(coo.row, coo.col)]
    return {(u, v): w for u, v, w in nx.jaccard_coefficient(H, edges)}


def _check_against_networkx(G, J):
    ref = _networkx_weights(G)
    J = J.tocsr()
    assert J.nnz == 2 * len(ref)  # both directions of every edge, no self-loops
    assert J.diagonal().max(initial=0) == 0 and not sp.triu(J.astype(bool), 0).diagonal().any()
    u, v = np.array(list(ref)).T
    got = np.asarray(J[u, v]).ravel()
    np.testing.assert_allclose(got, list(ref.values()), rtol=1e-12, atol=0)
    # exactly symmetric, compared sparse: the real graphs have up to 82,168 nodes
    assert (J != J.T).nnz == 0


def _ruzicka(W):
    """Σ min / Σ max of every pair of rows (dense float64), the weighted reference."""
    n = W.shape[0]
    out = np.zeros((n, n))
    for i in range(n):
        mn = np.minimum(W[i], W).sum(axis=1)
        mx = np.maximum(W[i], W).sum(axis=1)
        out[i] = np.where(mx > 0, mn / np.where(mx > 0, mx, 1), 0)
    return out


@pytest.mark.parametrize("hub", [False, True])
def test_equals_networkx_on_random_graphs(hub):
    rng = np.random.default_rng(3)
    G = _graph(rng, 300, 0.02, hub=hub)
    _check_against_networkx(G, mgpu.jaccard(G))


def test_weighted_is_ruzicka_on_the_rows():
    rng = np.random.default_rng(4)
    G = _graph(rng, 120, 0.05)
    W = G.multiply(sp.csr_matrix(rng.uniform(0.5, 3.0, G.shape))).tocsr()
    W = ((W + W.T) / 2).tocsr()
    W.setdiag(0)
    W.eliminate_zeros()
    J = mgpu.jaccard(W, weighted=True)
    Wd = W.toarray()
    ref = _ruzicka(Wd)
    assert J.nnz == W.nnz
    np.testing.assert_allclose(J.toarray()[Wd > 0], ref[Wd > 0], rtol=1e-12)
    # equal weights give the unweighted answer
    np.testing.assert_allclose(mgpu.jaccard(G, weighted=True).toarray(),
                               mgpu.jaccard(G).toarray(), rtol=1e-12)


def test_symmetrize_and_refusals():
    D = sp.csr_matrix(([1.0, 1.0, 1.0], ([0, 1, 2], [1, 2, 0])), shape=(3, 3))  # a 3-cycle
    with pytest.raises(ValueError, match=r"pattern is not symmetric \(first: row \d, column \d"
                                         r"\)\. Pass symmetrize=True"):
        mgpu.jaccard(D)
    J = mgpu.jaccard(D, symmetrize=True)
    np.testing.assert_allclose(J.toarray(), (1 - np.eye(3)) / 3)
    W = sp.csr_matrix(np.array([[0, 2.0], [1.0, 0]]))
    with pytest.raises(ValueError, match="weights is not symmetric"):
        mgpu.jaccard(W, weighted=True)
    assert mgpu.jaccard(W, weighted=True, symmetrize=True).nnz == 2
    with pytest.raises(ValueError, match=r"must be a square adjacency matrix\. Got shape "
                                         r"\(3, 4\)"):
        mgpu.jaccard(sp.random(3, 4, density=0.5, format="csr", random_state=0))
    bad = sp.csr_matrix(1 - np.eye(3))
    bad.data[2] = np.nan
    with pytest.raises(ValueError, match=r"holds NaN or infinity \(first at row 1, column 0\)"):
        mgpu.jaccard(bad)
    with pytest.raises(ValueError, match="negative edge weights"):
        mgpu.jaccard(-sp.csr_matrix(1 - np.eye(3)), weighted=True)
    with pytest.raises(TypeError, match="must be a sparse adjacency matrix"):
        mgpu.jaccard(1 - np.eye(3))
    with pytest.raises(ValueError, match="'parts' parameter of jaccard must be an int >= 1"):
        mgpu.jaccard(sp.csr_matrix(1 - np.eye(3)), parts=0)


def test_empty_and_edgeless_graphs():
    assert mgpu.jaccard(sp.csr_matrix((0, 0))).shape == (0, 0)
    J = mgpu.jaccard(sp.identity(4, format="csr"))  # self-loops only: no edges
    assert J.nnz == 0 and J.shape == (4, 4)


# Every SNAP graph in shared/data/graphs, with its number of undirected edges that are not
# self-loops (shared/data/README.md): both directions stored (Enron, ca-HepPh), one direction
# only (facebook, Gnutella), or a mix with self-loops (ca-HepPh's 32, Slashdot's 78,303).
REAL_GRAPHS = {
    "facebook_combined.txt.gz": 88_234,
    "email-Enron.txt.gz": 183_831,
    "ca-HepPh.txt.gz": 118_489,
    "p2p-Gnutella31.txt.gz": 147_892,
    "soc-Slashdot0902.txt.gz": 504_230,
}


def _real_graph(data_dir, name):
    """The graph ``name`` as an undirected float64 adjacency (G + Gᵀ, self-loops kept for
    the code under test to drop), after checking its edge count; skips if it is absent."""
    from mgpu import io

    path = data_dir / "graphs" / name
    if not path.is_file():
        pytest.skip(f"{name} not found in {path.parent}")
    G = io.load_snap(path, symmetric=True, dtype=np.float64)
    assert G.nnz - G.diagonal().astype(bool).sum() == 2 * REAL_GRAPHS[name]
    return G


@pytest.mark.parametrize("name", list(REAL_GRAPHS))
def test_real_graph_equals_networkx(data_dir, name):
    """Every edge of every real graph, against networkx's ``jaccard_coefficient``.

    All edges are compared, none sampled: networkx takes about 11 s on the largest
    (soc-Slashdot0902, 504,230 edges) and under 4 s on each of the others on one CPU core.
    """
    G = _real_graph(data_dir, name)
    _check_against_networkx(G, mgpu.jaccard(G))


def test_spread_over_the_cluster_equals_one_device(client):
    rng = np.random.default_rng(9)
    G = _graph(rng, 400, 0.02)
    done = []
    J = mgpu.jaccard(G, parts=5, client=client, progress=done.append)
    ref = mgpu.jaccard(G)
    assert (J != ref).nnz == 0 and np.array_equal(J.indptr, ref.indptr)
    assert sum(done) == ref.nnz and len(done) == 5


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weighted", [False, True])
def test_gpu_kernel_equals_cpu(dtype, weighted):
    import cupyx.scipy.sparse as csp

    rng = np.random.default_rng(5)
    G = _graph(rng, 500, 0.02)  # the hub's row is searched, not merged
    if weighted:
        G = G.multiply(sp.csr_matrix(rng.uniform(0.5, 3.0, G.shape))).tocsr()
        G = ((G + G.T) / 2).tocsr()
    ref = mgpu.jaccard(G, weighted=weighted)
    J = mgpu.jaccard(csp.csr_matrix(G.astype(dtype)), weighted=weighted)
    assert isinstance(J, csp.csr_matrix) and J.dtype == dtype
    J = J.get()
    assert np.array_equal(J.indptr, ref.indptr) and np.array_equal(J.indices, ref.indices)
    tol = 1e-6 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(J.data, ref.data, rtol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(REAL_GRAPHS))
def test_gpu_real_graph_equals_networkx(data_dir, name):
    import cupyx.scipy.sparse as csp

    G = _real_graph(data_dir, name)
    _check_against_networkx(G, mgpu.jaccard(csp.csr_matrix(G)).get())
