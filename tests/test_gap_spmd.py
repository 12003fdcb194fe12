"""The GaP topic model fitted SPMD on a cluster (one task per worker, Λ's update all-reduced
between them): the one-device numbers, progress without a round trip, and a lost worker
resumed from the last checkpoint."""
from __future__ import annotations

import logging
import os
import signal

import dask.config
import numpy as np
import pytest
import scipy.sparse as sp

import mgpu
from mgpu.models import GaP, gap
from mgpu.synthetic import powerlaw_corpus

# Seconds any one wait of the worker-loss test may take: a hang fails the test.
WAIT = 60


def _corpus() -> sp.csr_matrix:
    return powerlaw_corpus(900, 400, 0.03, seed=7).astype(np.float64)


@pytest.fixture(scope="module")
def cluster3():
    """Three single-thread worker processes behind nannies (a killed one is restarted)."""
    with mgpu.connect(gpus=False, n_workers=3) as client:
        yield client


@pytest.fixture
def client3(cluster3):
    """cluster3 with its three workers up (the one the loss test killed comes back)."""
    cluster3.wait_for_workers(3, timeout=WAIT)
    return cluster3


@pytest.fixture
def no_rounds(monkeypatch):
    """Fail a fit that takes the per-round path: these clusters are all CPU workers."""
    def rounds(*args, **kwargs):
        raise AssertionError("a cluster of CPU workers only must fit SPMD, not per round")

    monkeypatch.setattr(GaP, "_fit_rounds", rounds)


@pytest.mark.parametrize("parts", [2, 3, 5])
def test_spmd_fit_equals_one_device(client3, no_rounds, parts):
    """Tiles on 2 and 3 workers (and 5 tiles on 3 workers, several on a rank): every
    iteration's log-likelihood per token and both factors are the one-device fit's."""
    S = _corpus()
    one = GaP(6, iters=8, seed=4).fit(S)
    seen: list[dict] = []
    spread = GaP(6, iters=8, seed=4).fit(S, parts=parts, client=client3, progress=seen.append)
    ll = [h["loglik_per_token"] for h in spread.history_]
    np.testing.assert_allclose(ll, [h["loglik_per_token"] for h in one.history_], rtol=1e-10)
    assert ll[-1] > ll[0]
    np.testing.assert_allclose(spread.X_, one.X_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(spread.L_, one.L_, rtol=1e-9, atol=1e-15)
    assert isinstance(spread.X_, np.ndarray) and spread.X_.shape == (S.shape[0], 6)
    # progress: every iteration once, in order, the records of history_
    assert [r["iteration"] for r in seen] == list(range(1, 9))
    assert [r["loglik_per_token"] for r in seen] == ll
    assert all(h["step_s"] > 0 for h in spread.history_)
    elapsed = [h["elapsed_s"] for h in spread.history_]
    assert elapsed == sorted(elapsed) and elapsed[-1] >= sum(h["step_s"] for h in
                                                             spread.history_) * 0.999
    workers = {t["worker"] for t in spread.tiles_}
    assert len(spread.tiles_) == parts and len(workers) == min(parts, 3)
    assert sum(t["rows"] for t in spread.tiles_) == S.shape[0]
    assert sum(t["nnz"] for t in spread.tiles_) == S.nnz


def test_spmd_fit_of_a_dask_array_and_float32(client3, no_rounds):
    """A dask array of row tiles fits where its tiles are; float32 counts fit in float32."""
    S = _corpus().astype(np.float32)
    one = GaP(4, iters=5, seed=1).fit(S)
    spread = GaP(4, iters=5, seed=1).fit(mgpu.from_scipy(S, 3, client=client3))
    np.testing.assert_allclose([h["loglik_per_token"] for h in spread.history_],
                               [h["loglik_per_token"] for h in one.history_], rtol=1e-6)
    assert spread.X_.dtype == spread.L_.dtype == np.float32
    np.testing.assert_allclose(spread.L_, one.L_, rtol=2e-4, atol=1e-9)


def test_spmd_and_per_round_fits_are_the_same_bits(client3, monkeypatch):
    """Both cluster paths add the tiles' shares in tile order: a cluster that mixes GPU and
    CPU workers (the per-round path, forced here) gives exactly the SPMD fit's numbers."""
    S = _corpus()
    spmd_fit = GaP(5, iters=4, seed=3).fit(S, parts=4, client=client3)
    monkeypatch.setattr(gap, "_one_kind", lambda tiles: False)
    calls = []
    monkeypatch.setattr(gap, "spmd", lambda *a, **k: calls.append(a))
    seen: list[dict] = []
    rounds = GaP(5, iters=4, seed=3).fit(S, parts=4, client=client3, progress=seen.append)
    assert not calls
    assert [h["loglik_per_token"] for h in rounds.history_] == \
        [h["loglik_per_token"] for h in spmd_fit.history_]
    assert np.array_equal(rounds.X_, spmd_fit.X_) and np.array_equal(rounds.L_, spmd_fit.L_)
    assert [r["iteration"] for r in seen] == [1, 2, 3, 4]


def test_checks_come_before_any_spmd_work(client3, monkeypatch):
    """Bad parameters and counts are refused on the client, before a job is submitted."""
    monkeypatch.setattr(gap, "spmd", lambda *a, **k: pytest.fail("spmd was submitted"))
    S = _corpus()
    with pytest.raises(ValueError, match="The 'alpha' parameter of GaP must be"):
        GaP(3, alpha=0.5).fit(S, client=client3)
    with pytest.raises(ValueError, match="The 'parts' parameter of GaP.fit must be"):
        GaP(3).fit(S, parts=0, client=client3)
    bad = S.copy()
    bad.data[5] = -1.0
    with pytest.raises(ValueError, match="'S' parameter of GaP.fit must hold non-negative"):
        GaP(3).fit(mgpu.from_scipy(bad, 3, client=client3))
    bad.data[5] = np.nan
    with pytest.raises(ValueError, match="'S' parameter of GaP.fit on a cluster holds NaN"):
        GaP(3).fit(mgpu.from_scipy(bad, 3, client=client3))


def test_an_overflow_on_the_ranks_is_gaps_own_error(client3):
    """An update that overflows float32 ends the job on every rank with the one-device
    message, not a collective's."""
    S = sp.csr_matrix(np.array([[1, 2, 0], [0, 1, 1], [2, 0, 1], [1, 1, 1]], dtype=np.float32))
    with pytest.raises(FloatingPointError, match=r"GaP's updates at iteration \d+ .*overflowed "
                                                 r"float32: the counts of 'S' or the prior"):
        GaP(topics=2, iters=5, alpha=1e30, beta=1e30).fit(S, parts=2, client=client3)


def test_seed_none_starts_every_rank_alike(client3):
    """seed=None draws one start for the whole fit, not one per rank: the fit is the
    one-device fit of the seed the client drew."""
    drawn = []
    fresh = gap._fresh_seed

    def recorded() -> int:
        drawn.append(fresh())
        return drawn[-1]

    S = _corpus()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gap, "_fresh_seed", recorded)
        spread = GaP(3, iters=3, seed=None).fit(S, parts=3, client=client3)
    assert len(drawn) == 1
    one = GaP(3, iters=3, seed=drawn[0]).fit(S)
    np.testing.assert_allclose(spread.L_, one.L_, rtol=1e-9, atol=1e-15)


@pytest.mark.timeout(6 * WAIT)
def test_a_lost_worker_resumes_from_the_checkpoint(client3, caplog):
    """A worker process is killed when iteration 3's record arrives; the job starts again
    from the last checkpoint (every 2 iterations) on the workers that remain, and every
    log-likelihood and both factors equal an undisturbed run's, bit for bit (the tiles'
    shares are added in tile order whoever holds them). Progress sees each iteration once."""
    S = _corpus()
    with dask.config.set({"mgpu.spmd.checkpoint-every": 2}):
        ref = GaP(5, iters=40, seed=2).fit(S, parts=3, client=client3)
        victim, pid = sorted(client3.run(os.getpid).items())[0]
        killed, seen = [], []

        def kill_at_3(rec: dict) -> None:
            seen.append(rec["iteration"])
            if rec["iteration"] == 3 and not killed:
                os.kill(pid, signal.SIGKILL)
                killed.append(victim)

        with caplog.at_level(logging.WARNING, logger="mgpu.distributed.spmd"):
            got = GaP(5, iters=40, seed=2).fit(S, parts=3, client=client3, progress=kill_at_3)
    assert killed
    restarts = [r.getMessage() for r in caplog.records if "starting again" in r.getMessage()]
    assert restarts, "the job was not started again: the kill came after the fit"
    at = int(restarts[0].split("starting again from iteration ")[1].split()[0])
    assert at % 2 == 0 and at >= 2
    assert seen == list(range(1, 41))
    assert [h["iteration"] for h in got.history_] == list(range(1, 41))
    assert [h["loglik_per_token"] for h in got.history_] == \
        [h["loglik_per_token"] for h in ref.history_]
    assert np.array_equal(got.X_, ref.X_) and np.array_equal(got.L_, ref.L_)


@pytest.mark.gpu
@pytest.mark.multi_gpu(2)
def test_spmd_fit_on_two_gpu_workers_equals_one_device():
    """Two GPU workers, NCCL between them: the one-GPU fit's numbers (float64), the tiles
    on the GPUs, Λ's update all-reduced on the devices."""
    import cupyx.scipy.sparse as csp

    from mgpu.distributed import describe_workers

    S = powerlaw_corpus(20000, 3000, 0.01, seed=5).astype(np.float64)
    one = GaP(16, iters=10, seed=1).fit(csp.csr_matrix(S))
    seen: list[dict] = []
    with mgpu.connect(gpus=True, n_workers=2) as client:
        spread = GaP(16, iters=10, seed=1).fit(S, client=client, progress=seen.append)
        gpus = {info["gpu"]["uuid"] for info in describe_workers(client).values()}
    assert len(spread.tiles_) == 2 and len(gpus) == 2
    np.testing.assert_allclose([h["loglik_per_token"] for h in spread.history_],
                               [h["loglik_per_token"] for h in one.history_], rtol=1e-6)
    np.testing.assert_allclose(spread.X_, one.X_.get(), rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(spread.L_, one.L_.get(), rtol=1e-5, atol=1e-12)
    assert isinstance(spread.X_, np.ndarray)
    assert [r["iteration"] for r in seen] == list(range(1, 11))
