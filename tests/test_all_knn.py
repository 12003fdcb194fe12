"""All-kNN SPMD (every row of a corpus against all its rows, the rows going round the ring of
workers) against the one-device mgpu.knn: the same ids, the same distances."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import scipy.sparse as sp

import mgpu
from mgpu.distributed.knn_graph import all_knn, merge_sorted, one_worker_kind
from mgpu.distributed.knn import merge_top_k
from mgpu.ops.distances import drop_self
from mgpu.synthetic import powerlaw_csr
from mgpu.distributed import workers_now


def _corpus(seed: int, n: int = 90, m: int = 40) -> sp.csr_matrix:
    """Counts with exact ties (small integers, duplicated rows) and empty rows."""
    S = powerlaw_csr(n, m, 6 * n, seed=seed).astype(np.float64)
    S.data = np.minimum(np.ceil(S.data), 3.0)
    S = sp.vstack([S, S[:4], sp.csr_matrix((3, m))]).tocsr()  # duplicates, empty rows
    return S[np.random.default_rng(seed).permutation(S.shape[0])].tocsr()


@pytest.fixture(scope="module")
def two_workers():
    with mgpu.connect(gpus=False, n_workers=2) as client:
        yield client


@pytest.fixture(scope="module", params=[2, 3], ids=["2-workers", "3-workers"])
def cluster(request):
    if request.param == 2:
        yield request.getfixturevalue("two_workers")
        return
    with mgpu.connect(gpus=False, n_workers=request.param) as client:
        yield client


# ------------------------------------------------------------------------- the merge


@pytest.mark.parametrize("largest", [False, True])
def test_merge_sorted_is_merge_top_k_with_ties(xp, largest):
    rng = np.random.default_rng(0)
    for k in (1, 4, 9):
        a_d = np.sort(rng.integers(0, 4, (50, k)).astype(np.float64), axis=1)
        b_d = np.sort(rng.integers(0, 4, (50, 7)).astype(np.float64), axis=1)
        if largest:
            a_d, b_d = a_d[:, ::-1].copy(), b_d[:, ::-1].copy()
        ids = rng.permutation(1000)[: 50 * (k + 7)].reshape(50, k + 7)
        a, b = (a_d, ids[:, :k]), (b_d, ids[:, k:])
        want = merge_top_k(a, b, k, largest)
        got = merge_sorted(tuple(xp.asarray(x) for x in a), tuple(xp.asarray(x) for x in b),
                           k, largest)
        assert type(got[0]) is type(xp.asarray(a_d))  # merged on the lists' device
        np.testing.assert_array_equal(_host(got[1]), want[1])
        np.testing.assert_array_equal(_host(got[0]), want[0])


def test_merge_sorted_ties_negative_zero_and_empty_slots(xp):
    inf, none = np.inf, np.iinfo(np.int64).max
    a = (xp.asarray([[0.0, 1.0, inf]]), xp.asarray([[5, 2, none]]))
    b = (xp.asarray([[-0.0, inf]]), xp.asarray([[3, 8]]))
    d, i = merge_sorted(a, b, 4, False)
    # -0.0 ties with 0.0 (the lower id first); a real infinite distance before an empty slot
    assert _host(i).tolist() == [[3, 5, 2, 8]]
    assert _host(d).tolist() == [[0.0, 0.0, 1.0, inf]]


def _host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)  # test helper: cupy or numpy


# ------------------------------------------------------------- SPMD on CPU workers


@pytest.mark.parametrize("metric", ["cosine", "euclidean", "manhattan"])
def test_all_knn_equals_one_device(cluster, metric):
    S = _corpus(1)
    n_workers = len(workers_now(cluster))
    want_d, want_i = mgpu.knn(S, S, 6, metric=metric)
    for parts in (n_workers, 2 * n_workers + 1):  # one tile a worker, and several
        X = mgpu.from_scipy(S, parts, client=cluster)
        d, i = all_knn(X, 6, metric=metric, client=cluster)
        np.testing.assert_array_equal(i, want_i)
        np.testing.assert_allclose(d, want_d, rtol=1e-12, atol=1e-12)
        assert d.dtype == np.float64 and i.dtype == np.int64


def test_all_knn_k_larger_than_a_tile(cluster):
    S = _corpus(2, n=30)
    X = mgpu.from_scipy(S, 9, client=cluster)  # tiles of about 4 rows
    k = int(max(X.chunks[0])) + 5
    for metric in ("cosine", "manhattan"):
        want_d, want_i = mgpu.knn(S, S, k, metric=metric)
        d, i = all_knn(X, k, metric=metric, client=cluster)
        np.testing.assert_array_equal(i, want_i)
        np.testing.assert_allclose(d, want_d, rtol=1e-12, atol=1e-12)
    d, i = all_knn(X, S.shape[0], metric="euclidean", client=cluster)  # every row
    np.testing.assert_array_equal(i, mgpu.knn(S, S, S.shape[0], metric="euclidean")[1])


def test_all_knn_progress_counts_every_row(two_workers):
    cluster = two_workers
    S = _corpus(3)
    seen = []
    all_knn(mgpu.from_scipy(S, client=cluster), 3, metric="cosine", client=cluster,
            progress=seen.append)
    assert sum(seen) == S.shape[0] and all(s > 0 for s in seen)


def test_a_tile_with_nan_ends_the_call_on_every_worker(two_workers):
    cluster = two_workers
    S = _corpus(4)
    S.data[-1] = np.nan  # in the last tile only
    X = mgpu.from_scipy(S, client=cluster)
    with pytest.raises(ValueError, match="all_knn refused a tile of X: .*NaN"):
        all_knn(X, 3, client=cluster)
    # the workers are free again: the next call runs
    T = _corpus(5)
    np.testing.assert_array_equal(all_knn(mgpu.from_scipy(T, client=cluster), 2,
                                          client=cluster)[1], mgpu.knn(T, T, 2)[1])


def test_all_knn_refusals(two_workers):
    cluster = two_workers
    S = _corpus(6)
    X = mgpu.from_scipy(S, client=cluster)
    with pytest.raises(ValueError, match=r"The 'k' parameter of all_knn must be .* Got 500"):
        all_knn(X, 500, client=cluster)
    with pytest.raises(ValueError, match="The 'metric' parameter of all_knn must be"):
        all_knn(X, 2, metric="nope", client=cluster)
    with pytest.raises(ValueError, match="The 'working_memory' parameter of all_knn"):
        all_knn(X, 2, working_memory="lots", client=cluster)
    with pytest.raises(ValueError, match="The 'progress' parameter of all_knn"):
        all_knn(X, 2, progress=3, client=cluster)
    with pytest.raises(TypeError, match=r"'X' parameter of all_knn must be a dask array .* "
                                        r"mgpu.knn\(S, S, k\)"):
        all_knn(S, 2, client=cluster)
    import dask.array as da

    with pytest.raises(TypeError, match="must hold sparse \\(CSR\\) tiles"):
        all_knn(da.from_array(S.toarray(), chunks=(40, 40)), 2, client=cluster)
    with pytest.raises(ValueError, match="working memory of knn .* cannot hold one query"):
        all_knn(X, 2, working_memory=64, client=cluster)


def test_all_knn_without_a_cluster(monkeypatch):
    from mgpu.distributed import knn_graph as module

    monkeypatch.setattr(module, "current_client", lambda: None)  # whatever else runs here
    X = mgpu.from_scipy(_corpus(7), client=None)
    with pytest.raises(ValueError, match=r"all_knn runs on a cluster: call mgpu.connect\(\)"):
        all_knn(X, 2)


# ------------------------------------------------------------------- the kNN graph


def test_knn_graph_goes_spmd_on_one_worker_kind_and_by_tasks_on_a_mixed_one(
        two_workers, monkeypatch, caplog):
    from mgpu.bench.knn_graph import knn_graph
    from mgpu.distributed import knn_graph as module

    cluster = two_workers
    S = _corpus(8)
    k = 5
    want_d, want_i = drop_self(*mgpu.knn(S, S, k + 1, metric="cosine"), k)
    address = cluster.scheduler.address
    assert one_worker_kind(cluster)
    with caplog.at_level(logging.INFO, logger="mgpu.bench.knn_graph"):
        G, d, i = knn_graph(S, k, metric="cosine", address=address)
    assert "the rows go round the" in caplog.text
    np.testing.assert_array_equal(i, want_i)
    np.testing.assert_allclose(d, want_d, rtol=1e-12, atol=1e-12)
    assert G.nnz == S.shape[0] * k and G.diagonal().max() == 0

    # a worker that says it has a GPU makes the cluster mixed: the task path, same graph
    first = sorted(workers_now(cluster))[:1]
    monkeypatch.setattr(module, "gpu_workers", lambda client: first)
    assert not one_worker_kind(cluster)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mgpu.bench.knn_graph"):
        G2, d2, i2 = knn_graph(S, k, metric="cosine", address=address)
    assert "a mixed cluster" in caplog.text
    np.testing.assert_array_equal(i2, want_i)
    assert (G2 != G).nnz == 0


def test_bench_knn_graph_on_cpu_workers(tmp_path):
    import json

    from click.testing import CliRunner

    from mgpu.cli import main

    out = tmp_path / "g.json"
    r = CliRunner().invoke(main, ["bench", "knn-graph", "--corpus", "600x200", "--density",
                                  "0.02", "--workers", "1,2", "--device", "cpu", "-k", "4",
                                  "--metric", "manhattan", "--weak-rows", "200", "--json",
                                  str(out)])
    assert r.exit_code == 0, r.output
    rows = json.loads(out.read_text())
    assert [(row["mode"], row["workers"]) for row in rows] == [
        ("one device", 0), ("strong", 1), ("weak", 1), ("strong", 2), ("weak", 2)]
    n = rows[0]["rows"]
    assert [row["rows"] for row in rows] == [n, n, 200, n, 400]
    # every run finds exactly the one-device neighbours (ties to the lower id)
    assert all(row["ids_equal"] for row in rows[1:])
    for row in rows[1:]:
        if row["mode"] == "strong":
            assert row["speedup"] == pytest.approx(rows[0]["seconds"] / row["seconds"])
    weak = [row for row in rows if row["mode"] == "weak"]
    assert weak[0]["efficiency"] == 1.0
    assert weak[1]["efficiency"] == pytest.approx(
        (400 * 400 / weak[1]["seconds"] / 2) / (200 * 200 / weak[0]["seconds"]))
    assert "| 2 CPU SPMD |" in r.output and "| weak scaling |" in r.output


def test_bench_knn_graph_refuses_bad_options(tmp_path):
    from click.testing import CliRunner

    from mgpu.cli import main

    args = ["bench", "knn-graph", "--corpus", "50x20", "--device", "cpu"]
    r = CliRunner().invoke(main, args + ["--metric", "nope"])
    assert r.exit_code != 0 and "'metric' parameter of bench knn-graph" in r.output
    r = CliRunner().invoke(main, args + ["-k", "500"])
    assert r.exit_code != 0 and "must be below the" in r.output
    r = CliRunner().invoke(main, args + ["--weak-rows", "-1"])
    assert r.exit_code != 0 and "--weak-rows" in r.output


# ---------------------------------------------------------------------------- GPUs


@pytest.mark.gpu
@pytest.mark.multi_gpu(2)
@pytest.mark.parametrize("metric", ["cosine", "euclidean", "manhattan"])
def test_all_knn_on_two_gpu_workers_equals_one_gpu(metric):
    import cupyx.scipy.sparse as csp

    S = sp.vstack([powerlaw_csr(3000, 500, 60000, seed=9), sp.csr_matrix((2, 500))]).tocsr()
    S = S.astype(np.float32)
    k = 11
    want_d, want_i = mgpu.knn(csp.csr_matrix(S), csp.csr_matrix(S), k, metric=metric)
    with mgpu.connect(gpus=True, n_workers=2) as client:
        for parts in (2, 5):
            X = mgpu.from_scipy(S, parts, client=client)
            assert X._meta.__class__.__module__.startswith("cupyx")  # tiles on the GPUs
            d, i = all_knn(X, k, metric=metric, client=client)
            np.testing.assert_array_equal(i, want_i.get())
            np.testing.assert_allclose(d, want_d.get(), rtol=1e-6, atol=1e-6)
        # k above a tile's rows: 8 tiles of about 75 rows
        X = mgpu.from_scipy(S[:600], 8, client=client)
        want = mgpu.knn(csp.csr_matrix(S[:600]), csp.csr_matrix(S[:600]), 100, metric=metric)
        np.testing.assert_array_equal(all_knn(X, 100, metric=metric, client=client)[1],
                                      want[1].get())
