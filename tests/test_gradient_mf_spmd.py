"""GradientMF on a cluster of one kind of worker is one SPMD call (every worker loops over the
steps, V's gradient all-reduced): against the one-device fit on CPU LocalClusters of 2 and 3
workers, its progress, its divergence, its checkpoints, and against the per-round path that
clusters mixing GPU and CPU workers keep."""
from __future__ import annotations

import importlib

import dask
import numpy as np
import pytest
import scipy.sparse as sp

from mgpu.distributed import connect
from mgpu.mf import split_ratings
from mgpu.models import GradientMF
from mgpu.distributed import workers_now


@pytest.fixture(scope="module", params=[2, 3], ids=["2-workers", "3-workers"])
def cluster(request):
    with connect(gpus=False, n_workers=request.param) as c:
        yield c


def _ratings(m: int = 90, n: int = 50, seed: int = 0, dtype=np.float64) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    R = sp.random(m, n, density=0.2, format="csr", random_state=rng,
                  data_rvs=lambda s: rng.uniform(1, 5, s))
    R = sp.csr_matrix(R.multiply(np.arange(m)[:, None] % 11 != 0))  # empty users
    R.eliminate_zeros()
    return R.astype(dtype)


def _spmd_calls(monkeypatch) -> list[str]:
    """The names of the SPMD calls made from now on (the real call still runs)."""
    # the module, not the function that mgpu.distributed exports under its name
    core = importlib.import_module("mgpu.distributed.spmd")
    calls: list[str] = []
    real = core.spmd

    def counted(fn, *collections, **kw):
        calls.append(kw.get("name", "spmd"))
        return real(fn, *collections, **kw)

    monkeypatch.setattr(core, "spmd", counted)
    return calls


def test_spmd_fit_equals_the_one_device_fit_in_float64(cluster, monkeypatch):
    train, test = split_ratings(_ratings(), 0.2, 1)
    one = GradientMF(k=4, iters=8, lr=0.05).fit(train, test)
    calls = _spmd_calls(monkeypatch)
    seen: list[dict] = []
    n = len(workers_now(cluster))
    spread = GradientMF(k=4, iters=8, lr=0.05).fit(train, test, parts=2 * n, client=cluster,
                                                   progress=seen.append)
    assert calls == ["gradient-mf"]  # one call for the whole fit, not one per step
    assert len({t["worker"] for t in spread.tiles_}) == n
    for key in ("train_rmse", "test_rmse"):
        np.testing.assert_allclose([h[key] for h in spread.history_],
                                   [h[key] for h in one.history_], rtol=1e-12)
    np.testing.assert_allclose(spread.U_, one.U_, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(spread.V_, one.V_, rtol=1e-10, atol=1e-13)
    assert isinstance(spread.U_, np.ndarray) and spread.U_.dtype == np.float64
    # every step's record reached the client once, in order, as the history has it
    assert [r["iteration"] for r in seen] == list(range(1, 9))
    for got, want in zip(seen, spread.history_):
        assert got["train_rmse"] == want["train_rmse"] and got["test_rmse"] == want["test_rmse"]
    assert all(h["step_s"] > 0 for h in spread.history_)
    elapsed = [h["elapsed_s"] for h in spread.history_]
    assert elapsed == sorted(elapsed)


def test_spmd_fit_in_float32_without_test_ratings(cluster):
    R = _ratings(seed=2, dtype=np.float32)
    one = GradientMF(k=6, iters=6, lr=0.05).fit(R)
    spread = GradientMF(k=6, iters=6, lr=0.05).fit(R, client=cluster)
    assert "test_rmse" not in spread.history_[0] and len(spread.history_) == 6
    np.testing.assert_allclose([h["train_rmse"] for h in spread.history_],
                               [h["train_rmse"] for h in one.history_], rtol=1e-4)
    assert spread.U_.dtype == np.float32 and spread.V_.dtype == np.float32
    np.testing.assert_allclose(spread.U_, one.U_, rtol=0, atol=1e-5)
    np.testing.assert_allclose(spread.V_, one.V_, rtol=0, atol=1e-5)


def test_spmd_fit_of_a_dask_array_equals_the_per_round_path(cluster, monkeypatch):
    """The per-round path (kept for clusters of GPU and CPU workers) and the SPMD call both
    sum V's gradient and the squared errors in tile order: the same numbers to the bit, on
    the dask array's own tiles."""
    import mgpu
    import mgpu.models.gradient_mf as gm

    train, test = split_ratings(_ratings(seed=3), 0.2, 0)
    Rd = mgpu.from_scipy(train, 4, client=cluster)
    calls = _spmd_calls(monkeypatch)
    spmd = GradientMF(k=4, iters=5, lr=0.05).fit(Rd, test)
    monkeypatch.setattr(gm, "_one_kind", lambda tiles: False)  # as on a mixed cluster
    rounds = GradientMF(k=4, iters=5, lr=0.05).fit(Rd, test)
    assert calls == ["gradient-mf"]
    for key in ("train_rmse", "test_rmse"):
        assert [h[key] for h in spmd.history_] == [h[key] for h in rounds.history_]
    assert np.array_equal(spmd.U_, rounds.U_) and np.array_equal(spmd.V_, rounds.V_)
    assert spmd.tiles_ == rounds.tiles_


def test_spmd_divergence_raises_the_one_device_error_and_every_rank_stops(cluster):
    train, test = split_ratings(_ratings(seed=4), 0.2, 0)
    with pytest.raises(FloatingPointError) as one:
        GradientMF(k=4, lr=100, iters=10).fit(train, test)
    seen: list[dict] = []
    with pytest.raises(FloatingPointError) as spread:
        GradientMF(k=4, lr=100, iters=10).fit(train, test, parts=3, client=cluster,
                                              progress=seen.append)
    assert str(spread.value) == str(one.value)
    assert str(one.value).startswith("GradientMF diverged at step 2: the training RMSE rose")
    assert [r["iteration"] for r in seen] == [1][:len(seen)]
    # no rank was left waiting in a collective: the next fit on the same workers runs
    ok = GradientMF(k=4, iters=2, lr=0.05).fit(train, test, parts=3, client=cluster)
    assert len(ok.history_) == 2


def test_spmd_checkpoints_leave_the_fit_as_it_was(cluster):
    """Checkpoints every 2 steps (mgpu.spmd.checkpoint-every, read on the client) change no
    number of the fit."""
    train, test = split_ratings(_ratings(seed=5), 0.2, 0)
    plain = GradientMF(k=4, iters=5, lr=0.05).fit(train, test, client=cluster)
    with dask.config.set({"mgpu.spmd.checkpoint-every": 2}):
        saved = GradientMF(k=4, iters=5, lr=0.05).fit(train, test, client=cluster)
    for key in ("train_rmse", "test_rmse"):
        assert [h[key] for h in saved.history_] == [h[key] for h in plain.history_]
    assert np.array_equal(saved.U_, plain.U_) and np.array_equal(saved.V_, plain.V_)


def test_bad_input_is_refused_before_any_spmd_call(cluster, monkeypatch):
    calls = _spmd_calls(monkeypatch)
    R = _ratings()
    bad = R.copy()
    bad.data[3] = np.nan
    with pytest.raises(ValueError, match="'R' parameter of GradientMF.fit holds NaN"):
        GradientMF(iters=2).fit(bad, client=cluster)
    test = R.copy()
    test.data[1] = np.inf
    with pytest.raises(ValueError, match="'test' parameter of GradientMF.fit on a cluster "
                                         "holds NaN"):
        GradientMF(iters=2).fit(R, test, client=cluster)
    with pytest.raises(ValueError, match=r"'test' parameter of GradientMF.fit must have R's "
                                         r"shape"):
        GradientMF(iters=2).fit(R, R[:5], client=cluster)
    assert calls == []


@pytest.mark.gpu
@pytest.mark.multi_gpu(2)
def test_spmd_fit_on_two_gpu_workers_equals_one_gpu():
    """Two GPU workers (NCCL between them) against the one-GPU fit: float64 to 1e-6 and
    float32 to 1e-4 relative, per step."""
    import cupyx.scipy.sparse as csp

    from mgpu.synthetic import planted_ratings

    R = planted_ratings(20_000, 3_000, 600_000, seed=1).tocsr()
    train, test = split_ratings(R, 0.1, 0)
    with connect(gpus=True, n_workers=2) as client:
        for dtype, rtol in ((np.float64, 1e-6), (np.float32, 1e-4)):
            tr, te = train.astype(dtype), test.astype(dtype)
            one = GradientMF(k=32, iters=10, lr=0.02).fit(csp.csr_matrix(tr),
                                                          csp.csr_matrix(te))
            seen: list[dict] = []
            spread = GradientMF(k=32, iters=10, lr=0.02).fit(tr, te, client=client,
                                                             progress=seen.append)
            assert {t["worker"] for t in spread.tiles_} == set(workers_now(client))
            assert [r["iteration"] for r in seen] == list(range(1, 11))
            for key in ("train_rmse", "test_rmse"):
                np.testing.assert_allclose([h[key] for h in spread.history_],
                                           [h[key] for h in one.history_], rtol=rtol)
            assert spread.history_[-1]["train_rmse"] < spread.history_[0]["train_rmse"]
            if dtype == np.float64:
                np.testing.assert_allclose(spread.U_, one.U_.get(), rtol=0, atol=1e-8)
                np.testing.assert_allclose(spread.V_, one.V_.get(), rtol=0, atol=1e-8)
            else:
                # float32: NCCL's and one SpMM's orders of summation differ in the last bit,
                # and Adam's step m/sqrt(v) turns that into up to lr for a component whose
                # gradient is about zero; the factors agree as a whole, not entry by entry
                for got, want in ((spread.U_, one.U_.get()), (spread.V_, one.V_.get())):
                    assert np.linalg.norm(got - want) <= 1e-3 * np.linalg.norm(want)
