"""The GPU graph search and construction (mgpu.backends.cupy_ann, kernels/ann.cu) against
the CPU's (mgpu.backends.numpy_ann) and exact neighbours: the same graph where the two
compute the same distances, the same recall where they round differently."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from mgpu.backends import numpy_ann as ann

pytestmark = pytest.mark.gpu


def _clustered(rng, n, nq, d, centers=40):
    c = rng.standard_normal((centers, d)) * 4
    X = c[rng.integers(0, centers, n + nq)] + rng.standard_normal((n + nq, d))
    return X[:n], X[n:]


def _sparse(rng, n, d, per_row=12):
    """n rows of power-law columns (a bag of words' shape), some rows of one column."""
    cols = np.minimum((rng.pareto(1.2, (n, per_row)) * 3).astype(np.int64), d - 1)
    rows = np.repeat(np.arange(n), per_row)
    X = sp.csr_matrix((rng.random(n * per_row) + 0.1, (rows, cols.ravel())), shape=(n, d))
    X.sum_duplicates()
    return X


def _recall(found, truth):
    return np.mean([np.intersect1d(f, t).size / t.size for f, t in zip(found, truth)])


def _gpu_form(data, shape):
    """The CPU form of rows of ``shape`` as the GPU kernels take them (the same float64
    values)."""
    import cupy
    import cupyx.scipy.sparse as csp

    if isinstance(data, tuple):
        indptr, indices, values, _ = data
        return csp.csr_matrix((cupy.asarray(values), cupy.asarray(indices),
                               cupy.asarray(indptr.astype(np.int32))), shape=shape)
    return cupy.asarray(data)


def _cpu_and_gpu(X, metric):
    from mgpu.backends import cupy_ann

    cpu = ann.prepare(X, metric)
    return cpu, _gpu_form(cpu, X.shape), cupy_ann


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("metric", ann.METRICS)
def test_one_batch_gives_the_cpu_graph(metric, sparse):
    """A build of one batch is the batch's rows linked to their nearest predecessors (or,
    diverse, to those HNSW's heuristic picks), no search: float64 on both sides, the GPU's
    graph is the CPU's, link for link (rows with equal distances included: duplicated
    rows)."""
    rng = np.random.default_rng(1)
    if sparse:
        X = _sparse(rng, 600, 300)
    else:
        X = _clustered(rng, 600, 0, 8)[0]
        X[100:150] = X[50:100]  # ties: equal distances, ordered by id
    cpu, gpu, cupy_ann = _cpu_and_gpu(X, metric)
    for diverse in (False, True):
        g_cpu, d_cpu = ann.build_graph(cpu, metric, 6, 12, 16, 16, 600, diverse=diverse)
        g_gpu, d_gpu = cupy_ann.build_graph(gpu, metric, 6, 12, 16, 16, 600, diverse=diverse)
        np.testing.assert_array_equal(d_gpu.get(), d_cpu)
        np.testing.assert_array_equal(g_gpu.get(), g_cpu)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("metric", ann.METRICS)
def test_search_of_the_cpu_graph_finds_what_the_cpu_finds(metric, sparse):
    """The GPU search of the CPU's graph, float64: the neighbours the CPU search finds (the
    same steps; sums in another order may swap near-ties only), with the exact distances."""
    import cupy

    rng = np.random.default_rng(2)
    if sparse:
        X, Q = _sparse(rng, 3000, 500), _sparse(rng, 200, 500)
    else:
        X, Q = _clustered(rng, 3000, 200, 24)
    cpu, gpu, cupy_ann = _cpu_and_gpu(X, metric)
    q_cpu = ann.prepare(Q, metric)
    q_gpu = _gpu_form(q_cpu, Q.shape)
    graph, degree = ann.build_graph(cpu, metric, 8, 16, 32, 32, 256)
    dist, ids = ann.search_graph(cpu, graph, degree, q_cpu, 10, metric, 32, 16)
    g_dist, g_ids = cupy_ann.search_graph(gpu, cupy.asarray(graph, dtype=np.int32),
                                          cupy.asarray(degree, dtype=np.int32), q_gpu, 10,
                                          metric, 32, 16)
    same = np.mean([np.intersect1d(a, b).size / 10 for a, b in zip(ids, g_ids.get())])
    assert same > 0.99
    np.testing.assert_allclose(g_dist.get()[:, 0], dist[:, 0], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("metric", ["euclidean", "cosine", "inner_product"])
def test_gpu_index_recall_equals_the_cpu_index(metric, dtype):
    """GraphIndex fitted on CuPy data (float32 kept float32): recall@10 against exact
    neighbours within 0.01 of the CPU index's at the same parameters, over several
    batches; results on the GPU, distances the exact ones of the ids returned."""
    import cupy

    import mgpu
    from mgpu.models import GraphIndex

    rng = np.random.default_rng(3)
    X, Q = _clustered(rng, 6000, 300, 32)
    _, truth = mgpu.NearestNeighbors(n_neighbors=10, metric=metric).fit(X).kneighbors(Q)
    params = dict(metric=metric, degree=24, candidates=48, batch=500)
    cpu = GraphIndex(10, **params).fit(X)
    gpu = GraphIndex(10, **params).fit(cupy.asarray(X, dtype=dtype))
    assert gpu.graph_.dtype == np.int32 and isinstance(gpu.graph_, cupy.ndarray)
    dist, ids = gpu.kneighbors(cupy.asarray(Q, dtype=dtype))
    assert isinstance(ids, cupy.ndarray) and ids.dtype == np.int64
    r_gpu = _recall(ids.get(), truth)
    r_cpu = _recall(cpu.kneighbors(Q)[1], truth)
    assert r_gpu > 0.9 and abs(r_gpu - r_cpu) <= 0.01, (r_gpu, r_cpu)
    want = np.take_along_axis(mgpu.pairwise_distances(Q, X, metric=metric), ids.get(), 1)
    tol = 1e-3 if dtype == np.float32 else 1e-9
    np.testing.assert_allclose(dist.get(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("d", [32, 20])
@pytest.mark.parametrize("metric", ["euclidean", "cosine", "inner_product"])
def test_half_rows_on_the_gpu(metric, d):
    """half=True on the GPU: the graph of the float32 rows, the rows then kept as float16
    (half the bytes), searched with float32 queries (16-byte loads of 8 values where the
    row length is a multiple of 8, d=32; single values, d=20): recall within 0.01 of the
    CPU half index's (which searches the same rounded values); distances the exact ones of
    the rounded rows; the naive search and a half build refused."""
    import cupy
    import dask.config

    import mgpu
    from mgpu.backends import cupy_ann
    from mgpu.models import GraphIndex

    rng = np.random.default_rng(13)
    X, Q = _clustered(rng, 6000, 300, d)
    X, Q = X * 30, Q * 30
    _, truth = mgpu.NearestNeighbors(n_neighbors=10, metric=metric).fit(X).kneighbors(Q)
    params = dict(metric=metric, degree=24, candidates=48, batch=500)
    full = GraphIndex(10, **params).fit(cupy.asarray(X, dtype=np.float32))
    gpu = GraphIndex(10, half=True, **params).fit(cupy.asarray(X, dtype=np.float32))
    cpu = GraphIndex(10, half=True, **params).fit(X)
    assert gpu._data.dtype == np.float16 and gpu._data.nbytes == full._data.nbytes // 2
    np.testing.assert_array_equal(gpu.graph_.get(), full.graph_.get())
    dist, ids = gpu.kneighbors(cupy.asarray(Q, dtype=np.float32))
    assert ids.dtype == np.int64
    r_gpu, r_cpu = _recall(ids.get(), truth), _recall(cpu.kneighbors(Q)[1], truth)
    assert r_gpu > 0.85 and abs(r_gpu - r_cpu) <= 0.01, (r_gpu, r_cpu)
    rows = gpu._data.get().astype(np.float64)  # unit rows rounded, for cosine
    queries = Q / np.linalg.norm(Q, axis=1, keepdims=True) if metric == "cosine" else Q
    if metric == "euclidean":
        want = np.sqrt(((queries[:, None, :] - rows[ids.get()]) ** 2).sum(axis=2))
    else:
        dots = np.einsum("qd,qkd->qk", queries, rows[ids.get()])
        want = 1 - dots if metric == "cosine" else dots
    # float32 sums of terms up to |q| |x|: an absolute error of that size's 1e-5
    scale = np.linalg.norm(queries, axis=1).max() * np.linalg.norm(rows, axis=1).max()
    np.testing.assert_allclose(dist.get(), want, rtol=1e-4, atol=1e-3 + 1e-5 * scale)
    with dask.config.set({"mgpu.ann.search": "heaps"}), \
            pytest.raises(ValueError, match="float32 or float64 only"):
        gpu.kneighbors(cupy.asarray(Q, dtype=np.float32))
    with pytest.raises(ValueError, match="built on float32 or float64 rows"):
        cupy_ann.build_graph(gpu._data, "sqeuclidean", 8, 16, 32, 32, 500)


def test_sparse_gpu_index_recall_equals_the_cpu_index():
    """Sparse rows on the GPU (cupyx CSR, cosine): recall within 0.01 of the CPU index's;
    dense queries of the sparse index are made sparse."""
    import cupy
    import cupyx.scipy.sparse as csp

    import mgpu
    from mgpu.models import GraphIndex

    rng = np.random.default_rng(5)
    X, Q = _sparse(rng, 4000, 2000, 20), _sparse(rng, 200, 2000, 20)
    _, truth = mgpu.NearestNeighbors(n_neighbors=10, metric="cosine").fit(X).kneighbors(Q)
    params = dict(metric="cosine", degree=24, candidates=64, batch=512)
    r_cpu = _recall(GraphIndex(10, **params).fit(X).kneighbors(Q)[1], truth)
    gpu = GraphIndex(10, **params).fit(csp.csr_matrix(X))
    r_gpu = _recall(gpu.kneighbors(csp.csr_matrix(Q))[1].get(), truth)
    assert r_gpu > 0.85 and abs(r_gpu - r_cpu) <= 0.01, (r_gpu, r_cpu)
    dense = gpu.kneighbors(cupy.asarray(Q.toarray()))[1].get()
    assert _recall(dense, truth) == pytest.approx(r_gpu)
    # float32 queries of a float64 index (and the other way) are read in the index's type
    single = GraphIndex(10, **params).fit(csp.csr_matrix(X, dtype=np.float32))
    for index, q in ((gpu, csp.csr_matrix(Q, dtype=np.float32)),
                     (single, csp.csr_matrix(Q))):
        assert _recall(index.kneighbors(q)[1].get(), truth) > 0.85


def test_gpu_index_saved_loads_on_the_cpu(tmp_path):
    """A GPU index saved and loaded (on the CPU) answers the CPU's search of the same graph,
    and queries on the other device than the index are refused with what to do."""
    import cupy

    from mgpu.models import GraphIndex

    X, Q = _clustered(np.random.default_rng(6), 2000, 100, 16)
    gpu = GraphIndex(5, degree=16, candidates=32).fit(cupy.asarray(X))
    gpu.save(tmp_path / "g")
    cpu = GraphIndex.load(tmp_path / "g.npz")
    np.testing.assert_array_equal(cpu.graph_, gpu.graph_.get())
    found = gpu.kneighbors(cupy.asarray(Q))[1].get()
    assert np.mean(cpu.kneighbors(Q)[1] == found) > 0.99
    with pytest.raises(TypeError, match="must be on the GPU, where the index is"):
        gpu.kneighbors(Q)
    with pytest.raises(TypeError, match="must be on the CPU, where the index is"):
        cpu.kneighbors(cupy.asarray(Q))


@pytest.mark.parametrize("sparse", [False, True])
def test_table_and_merge_find_the_same(sparse):
    """A search that skips the vertices it met before (mgpu.ann.visited-slots: a table
    of 4,096, and one of 64 that fills at once) finds what GANNS's lazy check finds, and a
    merge by rank what the bitonic merge finds (mgpu.ann.merge): the same graph, the same
    neighbours at the same distances."""
    import dask.config

    rng = np.random.default_rng(9)
    X = _sparse(rng, 3000, 800) if sparse else _clustered(rng, 3000, 0, 24)[0]
    _, gpu, cupy_ann = _cpu_and_gpu(X, "sqeuclidean")
    found = []
    for slots, merge in ((0, "bitonic"), (0, "rank"), (4096, "rank"), (64, "bitonic")):
        with dask.config.set({"mgpu.ann.visited-slots": slots, "mgpu.ann.merge": merge}):
            graph, degree = cupy_ann.build_graph(gpu, "sqeuclidean", 8, 16, 48, 48, 400)
            found.append((graph.get(), cupy_ann.search_graph(gpu, graph, degree, gpu[:300],
                                                             10, "sqeuclidean", 48, 48)))
    for graph, (dist, ids) in found[1:]:
        np.testing.assert_array_equal(graph, found[0][0])
        np.testing.assert_array_equal(ids.get(), found[0][1][1].get())
        np.testing.assert_array_equal(dist.get(), found[0][1][0].get())
    with dask.config.set({"mgpu.ann.visited-slots": -1}), \
            pytest.raises(ValueError, match="visited-slots must be an integer, 0 or more"):
        cupy_ann.build_graph(gpu, "sqeuclidean", 8, 16, 48, 48, 400)
    with dask.config.set({"mgpu.ann.merge": "heap"}), \
            pytest.raises(ValueError, match="mgpu.ann.merge must be one of"):
        cupy_ann.build_graph(gpu, "sqeuclidean", 8, 16, 48, 48, 400)


@pytest.mark.parametrize("metric", ann.METRICS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_naive_heap_search_finds_what_ganns_finds(metric, dtype):
    """mgpu.ann.search = "heaps" (one thread a query, binary heaps, a table of the vertices
    met) searches the same graph to about the same recall as GANNS's search at the same
    width; its distances are those of its ids, nearest first (ties to the lower id); a
    short search's results are padded with -1; sparse rows are refused."""
    import cupy
    import dask.config

    from mgpu.backends import cupy_ann

    rng = np.random.default_rng(12)
    X, Q = _clustered(rng, 6000, 300, 20)
    X, Q = X.astype(dtype), Q.astype(dtype)
    data = cupy_ann.prepare(cupy.asarray(X), metric)
    queries = cupy_ann.prepare(cupy.asarray(Q), metric)
    graph, degree = cupy_ann.build_graph(data, metric, 8, 16, 48, 48, 512, diverse=True)
    rows, qs = ann.prepare(X, metric), ann.prepare(Q, metric)
    full = (((qs[:, None, :] - rows[None]) ** 2).sum(axis=2) if metric == "sqeuclidean"
            else -(qs @ rows.T))  # the exact order of each metric
    truth = np.argsort(full, axis=1, kind="stable")[:, :10]
    got = {}
    for kind in ("ganns", "heaps"):
        with dask.config.set({"mgpu.ann.search": kind}):
            d, i = cupy_ann.search_graph(data, graph, degree, queries, 10, metric, 40, 40)
        got[kind] = (d.get(), i.get())
    assert abs(_recall(got["heaps"][1], truth) - _recall(got["ganns"][1], truth)) < 0.03
    d, i = got["heaps"]
    assert (i >= 0).all() and i.dtype == np.int64
    if metric == "sqeuclidean":
        want = ((qs[:, None, :] - rows[i]) ** 2).sum(axis=2)
    else:
        dots = np.einsum("qd,qkd->qk", qs, rows[i])
        want = 1 - dots if metric == "cosine" else -dots
    np.testing.assert_allclose(d, want, rtol=1e-4 if dtype == np.float32 else 1e-10,
                               atol=1e-3 if dtype == np.float32 else 1e-10)
    assert np.all((np.diff(d, axis=1) > 0) | ((np.diff(d, axis=1) == 0)
                                               & (np.diff(i, axis=1) > 0)))
    with dask.config.set({"mgpu.ann.search": "heaps"}):
        one = cupy.asarray(np.ones((4, 20), dtype=dtype))
        lone = cupy.full((4, 16), -1, dtype=np.int32)
        d4, i4 = cupy_ann.search_graph(one, lone, cupy.zeros(4, dtype=np.int32), one[:1],
                                       3, "sqeuclidean", 8, 8)
        assert i4.get().tolist() == [[0, -1, -1]] and np.isinf(d4.get()[0, 1:]).all()
        S = cupy_ann.prepare(cupyx_csr(_sparse(rng, 200, 50)), "sqeuclidean")
        with pytest.raises(ValueError, match="dense rows of float32 or float64 only"):
            cupy_ann.search_graph(S, lone[:1], cupy.zeros(1, dtype=np.int32), S[:2], 1,
                                  "sqeuclidean", 8, 8)
    with dask.config.set({"mgpu.ann.search": "queues"}), \
            pytest.raises(ValueError, match="mgpu.ann.search must be one of"):
        cupy_ann.search_graph(data, graph, degree, queries, 10, metric, 40, 40)


def cupyx_csr(X):
    import cupyx.scipy.sparse as csp

    return csp.csr_matrix(X)


def test_gpu_progress_and_wide_candidates():
    """Progress after each batch; candidates past a block's usual width (N of 512)."""
    import cupy

    from mgpu.backends import cupy_ann

    X = cupy.asarray(_clustered(np.random.default_rng(7), 1200, 0, 16)[0])
    seen = []
    graph, degree = cupy_ann.build_graph(X, "sqeuclidean", 8, 16, 512, 512, 500,
                                         progress=lambda done, n: seen.append((done, n)))
    assert seen == [(500, 1200), (1000, 1200), (1200, 1200)]
    dist, ids = cupy_ann.search_graph(X, graph, degree, X[:50], 1, "sqeuclidean", 512, 512)
    np.testing.assert_array_equal(ids.get()[:, 0], np.arange(50))


@pytest.mark.parametrize("sparse", [False, True])
def test_queries_longer_than_shared_memory(sparse):
    """Queries of more values than a block's shared memory holds (20,000 dense; 8,000
    nonzeros) are read from global memory: the GPU search of the CPU's graph finds what the
    CPU search finds."""
    import cupy

    rng = np.random.default_rng(8)
    if sparse:
        X = sp.random(300, 50000, density=0.16, format="csr", random_state=rng)
    else:
        X = rng.standard_normal((300, 20000))
    cpu, gpu, cupy_ann = _cpu_and_gpu(X, "sqeuclidean")
    graph, degree = ann.build_graph(cpu, "sqeuclidean", 4, 8, 16, 16, 100)
    queries = X[:20]
    dist, ids = ann.search_graph(cpu, graph, degree, ann.prepare(queries, "sqeuclidean"), 5,
                                 "sqeuclidean", 64, 64)
    g_dist, g_ids = cupy_ann.search_graph(
        gpu, cupy.asarray(graph, dtype=np.int32), cupy.asarray(degree, dtype=np.int32),
        _gpu_form(ann.prepare(queries, "sqeuclidean"), queries.shape), 5, "sqeuclidean", 64, 64)
    np.testing.assert_array_equal(g_ids.get(), ids)
    # the expanded sparse form cancels at a row's own distance: an absolute tolerance
    np.testing.assert_allclose(g_dist.get(), dist, rtol=1e-9, atol=1e-9 * dist.max())


def test_mnist_gpu_recall(data_dir):
    """MNIST (the test set: 9,000 indexed, 1,000 queries), float32 on the GPU: recall@10
    within 0.01 of the CPU index's and above 0.95 at 64 candidates."""
    import cupy

    from mgpu import io
    from mgpu.models import GraphIndex

    X = io.load(str(data_dir / "vectors" / "mnist_t10k-images-idx3-ubyte.gz"))
    X = X.reshape(len(X), -1).astype(np.float64) / 255
    index, Q = X[:9000], X[9000:]
    truth = np.argsort(((Q ** 2).sum(1)[:, None] - 2 * Q @ index.T + (index ** 2).sum(1)),
                       axis=1, kind="stable")[:, :10]
    params = dict(degree=32, candidates=64)
    r_cpu = _recall(GraphIndex(10, **params).fit(index).kneighbors(Q)[1], truth)
    gpu = GraphIndex(10, **params).fit(cupy.asarray(index, dtype=np.float32))
    r_gpu = _recall(gpu.kneighbors(cupy.asarray(Q, dtype=np.float32))[1].get(), truth)
    assert r_gpu > 0.95 and abs(r_gpu - r_cpu) <= 0.01, (r_gpu, r_cpu)


def test_the_build_command_and_the_bench_on_the_gpu(tmp_path):
    """``mgpu run ann-graph --gpu`` builds on the GPU and writes an index the CPU loads;
    ``bench_ann(gpu=True)`` scores the GPU index and its variants against exact kNN."""
    from click.testing import CliRunner

    from mgpu.bench import ann as bench
    from mgpu.cli import main
    from mgpu.models import GraphIndex

    X, Q = _clustered(np.random.default_rng(10), 3000, 100, 16)
    src = tmp_path / "rows.npy"
    np.save(src, X)
    r = CliRunner().invoke(main, ["run", "ann-graph", str(src), "--gpu", "--degree", "16",
                                  "--out", str(tmp_path / "g.npz")])
    assert r.exit_code == 0, r.output
    index = GraphIndex.load(tmp_path / "g.npz")
    assert index.graph_.shape == (3000, 16) and index.degree_.min() >= 1
    rows = bench.bench_ann(X, Q, k=5, degree=16, build_candidates=32, candidates=(32,),
                           peers=(), gpu=True)
    assert [row["method"] for row in rows] == [
        "mgpu exact (GPU)", "mgpu graph (GPU)", "mgpu graph (GPU, bitonic merge)",
        "mgpu graph (GPU, visited table)", bench.NAIVE, bench.HALF]
    assert all(row["recall"] > 0.9 for row in rows)
    assert abs(rows[-1]["recall"] - rows[1]["recall"]) < 0.02  # half rows: near the same
    assert len({row["recall"] for row in rows[1:4]}) == 1  # the same neighbours


@pytest.mark.multi_gpu(2)
def test_sharded_gpu_index_by_rows_and_by_clusters():
    """A GPU cluster (one worker a GPU): the index fitted on CuPy row tiles, cut by rows
    (every shard searched, host queries) and by clusters (one SPMD job through NCCL; CuPy
    tiles of queries on the workers, or CuPy and numpy queries from the client, give the
    same answers). Recall@10 against exact neighbours within 0.02 of the one-GPU index's;
    two probes find, for every query, at least what one found; the ids' distances are
    theirs."""
    import cupy
    import dask.array as da

    import mgpu
    from mgpu.distributed import connect
    from mgpu.models import GraphIndex

    X, Q = _clustered(np.random.default_rng(11), 40000, 400, 24)
    X, Q = X.astype(np.float32), Q.astype(np.float32)
    _, truth = mgpu.NearestNeighbors(n_neighbors=10).fit(X).kneighbors(Q)
    params = dict(degree=24, candidates=48, batch=512)
    _, one = GraphIndex(10, **params).fit(cupy.asarray(X)).kneighbors(cupy.asarray(Q))
    base = _recall(cupy.asnumpy(one), truth)
    assert base > 0.9
    with connect(gpus=True) as c:
        n = len(c.scheduler_info()["workers"])
        assert n >= 2
        tiles = da.from_array(X, chunks=(-(-X.shape[0] // n), -1)).map_blocks(
            cupy.asarray, meta=cupy.empty((0, 0), np.float32))
        tiles = c.persist(tiles)
        rows = GraphIndex(10, **params).fit(tiles)
        _, ids = rows.kneighbors(Q)
        assert _recall(ids, truth) > base - 0.02
        index = GraphIndex(10, partition="clusters", **params).fit(tiles)
        holders = {w for ws in c.who_has(tiles).values() for w in ws}  # a shard each
        assert sum(index._shards.rows) == X.shape[0] and len(index._shards.rows) == len(holders)
        found = {}
        for probes in (1, 2):
            index.set_params(probes=probes)
            dist, found[probes] = index.kneighbors(Q)
            assert _recall(found[probes], truth) > base - 0.04 + 0.015 * probes
        hits = {p: np.array([np.intersect1d(f, t).size for f, t in zip(i, truth)])
                for p, i in found.items()}
        assert np.all(hits[2] >= hits[1])
        exact = np.linalg.norm(Q[:, None, :].astype(np.float64) - X[found[2]], axis=2)
        np.testing.assert_allclose(dist, exact, rtol=1e-4, atol=1e-3)
        on_workers = c.persist(da.from_array(Q, chunks=(97, -1)).map_blocks(
            cupy.asarray, meta=cupy.empty((0, 0), np.float32)))
        for queries in (on_workers, cupy.asarray(Q)):
            d2, i2 = (np.asarray(a) for a in index.kneighbors(queries))
            np.testing.assert_array_equal(i2, found[2])
            np.testing.assert_allclose(d2, dist, rtol=1e-6)
        self_d, self_i = index.kneighbors(X[:500], 1)
        assert np.mean(self_i[:, 0] == np.arange(500)) > 0.98
        # rows kept halved on the workers: the same graph's search of the rounded rows
        half = GraphIndex(10, partition="clusters", probes=2, half=True, **params).fit(tiles)
        hd, hi = half.kneighbors(Q)
        assert _recall(hi, truth) > _recall(found[2], truth) - 0.02
        rounded = X.astype(np.float16).astype(np.float64)
        np.testing.assert_allclose(hd, np.linalg.norm(Q[:, None, :] - rounded[hi], axis=2),
                                   rtol=1e-4, atol=1e-3)


@pytest.mark.multi_gpu(2)
def test_the_scaling_bench_on_gpus():
    """``bench_ann_scaling(gpu=True)`` on two GPU workers: every row scored, the sharded
    rows' recall near the one-GPU index's."""
    from mgpu.bench.ann_scaling import bench_ann_scaling
    from mgpu.synthetic import clustered_rows

    R = clustered_rows(30000, 16).astype(np.float32)
    rows = bench_ann_scaling(R[:28000], R[28000:], workers=(2,), degree=16, build_candidates=32,
                             candidates=(32,), probes=(1, 2), gpu=True, repeats=2)
    assert [r["method"] for r in rows] == ["1 GPU", "2 GPUs, clusters, probes 1",
                                           "2 GPUs, clusters, probes 2", "2 GPUs, rows"]
    assert all(r["recall"] > rows[0]["recall"] - 0.02 for r in rows)
    assert rows[1]["job_qps"] > 0 and rows[3]["job_qps"] is None
