"""Promises that docs/reliability.md lists: a lost worker costs time, not results; the embedded
cluster is reachable from this machine only; user files are never unpickled."""
from __future__ import annotations

import os
import re
import signal
import time

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from conftest import REPO_ROOT
from dask.core import flatten

import mgpu
from mgpu.distributed import chunk_workers, from_scipy, gather, workers_now

# Seconds any one wait of a worker-loss test may take: a hang fails the test with a message.
WAIT = 60


def test_jaccard_result_survives_a_killed_worker():
    """A worker process is killed as soon as the first row block is back; the blocks it held
    or would have run are computed elsewhere (or by its restarted process) and the weights
    are identical to an undisturbed run."""
    rng = np.random.default_rng(0)
    A = sp.random(3000, 3000, density=0.004, random_state=rng, format="csr")
    G = ((A + A.T) > 0).astype(np.float64).tocsr()
    ref = mgpu.jaccard(G)
    with mgpu.connect(gpus=False, n_workers=3) as client:
        killed = []

        def kill_one(_edges: int) -> None:
            if not killed:
                addr, pid = sorted(client.run(os.getpid).items())[0]
                os.kill(pid, signal.SIGKILL)
                killed.append(addr)

        J = mgpu.jaccard(G, parts=24, client=client, progress=kill_one)
    assert killed
    assert (J != ref).nnz == 0 and np.array_equal(J.indptr, ref.indptr)


@pytest.fixture(scope="module")
def cluster3():
    """Three single-thread worker processes behind nannies (a killed one is restarted).

    The cluster's clean-up of a lost worker is put off: ``lost-worker-timeout`` (15 s) after
    a worker leaves, the cluster closes its nanny if no worker of its name is connected just
    then. A test that kills the worker of a name about 15 s after an earlier test killed it
    would meet that check mid-restart, lose the nanny, and leave the cluster one worker short
    for the tests after it."""
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}):
        with mgpu.connect(gpus=False, n_workers=3) as client:
            yield client


@pytest.fixture
def client3(cluster3):
    """cluster3 at full strength and settled: its three worker processes up, the same ones
    for a second (the one killed by the last test is restarted by its nanny, usually within
    seconds; a test that began during that restart could lose a second worker to it, which
    no checkpoint survives, or find its victim's process gone before the kill)."""
    deadline = time.monotonic() + WAIT
    seen = None
    while True:
        cluster3.wait_for_workers(3, timeout=max(1.0, deadline - time.monotonic()))
        now = cluster3.run(os.getpid)
        if len(now) == 3 and now == seen:
            return cluster3
        if time.monotonic() > deadline:
            raise TimeoutError(f"the cluster's workers did not settle within {WAIT} s: {now}")
        seen = now
        time.sleep(1.0)


def _kill_holder(client, x) -> str:
    """Kill (SIGKILL) the process of the worker holding x's first chunk; its address."""
    victim = chunk_workers(x, client)[(0,) * x.ndim][0]
    os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
    return victim


def _through_a_kill(client, out, tiles):
    """``out`` persisted and brought back, with the worker holding the first tile of
    ``tiles`` killed as soon as the first block of ``out`` is done: that worker's tiles and
    results are gone and must be made again. Every wait is bounded."""
    from distributed import wait

    out = client.persist(out)
    futures = [out.dask[k] for k in flatten(out.__dask_keys__())]
    wait(futures, timeout=WAIT, return_when="FIRST_COMPLETED")
    _kill_holder(client, tiles)
    wait(futures, timeout=WAIT)
    return out


@pytest.mark.timeout(2 * WAIT)
@pytest.mark.parametrize("axis", [0, 1])
def test_sddmm_result_survives_a_killed_worker(client3, axis):
    """Tiles of S and pieces of the split factor held by a killed worker are made again
    elsewhere; every value equals an undisturbed run's to the last bit."""
    rng = np.random.default_rng(1)
    S = sp.random(1200, 900, density=0.02, random_state=rng, format="csr")
    A, B = rng.standard_normal((1200, 16)), rng.standard_normal((900, 16))
    Sd = from_scipy(S, 12, axis=axis, client=client3)
    ref = gather(mgpu.sddmm(Sd, A, B))
    Sd = from_scipy(S, 12, axis=axis, client=client3)
    got = gather(_through_a_kill(client3, mgpu.sddmm(Sd, A, B), Sd))
    assert np.array_equal(got.indptr, ref.indptr) and np.array_equal(got.indices, ref.indices)
    assert np.array_equal(got.data, ref.data)


@pytest.mark.timeout(2 * WAIT)
def test_a_loop_of_sddmm_calls_goes_on_after_a_worker_is_lost(client3):
    """The calls of a loop remember where S's tiles are; after the holder of a tile is killed
    the next calls (which still name it) run where the tiles are made again, and every
    result equals the first call's to the last bit."""
    from distributed import wait

    rng = np.random.default_rng(4)
    S = sp.random(1200, 900, density=0.02, random_state=rng, format="csr")
    A, B = rng.standard_normal((1200, 16)), rng.standard_normal((900, 16))
    Sd = from_scipy(S, 6, axis=0, client=client3)
    ref = gather(mgpu.sddmm(Sd, A, B))
    _kill_holder(client3, Sd)
    for _ in range(3):
        P = mgpu.sddmm(Sd, A, B)
        wait(P, timeout=WAIT)
        assert np.array_equal(gather(P).data, ref.data)


@pytest.mark.timeout(2 * WAIT)
@pytest.mark.parametrize("op", ["spmv", "spmm", "row_norms"])
def test_spmv_spmm_and_row_norms_survive_a_killed_worker(client3, op):
    rng = np.random.default_rng(2)
    A = sp.random(3000, 500, density=0.02, random_state=rng, format="csr")
    x = rng.standard_normal(500) if op == "spmv" else rng.standard_normal((500, 4))

    def run(tiles):
        return mgpu.row_norms(tiles) if op == "row_norms" else getattr(mgpu, op)(tiles, x)

    ref = run(from_scipy(A, 12, axis=0, client=client3)).compute()
    tiles = from_scipy(A, 12, axis=0, client=client3)
    got = _through_a_kill(client3, run(tiles), tiles).compute()
    assert got.dtype == ref.dtype and np.array_equal(got, ref)


@pytest.mark.timeout(2 * WAIT)
def test_spgemm_result_survives_a_killed_worker(client3):
    """A worker process is killed as soon as the first row tile of ``spgemm(parts=N)`` is
    done: the tiles it held or would have run (and B, if it held it) are made again
    elsewhere from their tasks, and C equals an undisturbed run's to the last bit."""
    rng = np.random.default_rng(5)
    A = sp.random(2000, 800, density=0.01, random_state=rng, format="csr")
    B = sp.random(800, 600, density=0.02, random_state=rng, format="csr")
    ref = gather(mgpu.spgemm(A, B, parts=12, client=client3))
    killed = []

    def kill_one(_work: int) -> None:
        if not killed:
            addr, pid = sorted(client3.run(os.getpid).items())[0]
            os.kill(pid, signal.SIGKILL)
            killed.append(addr)

    C = mgpu.spgemm(A, B, parts=12, client=client3, progress=kill_one)
    got = gather(C)
    assert killed
    assert np.array_equal(got.indptr, ref.indptr) and np.array_equal(got.indices, ref.indices)
    assert np.array_equal(got.data, ref.data)


@pytest.mark.timeout(2 * WAIT)
def test_knn_result_survives_a_killed_worker(client3):
    """The worker holding an index tile is killed after the first query batch is merged;
    the tile is made again (and prepared again) elsewhere and the neighbours are identical."""
    rng = np.random.default_rng(3)
    index = sp.random(3000, 400, density=0.02, random_state=rng, format="csr")
    queries = sp.random(600, 400, density=0.02, random_state=rng, format="csr")
    budget = 8 * 500 * 50  # 50 queries a batch against a tile of 500 rows: 12 batches
    ref = mgpu.knn(from_scipy(index, 6, axis=0, client=client3), queries, 5,
                   working_memory=budget)
    Xd = from_scipy(index, 6, axis=0, client=client3)
    killed = []

    def kill_one(_queries: int) -> None:
        if not killed:
            killed.append(_kill_holder(client3, Xd))

    got = mgpu.knn(Xd, queries, 5, working_memory=budget, progress=kill_one)
    assert killed
    assert np.array_equal(got[1], ref[1]) and np.array_equal(got[0], ref[0])
    local = mgpu.knn(index, queries, 5)
    assert np.array_equal(got[1], local[1]) and np.allclose(got[0], local[0])


def test_a_job_whose_workers_are_gone_stops_with_a_message_not_a_hang():
    """Every worker retired and none coming back: kNN's and jaccard's waits give up after
    mgpu.dist.stall-timeout, saying what they waited for, instead of waiting forever."""
    import dask

    from mgpu.distributed import connect

    rng = np.random.default_rng(0)
    A = sp.random(200, 200, density=0.05, random_state=rng, format="csr")
    G = ((A + A.T) > 0).astype(np.float64).tocsr()
    with connect(gpus=False, n_workers=1) as client:
        index = from_scipy(A, 2, client=client)
        client._mgpu_cluster.scale(0)  # a LocalCluster would start a retired worker again
        deadline = time.monotonic() + 30
        while workers_now(client) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not workers_now(client)
        with dask.config.set({"mgpu.dist.stall-timeout": "2s"}):
            # kNN's first wait: the tiles' nonzeros, counted for its working-memory check
            with pytest.raises(TimeoutError, match=r"knn's index tiles \(their nonzeros, for "
                               r"the working-memory check\): 1 of 1 task\(s\) made no "
                               r"progress for 2 s, with 0 worker\(s\)"):
                mgpu.knn(index, A[:5], 3)
            with pytest.raises(TimeoutError, match=r"jaccard's row blocks: .* no progress "
                               r"for 2 s, with 0 worker"):
                mgpu.jaccard(G, parts=2, client=client)


def test_embedded_cluster_listens_on_localhost_only():
    with mgpu.connect(gpus=False, n_workers=2) as client:
        addresses = [client.scheduler.address, *workers_now(client)]
    assert addresses and all(a.startswith("tcp://127.0.0.1:") for a in addresses), addresses


def test_no_user_file_is_ever_unpickled():
    """No pickle loads and no allow_pickle=True anywhere in the library or the workflows."""
    bad = re.compile(r"allow_pickle\s*=\s*True|pickle\.loads?\(|\.load\(.*mmap_mode")
    offenders = []
    for folder in ("mgpu", "workflows", "deploy"):
        for path in (REPO_ROOT / folder).rglob("*.py"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if bad.search(line):
                    offenders.append(f"{path.relative_to(REPO_ROOT)}:{n}: {line.strip()}")
    assert not offenders, offenders


def _killer_at_iteration(client, iteration: int):
    """A progress callback that kills (SIGKILL) one worker's process when the record of
    ``iteration`` arrives, and the list it appends that worker's address to. The process is
    found before the fit, so that the callback itself does nothing but kill."""
    killed = []
    addr, pid = sorted(client.run(os.getpid).items())[0]

    def kill_one(rec: dict) -> None:
        if rec["iteration"] == iteration and not killed:
            os.kill(pid, signal.SIGKILL)
            killed.append(addr)

    return kill_one, killed


@pytest.mark.timeout(4 * WAIT)
def test_gradient_mf_training_survives_a_killed_worker(client3):
    """GradientMF across the cluster (one SPMD call): a worker is killed after the second
    step; the fit starts again from its last checkpoint (every step here) on the workers
    that remain, the lost worker's tiles made again from their tasks, and every RMSE and
    both factors equal an undisturbed run's (sums over the tiles go in tile order, whoever
    holds them)."""
    from mgpu.mf import split_ratings
    from mgpu.models import GradientMF

    rng = np.random.default_rng(4)
    R = sp.random(600, 300, density=0.05, format="csr", random_state=rng,
                  data_rvs=lambda s: rng.uniform(1, 5, s))
    train, test = split_ratings(R, 0.2, 0)
    ref = GradientMF(k=8, iters=6, lr=0.05).fit(train, test, parts=6, client=client3)
    kill_one, killed = _killer_at_iteration(client3, 2)
    with dask.config.set({"mgpu.spmd.checkpoint-every": 1}):
        got = GradientMF(k=8, iters=6, lr=0.05).fit(train, test, parts=6, client=client3,
                                                    progress=kill_one)
    assert killed
    for key in ("train_rmse", "test_rmse"):
        assert [h[key] for h in got.history_] == [h[key] for h in ref.history_]
    assert np.array_equal(got.U_, ref.U_) and np.array_equal(got.V_, ref.V_)


@pytest.mark.timeout(4 * WAIT)
def test_gap_fit_survives_a_killed_worker(client3):
    """The topic model across the cluster (one SPMD job): a worker is killed after the
    second iteration; the job starts again from its last checkpoint (the start, at the
    default mgpu.spmd.checkpoint-every) on the workers that remain, and every
    log-likelihood and both factors equal an undisturbed run's."""
    from mgpu.models import GaP

    rng = np.random.default_rng(5)
    S = sp.random(400, 250, density=0.05, format="csr", random_state=rng,
                  data_rvs=lambda s: rng.integers(1, 6, s).astype(float))
    ref = GaP(5, iters=5).fit(S, parts=6, client=client3)
    kill_one, killed = _killer_at_iteration(client3, 2)
    got = GaP(5, iters=5).fit(S, parts=6, client=client3, progress=kill_one)
    assert killed
    assert [h["loglik_per_token"] for h in got.history_] == \
        [h["loglik_per_token"] for h in ref.history_]
    assert np.array_equal(got.X_, ref.X_) and np.array_equal(got.L_, ref.L_)
