"""Cluster connection and partitioned collections, on a CPU LocalCluster (GPU ones marked)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from distributed import LocalCluster

import mgpu
from mgpu.distributed import chunk_nnz, chunk_workers, connect, describe_workers, from_scipy, gather
from mgpu.partition import axis_counts
from mgpu.synthetic import powerlaw_csr
from mgpu.distributed import workers_now


@pytest.fixture(scope="module")
def S():
    return powerlaw_csr(3000, 800, 60_000, seed=1)


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("parts", [1, 2, 5])
def test_round_trip_and_balance(client, S, axis, parts):
    x = from_scipy(S, parts, axis=axis, client=client)
    assert x.numblocks == ((parts, 1) if axis == 0 else (1, parts))
    assert x.name.startswith("mgpu-from-scipy-")
    back = x.compute()
    assert sp.issparse(back) and back.shape == S.shape
    assert (back != S).nnz == 0
    g = gather(x)
    assert g.format == "csr" and (g != S).nnz == 0
    nnz = chunk_nnz(x).ravel()
    assert nnz.sum() == S.nnz
    assert nnz.max() - nnz.min() <= axis_counts(S, axis).max()
    # uneven in rows/columns, even in nonzeros
    sizes = np.array(x.chunks[axis])
    if parts > 1:
        assert len(set(sizes.tolist())) > 1


def test_workers_now_names_every_worker_after_the_clients_periodic_refresh(client):
    """The client's periodic refresh stores the scheduler's identity without its workers;
    workers_now asks the scheduler, so it still names both workers after one."""
    client.sync(client._update_scheduler_info)  # what the refresh does every few seconds
    assert client._scheduler_identity.get("workers", {}) == {}  # the cache the refresh left
    found = workers_now(client)
    assert len(found) == 2 and all(a.startswith("tcp://") for a in found)
    assert set(found) == set(client.nthreads())


def test_chunks_are_spread_over_workers(client, S):
    workers = sorted(workers_now(client))
    x = from_scipy(S, 4, client=client)
    where = chunk_workers(x, client)
    assert [where[(i, 0)] for i in range(4)] == [(workers[i % 2],) for i in range(4)]


def test_gpu_chunks_on_a_cluster_without_gpus_are_refused_before_any_is_sent(client, S):
    def tasks(dask_scheduler):
        return [str(k) for k in dask_scheduler.tasks]

    before = set(client.run_on_scheduler(tasks))
    with pytest.raises(ValueError, match=r"The 'device' parameter of from_scipy is 'gpu', but "
                       r"none of the cluster's 2 worker\(s\) has a GPU\. Pass device='cpu'"):
        from_scipy(S, device="gpu")
    new = set(client.run_on_scheduler(tasks)) - before
    assert not [k for k in new if "from-scipy" in k]  # no chunk was sent
    assert from_scipy(S, 2, device="auto").numblocks == (2, 1)  # CPU chunks, as before


def test_default_parts_is_one_per_worker(client, S):
    x = from_scipy(S, client=client)
    assert x.numblocks == (2, 1)


def test_progress_reports_every_chunk(client, S):
    seen: list[int] = []
    from_scipy(S, 3, client=client, progress=seen.append)
    assert len(seen) == 3 and sum(seen) == S.nnz


def test_duplicates_are_summed_and_input_untouched(client):
    D = sp.coo_matrix(([1.0, 2.0, 4.0], ([0, 0, 1], [1, 1, 0])), shape=(2, 2)).tocsr()
    D.has_canonical_format = False
    D2 = sp.csr_matrix((np.array([1.0, 2.0, 4.0]), np.array([1, 1, 0]), np.array([0, 2, 3])),
                       shape=(2, 2))
    data_before = D2.data.copy()
    x = from_scipy(D2, 2, client=client)
    assert gather(x).toarray().tolist() == [[0.0, 3.0], [4.0, 0.0]]
    assert np.array_equal(D2.data, data_before)


def test_distributed_row_norms_match_local(client, S):
    x = from_scipy(S, 3, client=client)
    np.testing.assert_allclose(mgpu.row_norms(x).compute(), mgpu.row_norms(S), rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(S=np.ones((3, 3))), TypeError, r"must be a scipy sparse matrix\. Got ndarray"),
        (dict(axis=2), ValueError, r"'axis' parameter of from_scipy must be 0 \(rows\)"),
        (dict(parts=0), ValueError, r"'parts' parameter of from_scipy must be an int >= 1"),
        (dict(device="tpu"), ValueError, r"'device' parameter of from_scipy must be a str among"),
    ],
)
def test_from_scipy_refuses_bad_input(S, kwargs, exc, match):
    args = {"S": S, **kwargs}
    with pytest.raises(exc, match=match):
        from_scipy(args.pop("S"), **args, client=None)


def test_worker_description(client):
    info = describe_workers(client)
    assert len(info) == 2
    for w in info.values():
        assert w["gpu"] is None and w["nthreads"] >= 1 and w["pid"] > 0


def test_connect_joins_a_running_cluster_and_leaves_it_running():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp",
                      host="127.0.0.1", dashboard_address=None) as cluster:
        with connect(cluster.scheduler_address, timeout=20) as c:
            assert len(workers_now(c)) == 1
        assert cluster.status.name == "running"
        with connect(cluster.scheduler_address, timeout=20) as c2:
            assert c2.submit(sum, [1, 2]).result() == 3


def test_embedded_cluster_closes_with_the_client():
    with connect(gpus=False, n_workers=1) as c:
        cluster = c._mgpu_cluster
        assert c.submit(lambda: 41 + 1).result() == 42
    assert cluster.status.name == "closed"


def _scheduler_intervals(dask_scheduler):
    return ([b.interval for b in dask_scheduler.stream_comms.values()],
            [b.interval for b in dask_scheduler.client_comms.values()])


def test_connect_lowers_every_batching_of_the_cluster():
    """Client → scheduler, scheduler → workers and clients, workers → scheduler all send
    within mgpu.connect.batch-interval, also for a worker that joins later."""
    import dask.config

    with dask.config.set({"mgpu.connect.batch-interval": "3ms"}):
        with connect(gpus=False, n_workers=1) as c:
            c.cluster.scale(2)
            c.wait_for_workers(2, timeout=30)
            assert c.scheduler_comm.interval == pytest.approx(0.003)
            to_workers, to_clients = c.run_on_scheduler(_scheduler_intervals)
            assert len(to_workers) == 2 and to_workers == pytest.approx([0.003] * 2)
            assert to_clients == pytest.approx([0.003])
            assert list(c.run(lambda dask_worker: dask_worker.batched_stream.interval).values()) \
                == pytest.approx([0.003] * 2)
            assert c.submit(lambda: 2 * 21).result() == 42


def test_connect_leaves_the_batching_alone_when_told_to():
    import dask.config

    with dask.config.set({"mgpu.connect.batch-interval": None}):
        with connect(gpus=False, n_workers=1) as c:
            assert c.scheduler_comm.interval == pytest.approx(0.010)  # distributed's own
            to_workers, _ = c.run_on_scheduler(_scheduler_intervals)
            assert to_workers == pytest.approx([0.005])


def test_connect_refuses_a_cpu_worker_it_cannot_add(monkeypatch):
    import mgpu.distributed.cluster as cl

    with pytest.raises(ValueError, match="'cpu_threads' parameter of connect adds a CPU worker "
                       "to an embedded cluster and must be >= 1. Got 2 with an address"):
        connect("tcp://127.0.0.1:9", cpu_threads=2)
    with pytest.raises(ValueError, match="must be >= 1. Got 0."):
        connect(cpu_threads=0)
    monkeypatch.setattr(cl, "visible_gpus", lambda: 0)
    with pytest.raises(ValueError, match="adds a CPU worker beside GPU workers; an embedded CPU "
                       "cluster is sized by n_workers"):
        connect(gpus=False, cpu_threads=2)


def test_connect_to_nothing_times_out_with_a_message(monkeypatch):
    """A scheduler that does not come up within the timeout is named. (An address where
    nothing listens is refused before that wait, by a probe, tested in
    test_cli_bad_input.py; without the probe the client's own wait runs out.)"""
    import mgpu.distributed.cluster as cl

    monkeypatch.setattr(cl, "_probe", lambda address, wait=2.0: None)
    with pytest.raises(TimeoutError, match=r"The scheduler at tcp://127.0.0.1:9 did not come up "
                       r"within 2 s"):
        connect("tcp://127.0.0.1:9", timeout=2)


def test_connect_refuses_gpus_without_gpus(monkeypatch):
    import mgpu.distributed.cluster as cl

    monkeypatch.setattr(cl, "visible_gpus", lambda: 0)
    with pytest.raises(ValueError, match="gpus=True but no GPU is visible"):
        connect(gpus=True)


@pytest.mark.gpu
def test_gpu_round_trip():
    import cupyx.scipy.sparse as csp

    S = powerlaw_csr(20000, 5000, 400_000, seed=2)
    with connect(gpus=True) as c:
        n = len(workers_now(c))
        x = from_scipy(S, 2 * n, client=c)
        assert isinstance(x._meta, csp.csr_matrix)
        back = x.compute()
        assert isinstance(back, csp.spmatrix)
        assert (gather(x) != S).nnz == 0
        got = mgpu.row_norms(x).compute()
        np.testing.assert_allclose(got.get(), mgpu.row_norms(S), rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.multi_gpu(2)
def test_collection_spans_every_gpu():
    S = powerlaw_csr(50000, 8000, 1_000_000, seed=3)
    with connect(gpus=True) as c:
        infos = describe_workers(c)
        uuids = {i["gpu"]["uuid"] for i in infos.values()}
        assert len(uuids) == len(infos) >= 2, infos
        x = from_scipy(S, len(infos), client=c)
        where = chunk_workers(x, c)
        assert {w[0] for w in where.values()} == set(infos)
        assert (gather(x) != S).nnz == 0


@pytest.mark.gpu
def test_gpu_tiles_are_sized_by_their_arrays():
    import cupyx.scipy.sparse as csp
    from dask.sizeof import sizeof

    S = powerlaw_csr(2000, 500, 30_000, seed=4)
    for X in (csp.csr_matrix(S), csp.coo_matrix(S)):
        names = ("data", "indices", "indptr", "row", "col")
        arrays = [getattr(X, n) for n in names if hasattr(X, n)]
        assert sizeof(X) == sum(a.nbytes for a in arrays) > S.nnz * 8
