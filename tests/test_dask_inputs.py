"""A user's own dask arrays in every public op and estimator, on a CPU LocalCluster.

Each op runs on ``da.from_array`` inputs cut by rows, by columns, in a 2-D grid and in one
chunk, with chunks of scipy sparse matrices, of scipy sparse arrays (``asarray=False``) and of
dense numpy, and must give the local (non-dask) result on the same data: dask in, dask out
(lazily where the op allows it), ``csr_array`` in, ``csr_array`` out.
"""
from __future__ import annotations

import logging

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp

import mgpu

N_ROWS, N_COLS = 60, 48
CHUNKINGS = {"rows": (20, N_COLS), "columns": (N_ROWS, 16), "grid": (30, 24),
             "one": (N_ROWS, N_COLS)}
KINDS = ("matrix", "array", "dense")


@pytest.fixture(scope="module")
def S():
    return sp.random(N_ROWS, N_COLS, density=0.15, format="csr", random_state=7)


@pytest.fixture(scope="module")
def graph():
    G = sp.random(N_ROWS, N_ROWS, density=0.1, format="csr", random_state=8)
    G = (G + G.T).tocsr()
    G.setdiag(0)
    G.eliminate_zeros()
    return G


def _local(M, kind):
    """The data as the local op gets it."""
    return {"matrix": sp.csr_matrix, "array": sp.csr_array, "dense": np.asarray}[kind](
        M.toarray() if kind == "dense" else M)


def _dask(M, kind, chunks):
    return da.from_array(_local(M, kind), chunks=chunks, asarray=kind == "dense")


def _computed(x):
    assert isinstance(x, da.Array), f"dask in, dask out: got {type(x).__name__}"
    return x.compute()


def _same_sparse(got, want, kind):
    assert sp.issparse(got) and got.shape == want.shape
    assert isinstance(got, sp.sparray) == (kind == "array"), type(got)
    np.testing.assert_allclose(sp.csr_matrix(got).toarray(), sp.csr_matrix(want).toarray(),
                               rtol=1e-12, atol=1e-12)


both = pytest.mark.parametrize("kind", KINDS)
chunked = pytest.mark.parametrize("chunking", list(CHUNKINGS))


@both
@chunked
def test_sddmm(client, S, kind, chunking):
    rng = np.random.default_rng(0)
    A, B = rng.random((N_ROWS, 4)), rng.random((N_COLS, 4))
    want = mgpu.sddmm(sp.csr_matrix(S), A, B)
    Sd = _dask(S, kind, CHUNKINGS[chunking])
    _same_sparse(_computed(mgpu.sddmm(Sd, A, B)), want, kind)
    # dask factors, chunked unlike S
    Ad, Bd = da.from_array(A, chunks=(25, 2)), da.from_array(B, chunks=(13, 4))
    _same_sparse(_computed(mgpu.sddmm(Sd, Ad, Bd, hadamard=True)), want, kind)


@both
@chunked
def test_spmv_and_spmm(client, S, kind, chunking):
    rng = np.random.default_rng(1)
    x, X = rng.random(N_COLS), rng.random((N_COLS, 3))
    Sd = _dask(S, kind, CHUNKINGS[chunking])
    for xx in (x, da.from_array(x, chunks=20)):
        np.testing.assert_allclose(_computed(mgpu.spmv(Sd, xx)), S @ x, rtol=1e-12)
    for XX in (X, da.from_array(X, chunks=(20, 2))):
        np.testing.assert_allclose(_computed(mgpu.spmm(Sd, XX)), S @ X, rtol=1e-12)


@both
@chunked
def test_spgemm(client, S, kind, chunking):
    B = sp.random(N_COLS, 30, density=0.2, format="csr", random_state=13)
    M = sp.random(N_ROWS, 30, density=0.3, format="csr", random_state=14)
    Sd = _dask(S, kind, CHUNKINGS[chunking])
    got = mgpu.spgemm(Sd, B)
    assert got.numblocks[1] == 1 and (chunking != "rows" or got.chunks[0] == Sd.chunks[0])
    _same_sparse(_computed(got), S @ B, kind)
    _same_sparse(_computed(mgpu.spgemm(Sd, B, mask=M)), (S @ B).multiply(M != 0), kind)


@both
@chunked
def test_knn(client, S, kind, chunking):
    Q = sp.random(25, N_COLS, density=0.15, format="csr", random_state=9)
    d0, i0 = mgpu.knn(_local(S, kind), _local(Q, kind), 4)
    index = _dask(S, kind, CHUNKINGS[chunking])
    # a dask index, numpy queries: numpy out
    d, i = mgpu.knn(index, _local(Q, kind), 4)
    np.testing.assert_array_equal(i, i0)
    np.testing.assert_allclose(d, d0, rtol=1e-12)
    # dask queries, against a dask index and a local one: lazy dask out
    queries = _dask(Q, kind, (10, CHUNKINGS[chunking][1] if chunking != "rows" else N_COLS))
    for idx in (index, _local(S, kind)):
        d, i = mgpu.knn(idx, queries, 4)
        np.testing.assert_array_equal(_computed(i), i0)
        np.testing.assert_allclose(_computed(d), d0, rtol=1e-12)
        assert i.chunks[0] == queries.chunks[0]


@both
@chunked
def test_pairwise_distances(client, S, kind, chunking):
    Y = sp.random(15, N_COLS, density=0.2, format="csr", random_state=10)
    X = _dask(S, kind, CHUNKINGS[chunking])
    for metric in ("euclidean", "manhattan"):
        want = mgpu.pairwise_distances(_local(S, kind), _local(Y, kind), metric=metric)
        got = mgpu.pairwise_distances(X, _dask(Y, kind, (5, 16)), metric=metric)
        np.testing.assert_allclose(_computed(got), want, rtol=1e-12, atol=1e-12)
    # X against itself: a row's distance to itself is 0 up to the expanded form's rounding
    # (|x|² + |x|² - 2 x·x), which differs with how the rows are batched
    np.testing.assert_allclose(_computed(mgpu.pairwise_distances(X)),
                               mgpu.pairwise_distances(_local(S, kind)), rtol=1e-12, atol=1e-7)


@both
@chunked
def test_jaccard(client, graph, kind, chunking):
    want = mgpu.jaccard(_local(graph, kind) if kind != "dense" else graph)
    rows, cols = CHUNKINGS[chunking]
    got = mgpu.jaccard(_dask(graph, kind, (rows, min(cols, N_ROWS))))
    _same_sparse(_computed(got), want, kind)
    assert _computed(got).nnz == want.nnz


@both
@chunked
def test_nearest_neighbors(client, S, kind, chunking):
    Q = sp.random(12, N_COLS, density=0.2, format="csr", random_state=11)
    local = mgpu.NearestNeighbors(n_neighbors=3).fit(_local(S, kind))
    nn = mgpu.NearestNeighbors(n_neighbors=3).fit(_dask(S, kind, CHUNKINGS[chunking]))
    assert (nn.n_samples_fit_, nn.n_features_in_) == S.shape
    np.testing.assert_array_equal(nn.kneighbors(_local(Q, kind))[1],
                                  local.kneighbors(_local(Q, kind))[1])
    d, i = nn.kneighbors()  # the index's own rows, each without itself
    np.testing.assert_array_equal(_computed(i), local.kneighbors()[1])
    np.testing.assert_allclose(_computed(d), local.kneighbors()[0], rtol=1e-12)
    g = nn.kneighbors_graph(_dask(Q, kind, (6, N_COLS)), mode="distance")
    want = local.kneighbors_graph(_local(Q, kind), mode="distance")
    _same_sparse(_computed(g), want, "array" if kind == "array" else "matrix")


@both
@chunked
def test_row_norms(client, S, kind, chunking):
    got = mgpu.row_norms(_dask(S, kind, CHUNKINGS[chunking]))
    np.testing.assert_allclose(_computed(got), mgpu.row_norms(_local(S, kind)), rtol=1e-12)


@both
@pytest.mark.parametrize("chunking", ["rows", "grid"])
def test_matrix_factorization(client, S, kind, chunking):
    R = S.copy()
    R.data = np.round(R.data * 4) + 1  # ratings 1..5
    fit = dict(k=4, epochs=3, seed=0)
    want = mgpu.MatrixFactorization(**fit).fit(R)
    got = mgpu.MatrixFactorization(**fit).fit(_dask(R, kind, CHUNKINGS[chunking]))
    np.testing.assert_allclose(got.P_, want.P_)
    np.testing.assert_allclose(got.Q_, want.Q_)


def test_column_chunks_are_recut_at_nnz_prefix_sums_and_said_at_debug(client, caplog):
    # rows of very unequal weight: an even cut by rows would put most nonzeros in one tile
    M = sp.random(400, 60, density=0.02, format="csr", random_state=12).tolil()
    M[:40] = 1.0
    M = M.tocsr()
    from mgpu.distributed.inputs import row_tiles

    with caplog.at_level(logging.DEBUG, logger="mgpu.distributed.inputs"):
        tiles = row_tiles(da.from_array(M, chunks=(100, 20), asarray=False), "spmv")
    assert tiles.numblocks[1] == 1 and sum(tiles.chunks[0]) == 400
    counts = np.diff(M.indptr)
    bounds = np.concatenate([[0], np.cumsum(tiles.chunks[0])])
    nnz = [int(counts[a:b].sum()) for a, b in zip(bounds[:-1], bounds[1:])]
    assert max(nnz) - min(nnz) <= counts.max()
    assert any("re-cutting" in r.getMessage() and r.levelno == logging.DEBUG
               for r in caplog.records)
    assert (sp.csr_matrix(tiles.compute()) != M).nnz == 0


def test_nan_in_a_dask_x_fails_its_task_with_the_one_device_message(client, S):
    x = np.ones(N_COLS)
    x[5] = np.nan
    y = mgpu.spmv(da.from_array(S, chunks=(20, N_COLS), asarray=False), da.from_array(x))
    with pytest.raises(ValueError, match="NaN or infinity"):
        y.compute()


def test_a_dask_array_that_is_not_2d_or_real_is_refused_before_any_task(client, S):
    with pytest.raises(ValueError, match="'A' parameter of spmv must be 2-D"):
        mgpu.spmv(da.ones(5), np.ones(5))
    with pytest.raises(ValueError, match="'x' parameter of spmv must have 48 rows"):
        mgpu.spmv(da.from_array(S, asarray=False), da.ones(5))
    with pytest.raises(ValueError, match="square"):
        mgpu.jaccard(da.from_array(S, asarray=False))
    with pytest.raises(ValueError, match="'parts' parameter of jaccard"):
        mgpu.jaccard(da.from_array(sp.eye(4, format="csr"), asarray=False), parts=2)
    with pytest.raises(ValueError, match="'progress' parameter of knn"):
        mgpu.knn(S, da.from_array(S, asarray=False), 2, progress=print)


# ------------------------------------------------------------------ the examples


def test_sddmm_of_a_from_array_collection_with_a_client(client):
    """issue 35: it failed inside distributed with "Only use allow_other_workers= if using
    workers=", whatever the chunking."""
    S = sp.random(600, 900, density=0.01, format="csr", random_state=0)
    rng = np.random.default_rng(0)
    A, B = rng.random((600, 8)), rng.random((900, 8))
    want = mgpu.sddmm(S, A, B)
    for chunks in ((300, 900), (600, 450), (300, 450)):
        P = mgpu.sddmm(da.from_array(S, chunks=chunks, asarray=False), A, B)
        assert isinstance(P, da.Array) and P.chunks == da.core.normalize_chunks(chunks, S.shape)
        assert abs(sp.csr_matrix(P.compute()) - want).max() < 1e-12


def test_spmv_of_column_chunks_and_a_dask_x(client, S):
    """issue 35: a column-chunked A was refused instead of re-cut, a dask x refused."""
    x = np.arange(N_COLS, dtype=float)
    y = mgpu.spmv(da.from_array(S, chunks=(N_ROWS, 16), asarray=False), da.from_array(x))
    np.testing.assert_allclose(y.compute(), S @ x)


def test_knn_with_dask_queries_is_lazy_and_streams_the_chunks(client, S):
    """issue 35: dask queries were refused."""
    index = mgpu.from_scipy(S, 2, axis=0)
    queries = da.from_array(S[:30], chunks=(10, N_COLS), asarray=False)
    d, i = mgpu.knn(index, queries, 3)
    assert isinstance(d, da.Array) and isinstance(i, da.Array)
    assert i.chunks == ((10, 10, 10), (3,))
    np.testing.assert_array_equal(i.compute(), mgpu.knn(S, S[:30], 3)[1])


def test_pairwise_distances_jaccard_and_nearest_neighbors_take_dask_arrays(client, S, graph):
    """issue 35: all three refused a dask array."""
    X = da.from_array(S, chunks=(30, N_COLS), asarray=False)
    D = mgpu.pairwise_distances(X, metric="cosine")
    assert isinstance(D, da.Array)
    np.testing.assert_allclose(D.compute(), mgpu.pairwise_distances(S, metric="cosine"))
    J = mgpu.jaccard(da.from_array(graph, chunks=(30, 30), asarray=False))
    assert isinstance(J, da.Array)
    assert abs(sp.csr_matrix(J.compute()) - mgpu.jaccard(graph)).max() < 1e-12
    nn = mgpu.NearestNeighbors(n_neighbors=2).fit(X)
    np.testing.assert_array_equal(nn.kneighbors(S[:5])[1],
                                  mgpu.NearestNeighbors(n_neighbors=2).fit(S).kneighbors(
                                      S[:5])[1])


def test_matrix_factorization_fits_a_dask_array_of_ratings(client, S):
    """issue 35: refused ("must be a scipy sparse matrix or a ratings file")."""
    R = S.copy()
    R.data = np.ceil(R.data * 5)
    got = mgpu.MatrixFactorization(k=2, epochs=2, seed=1).fit(
        da.from_array(R, chunks=(30, 24), asarray=False))
    want = mgpu.MatrixFactorization(k=2, epochs=2, seed=1).fit(R)
    np.testing.assert_allclose(got.P_, want.P_)


def test_csr_array_in_gives_csr_array_out(S, graph):
    """issue 35: a csr_array came back as a csr_matrix (sddmm, jaccard, kneighbors_graph)."""
    rng = np.random.default_rng(2)
    P = mgpu.sddmm(sp.csr_array(S), rng.random((N_ROWS, 3)), rng.random((N_COLS, 3)))
    assert isinstance(P, sp.csr_array)
    assert isinstance(mgpu.jaccard(sp.csr_array(graph)), sp.csr_array)
    assert isinstance(mgpu.jaccard(sp.csr_matrix(graph)), sp.csr_matrix)
    nn = mgpu.NearestNeighbors(n_neighbors=2).fit(sp.csr_array(S))
    assert isinstance(nn.kneighbors_graph(), sp.csr_array)
    assert not isinstance(mgpu.NearestNeighbors(n_neighbors=2).fit(S).kneighbors_graph(),
                          sp.sparray)


def test_distributed_knn_out_of_working_memory_is_refused_before_any_query(client, S):
    """issue 35: each task failed alone and suggested tiles the index already had."""
    index = mgpu.from_scipy(S, 2, axis=0)
    with pytest.raises(ValueError) as e:
        mgpu.knn(index, S[:4], 2, working_memory=2000)
    msg = str(e.value)
    assert "2,000 bytes" in msg and "needs" in msg
    assert "(it has 2)" in msg and "at least" in msg
    assert int(msg.split("cut the index into at least ")[1].split()[0]) > 2
    # the working memory it asks for is enough
    need = int(msg.split("Raise working_memory to at least ")[1].split(", or")[0]
               .replace(",", ""))
    d, i = mgpu.knn(index, S[:4], 2, working_memory=need)
    np.testing.assert_array_equal(i, mgpu.knn(S, S[:4], 2)[1])


@pytest.mark.gpu
@pytest.mark.parametrize("chunking", ["rows", "columns", "grid"])
def test_cupyx_and_cupy_chunks(S, chunking):
    """Chunks on the GPU (no cluster: Dask's threads): cupy/cupyx results equal the host's."""
    import cupy
    import cupyx.scipy.sparse as csp

    rng = np.random.default_rng(3)
    A, B, x = rng.random((N_ROWS, 4)), rng.random((N_COLS, 4)), rng.random(N_COLS)
    for M in (csp.csr_matrix(S), cupy.asarray(S.toarray())):
        Sd = da.from_array(M, chunks=CHUNKINGS[chunking], asarray=False)
        P = mgpu.sddmm(Sd, cupy.asarray(A), cupy.asarray(B)).compute()
        np.testing.assert_allclose(P.get().toarray(), mgpu.sddmm(S, A, B).toarray(),
                                   rtol=1e-12)
        y = mgpu.spmv(Sd, cupy.asarray(x)).compute()
        np.testing.assert_allclose(cupy.asnumpy(y), S @ x, rtol=1e-12)
        d, i = mgpu.knn(Sd, da.from_array(S[:10], chunks=(5, N_COLS), asarray=False), 3)
        np.testing.assert_array_equal(i.compute(), mgpu.knn(S, S[:10], 3)[1])
