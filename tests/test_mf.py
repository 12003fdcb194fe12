"""Matrix factorisation: the SGD kernel, bad input, and convergence on MovieLens."""
from __future__ import annotations

import re
import time

import numpy as np
import pytest
import scipy.sparse as sp

import mgpu
from mgpu.io import load_ratings
from mgpu.mf.calibration import Calibration
from mgpu.mf import rmse, sgd_block
from mgpu.distributed import workers_now


# Test RMSE on the MovieLens split that every mode must reach: the issue asks for 0.98 with
# a sequential SGD at about 0.97; with unrated users and items predicted the training mean,
# sequential SGD bottoms out at 0.897 on this split, so the tests ask for 0.91, within 1.5%
# of that floor (the benchmark reports the time to 0.98 as well).
MOVIELENS_TARGET = 0.91


def _split(R: sp.coo_matrix, seed: int = 0) -> tuple[sp.coo_matrix, sp.coo_matrix]:
    """A 90/10 random split of the ratings."""
    perm = np.random.default_rng(seed).permutation(R.nnz)
    te, tr = perm[: R.nnz // 10], perm[R.nnz // 10:]

    def take(sel):
        return sp.coo_matrix((R.data[sel], (R.row[sel], R.col[sel])), shape=R.shape)

    return take(tr), take(te)


def test_sgd_kernel_matches_a_plain_python_pass():
    rng = np.random.default_rng(0)
    u, i = rng.integers(0, 5, 40), rng.integers(0, 4, 40)
    r = rng.uniform(1, 5, 40)
    P0, Q0 = rng.random((5, 3)), rng.random((4, 3))
    P, Q = P0.copy(), Q0.copy()
    order = rng.permutation(40)
    sgd_block(u, i, r, P, Q, 0.05, 0.1, 0.02, order)
    Pr, Qr = P0.copy(), Q0.copy()
    for n in order:
        e = r[n] - Pr[u[n]] @ Qr[i[n]]
        p, q = Pr[u[n]].copy(), Qr[i[n]].copy()
        Pr[u[n]] = p + 0.05 * (e * q - 0.1 * p)
        Qr[i[n]] = q + 0.05 * (e * p - 0.02 * q)
    np.testing.assert_allclose(P, Pr, rtol=1e-12)
    np.testing.assert_allclose(Q, Qr, rtol=1e-12)
    assert rmse(u, i, r, Pr, Qr) == pytest.approx(
        np.sqrt(np.mean((r - np.einsum("nk,nk->n", Pr[u], Qr[i])) ** 2)))
    # without an order the pass visits the ratings as given: the same as that order applied
    P2, Q2 = P0.copy(), Q0.copy()
    sgd_block(u[order], i[order], r[order], P2, Q2, 0.05, 0.1, 0.02)
    np.testing.assert_array_equal(P2, P)
    np.testing.assert_array_equal(Q2, Q)


@pytest.mark.parametrize("n_users, n_items", [(300, 40), (40, 300)])
def test_blocks_keep_their_ratings_in_libmf_order(n_users, n_items):
    """Every block's ratings, as a fit hands them to the hosts, sorted as LIBMF sorts its
    blocks': by user then item with more users than items, else by item then user; blocks
    by ascending id; every rating once, whatever order they came in."""
    from mgpu.mf.division import uniform
    from mgpu.mf.placement import by_block
    from mgpu.mf.sgd import libmf_order

    rng = np.random.default_rng(1)
    pairs = rng.choice(n_users * n_items, 3000, replace=False)  # unsorted, no duplicates
    u, i = pairs // n_items, pairs % n_items
    div = uniform(u, i, n_users, n_items, 3, rng)
    bid = div.block_of(u, i)
    got = by_block(u, i, bid, n_users, n_items)
    assert sorted(got.tolist()) == list(range(u.size))
    assert (np.diff(bid[got]) >= 0).all()
    for b in np.unique(bid):
        sel = got[bid[got] == b]
        want = sel[libmf_order(u[sel], i[sel], by_user=n_users > n_items)]
        np.testing.assert_array_equal(sel, want)
    major = u if n_users > n_items else i
    assert (np.diff(major[got[bid[got] == bid[got][0]]]) >= 0).all()
    # ratings already in that order (a CSR matrix's, by user) keep it within their blocks
    by_row = np.lexsort((i, u))
    if n_users > n_items:
        np.testing.assert_array_equal(
            by_block(u[by_row], i[by_row], bid[by_row], n_users, n_items),
            np.argsort(bid[by_row], kind="stable"))


@pytest.mark.parametrize("kwargs, match", [
    ({"k": 0}, "'k' parameter of MatrixFactorization must be an int >= 1"),
    ({"lr": 0.0}, "'lr' parameter"),
    ({"reg": -1.0}, "'reg' parameter"),
    ({"mode": "hsgd+"}, r"'mode' parameter of MatrixFactorization must be a str among "
                        r"\{'cpu', 'gpu', 'hsgd', 'hsgd\*', 'hsgd-linear', 'hsgd-static', "
                        r"'sequential'\}. Got 'hsgd\+' instead."),
])
def test_bad_parameters(kwargs, match):
    R = sp.coo_matrix(np.array([[1.0, 2.0], [3.0, 0.0]]))
    with pytest.raises(ValueError, match=match):
        mgpu.MatrixFactorization(**kwargs).fit(R)


def test_the_modes_table_gives_the_checks_and_the_help():
    """One spec per mode; the groups the command line filters by, the --modes error and its
    help come from it."""
    from mgpu.mf import MODES, modes_help, parse_modes
    from mgpu.mf.modes import COST_MODES, GPU_MODES, MIXED_MODES

    assert list(MODES) == ["sequential", "cpu", "gpu", "hsgd", "hsgd-linear", "hsgd-static",
                           "hsgd*"]
    assert GPU_MODES == ("gpu", "hsgd", "hsgd-linear", "hsgd-static", "hsgd*")
    assert MIXED_MODES == ("hsgd", "hsgd-linear", "hsgd-static", "hsgd*")
    assert COST_MODES == ("hsgd-linear", "hsgd-static", "hsgd*")
    assert {m.cost for m in MODES.values()} == {"none", "hsgd*", "linear"}
    assert [m.name for m in MODES.values() if m.cluster and not m.stealing] == ["hsgd-static"]
    assert [m.name for m in MODES.values() if m.replan] == ["hsgd-static", "hsgd*"]
    assert [m.name for m in MODES.values() if not m.cluster] == ["sequential"]
    assert parse_modes(" sequential, hsgd* ,") == ["sequential", "hsgd*"]
    for bad in ("cpu,hsgd+", " , "):
        with pytest.raises(ValueError, match=r"^modes must be among sequential, cpu, gpu, hsgd, "
                           r"hsgd-linear, hsgd-static, hsgd\*; got '"):
            parse_modes(bad)
    text = modes_help()
    assert [line.split(":")[0] for line in text.split("; ")] == list(MODES)
    assert all(m.help and "\n" not in m.help for m in MODES.values())


def test_calibration_of_another_type_is_refused():
    R = sp.coo_matrix(np.array([[1.0, 2.0], [3.0, 0.0]]))
    with pytest.raises(TypeError, match="'calibration' parameter of MatrixFactorization must "
                       "be a mgpu.mf.calibration.Calibration or None. Got dict instead"):
        mgpu.MatrixFactorization(calibration={"cpu": 1.0}).fit(R)


def test_bad_ratings_and_divergence(tmp_path):
    dup = sp.coo_matrix((np.array([1.0, 2.0, 3.0]), (np.array([0, 0, 1]), np.array([1, 1, 0]))),
                        shape=(2, 2))
    with pytest.raises(ValueError, match=r"more than once \(1 pairs; first: user 0, item 1\)"):
        mgpu.MatrixFactorization(k=2).fit(dup)
    nan = sp.coo_matrix(np.array([[1.0, np.nan], [3.0, 0.0]]))
    with pytest.raises(ValueError, match="NaN or infinite rating"):
        mgpu.MatrixFactorization(k=2).fit(nan)
    R = sp.random(30, 20, density=0.3, format="coo", random_state=0) * 5
    with pytest.raises(ValueError, match="'test' parameter .* holds no ratings"):
        mgpu.MatrixFactorization(k=2).fit(R, test=sp.coo_matrix(R.shape))
    with pytest.raises(ValueError, match="must have R's shape"):
        mgpu.MatrixFactorization(k=2).fit(R, test=sp.coo_matrix((3, 3)))
    with pytest.raises(FloatingPointError, match="diverged at epoch"):
        mgpu.MatrixFactorization(k=4, lr=50.0, epochs=10).fit(R * 100)
    with pytest.raises(ValueError, match="not fitted yet"):
        mgpu.MatrixFactorization().predict([0], [0])
    mf = mgpu.MatrixFactorization(k=2, epochs=2, checkpoint_dir=str(tmp_path)).fit(R)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mf-epoch-1.npz", "mf-epoch-2.npz"]
    with np.load(tmp_path / "mf-epoch-2.npz") as z:
        np.testing.assert_array_equal(z["P"], mf.P_)
    with pytest.raises(ValueError, match=r"'items' parameter of predict must be in \[0, 20\)"):
        mf.predict([0], [20])


def test_a_finite_but_exploding_rmse_is_divergence():
    """At lr=0.24 one epoch throws the train RMSE to about 5e136, finite: the fit used to end
    there as if it had trained; past ten times the starting factors' RMSE it stops, naming
    the epoch and the learning rate."""
    rng = np.random.default_rng(0)
    R = sp.random(60, 40, density=0.3, format="csr", random_state=0,
                  data_rvs=lambda n: rng.integers(1, 6, n).astype(float))
    with pytest.raises(FloatingPointError, match=r"SGD diverged at epoch 1: the train RMSE rose "
                                                 r"to [\d.e+]+, past 10 times that of the "
                                                 r"starting factors .*\(lr=0\.24\)"):
        mgpu.MatrixFactorization(k=4, lr=0.24, epochs=1).fit(R)
    mf = mgpu.MatrixFactorization(k=4, lr=0.05, epochs=5).fit(R)  # a sound rate: no refusal
    assert mf.history_[-1]["train_rmse"] < mf.history_[0]["train_rmse"]


def test_complex_ratings_are_refused_not_cut_to_their_real_part():
    R = sp.csr_matrix(np.array([[1 + 1j, 2, 0], [0, 3, 1], [2, 0, 1.0]]))
    with pytest.raises(TypeError, match=r"'R' parameter of MatrixFactorization.fit must hold "
                                        r"real ratings .* Got dtype complex128"):
        mgpu.MatrixFactorization(k=2, epochs=1).fit(R)
    real = sp.csr_matrix(R.real)
    with pytest.raises(TypeError, match="'test' parameter of MatrixFactorization.fit"):
        mgpu.MatrixFactorization(k=2, epochs=1).fit(real, test=R)


def test_the_first_epoch_is_timed_without_compiling_the_kernel(monkeypatch):
    """The sequential fit's first epoch used to include numba's compilation of the pass
    (about 0.45 s a run), counted as training time by ``run mf`` and ``bench mf``. A pass
    whose first call takes a second, as a compilation would, must land in ``setup_s_``: the
    kernel is called first on no ratings, before the first epoch's clock starts."""
    import mgpu.mf.sgd as sgd

    real, calls = sgd._sgd, []

    def slow_first_call(users, *args):
        if not calls:
            time.sleep(1.0)  # what a compilation costs, and more
        calls.append(len(users))
        return real(users, *args)

    monkeypatch.setattr(sgd, "_sgd", slow_first_call)
    R = sp.random(40, 30, density=0.3, format="csr", random_state=1) * 4 + \
        sp.random(40, 30, density=0.3, format="csr", random_state=1).astype(bool)
    mf = mgpu.MatrixFactorization(k=4, lr=0.02, epochs=2).fit(R)
    assert calls[0] == 0 and calls[1:] == [R.nnz, R.nnz]  # the warm-up, then the epochs
    assert mf.setup_s_ >= 1.0
    assert mf.history_[0]["seconds"] < 1.0 and mf.history_[1]["seconds"] < 2.0


def _run_python(code: str, env: dict[str, str]) -> str:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    full = {**os.environ, "PYTHONPATH": root, **env}
    out = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


_ONE_PASS = """
import numpy as np
import mgpu.mf.sgd as sgd
P, Q = np.full((3, 2), 0.5), np.full((2, 2), 0.5)
sgd.sgd_block(np.array([0, 2]), np.array([1, 0]), np.array([1.5, 3.0]), P, Q, 0.1, 0.0, 0.0,
              np.array([1, 0]))
print(sum(sgd._sgd.stats.cache_hits.values()), sum(sgd._sgd.stats.cache_misses.values()),
      type(sgd._sgd._cache).__name__, P.round(6).tolist())
"""


def test_the_cpu_pass_is_compiled_once_per_machine_not_per_process(tmp_path):
    """cache=True: a second process loads the pass from numba's cache (here NUMBA_CACHE_DIR,
    as where the package is read-only numba uses the user's cache folder) instead of
    compiling it again, and computes the same."""
    env = {"NUMBA_CACHE_DIR": str(tmp_path)}
    first = _run_python(_ONE_PASS, env).split(" ", 3)
    second = _run_python(_ONE_PASS, env).split(" ", 3)
    assert first[:2] == ["0", "1"] and second[:2] == ["1", "0"], (first, second)
    assert first[3] == second[3]
    assert any(tmp_path.rglob("*.nbi")), "numba wrote no index to NUMBA_CACHE_DIR"


def test_a_kernel_numba_cannot_cache_is_compiled_in_memory(tmp_path):
    """Where numba can write its cache nowhere (no locator), the package still imports and
    runs: the kernels are compiled in each process, as before cache=True."""
    no_cache = "from numba.core.caching import CacheImpl\nCacheImpl._locator_classes = []\n"
    got = _run_python(no_cache + _ONE_PASS, {}).split(" ", 3)
    assert got[2] == "NullCache" and got[0] == "0", got
    assert got[3].strip() == "[[0.55, 0.55], [0.5, 0.5], [0.625, 0.625]]"


def test_unrated_users_and_items_are_predicted_the_training_mean():
    # user 2 and item 3 have no training rating: their factors are the random start
    R = sp.coo_matrix((np.array([1.0, 2.0, 4.0, 5.0]), (np.array([0, 0, 1, 1]),
                                                       np.array([0, 1, 0, 2]))), shape=(3, 4))
    test = sp.coo_matrix((np.array([3.0, 1.0, 4.0]), (np.array([2, 0, 1]),
                                                     np.array([0, 3, 1]))), shape=(3, 4))
    mf = mgpu.MatrixFactorization(k=4, lr=0.05, epochs=3).fit(R, test)
    assert mf.mean_ == 3.0
    assert mf.rated_users_.tolist() == [True, True, False]
    assert mf.rated_items_.tolist() == [True, True, True, False]
    pred = mf.predict([2, 0, 1], [0, 3, 1])
    assert pred[0] == 3.0 and pred[1] == 3.0
    assert pred[2] == pytest.approx(mf.P_[1] @ mf.Q_[1]) and pred[2] != 3.0
    want = np.sqrt(np.mean((np.array([3.0, 3.0, mf.P_[1] @ mf.Q_[1]]) - test.data) ** 2))
    assert mf.history_[-1]["test_rmse"] == pytest.approx(want)
    assert mf.history_[-1]["train_rmse"] == pytest.approx(
        np.sqrt(np.mean((mf.predict(R.row, R.col) - R.data) ** 2)))


def test_seed_none_draws_one_int_seed_that_repeats_the_fit():
    """seed=None is resolved once in fit (the GPU hosts add block ids to it): the drawn
    seed is kept in seed_, and a model given it repeats the fit."""
    rng = np.random.default_rng(1)
    R = sp.random(30, 20, density=0.3, format="coo", random_state=rng,
                  data_rvs=lambda n: rng.uniform(1, 5, n))
    first = mgpu.MatrixFactorization(k=4, lr=0.05, epochs=2, seed=None).fit(R)
    assert isinstance(first.seed_, int) and first.seed_ >= 0
    again = mgpu.MatrixFactorization(k=4, lr=0.05, epochs=2, seed=first.seed_).fit(R)
    np.testing.assert_array_equal(again.P_, first.P_)
    assert mgpu.MatrixFactorization(k=4, epochs=1, seed=7).fit(R).seed_ == 7


def test_sequential_reaches_the_movielens_target(data_dir):
    R = load_ratings(data_dir / "ratings" / "ml-latest-small-2016_ratings.csv.gz").matrix
    train, test = _split(R.tocoo())
    mf = mgpu.MatrixFactorization(k=128, lr=0.005, reg=0.05, epochs=80,
                                  target_rmse=MOVIELENS_TARGET)
    seen = []
    mf.fit(train, test, callback=seen.append)
    assert mf.history_[-1]["test_rmse"] <= MOVIELENS_TARGET and seen == mf.history_
    assert len(mf.history_) < 80  # stopped at the target
    t = test.tocoo()
    pred = mf.predict(t.row, t.col)
    assert np.sqrt(np.mean((pred - t.data) ** 2)) == pytest.approx(mf.history_[-1]["test_rmse"])
    # 339 of the 10000 test ratings name an item without a training rating
    cold = ~mf.rated_items_[t.col]
    assert cold.sum() == 339 and (pred[cold] == mf.mean_).all()


def test_blocked_cpu_mode_reaches_the_movielens_target(client, data_dir):
    R = load_ratings(data_dir / "ratings" / "ml-latest-small-2016_ratings.csv.gz").matrix
    train, test = _split(R.tocoo())
    # the thesis's MovieLens parameters
    mf = mgpu.MatrixFactorization(k=128, lr=0.005, reg=0.05, epochs=80,
                                  target_rmse=MOVIELENS_TARGET, mode="cpu")
    mf.fit(train, test)
    h = mf.history_
    assert h[-1]["test_rmse"] <= MOVIELENS_TARGET and len(h) < 80
    starts = [e for e in mf.schedule_events_ if e.kind in ("assign", "steal")]
    n_slots = sum(w["nthreads"] for w in workers_now(client).values())
    g = n_slots + 1
    assert len(starts) == len(h) * g * g  # every block once per epoch
    counts: dict[int, int] = {}
    for e in starts:
        counts[e.block] = counts.get(e.block, 0) + 1
    assert set(counts.values()) == {len(h)}  # equal update counts per block


@pytest.mark.parametrize("victim", ["driving", "other"])
def test_a_lost_worker_stops_the_fit_with_a_message_not_a_hang(tmp_path, victim):
    """A block host's worker killed between two epochs of a fit: the next epoch stops at
    once, naming the epoch and where the last finished epoch's factors are, whether the
    worker lost is the one whose host runs the block scheduler (the client's call to it
    fails) or another (that host sees the worker leave the cluster and stops its calls)."""
    import os
    import signal

    from mgpu.distributed import connect
    from mgpu.mf.placement import driving_worker, slots_for
    from mgpu.synthetic import planted_ratings

    R = planted_ratings(5000, 2000, 400_000, noise=0.5, seed=0)
    with connect(gpus=False, n_workers=2) as c:
        driving = driving_worker(slots_for(c, "cpu"))
        pids = c.run(os.getpid)
        target = pids[driving] if victim == "driving" else next(
            p for w, p in pids.items() if w != driving)
        mf = mgpu.MatrixFactorization(16, lr=0.01, epochs=10_000, mode="cpu", seed=0,
                                      checkpoint_dir=str(tmp_path))

        def kill(entry):
            if entry["epoch"] == 3:
                os.kill(target, signal.SIGKILL)

        how = "could not be reached" if victim == "driving" else "left the cluster"
        with pytest.raises(RuntimeError, match=r"the cpu mode's blocks was lost in epoch 4: "
                           rf".*{how}.*; P_ and Q_ hold epoch 3's factors, also in "):
            mf.fit(R, callback=kill)
    assert len(mf.history_) == 3 and (tmp_path / "mf-epoch-3.npz").exists()


def test_a_fit_resumed_from_its_last_checkpoint_reaches_the_undisturbed_band(tmp_path):
    """Worker loss for matrix factorisation: the fit stops naming its last checkpoint, and a
    fit resumed from it on a fresh cluster goes on at the next epoch and ends in the RMSE
    band of a run that lost nothing."""
    import os
    import signal

    from mgpu.distributed import connect
    from mgpu.mf.placement import driving_worker, slots_for
    from mgpu.synthetic import planted_ratings

    train, test = _split(planted_ratings(4000, 1500, 300_000, noise=0.5, seed=1).tocoo())
    opts = dict(k=16, lr=0.01, epochs=12, mode="cpu", seed=0)
    with connect(gpus=False, n_workers=2) as c:
        whole = mgpu.MatrixFactorization(**opts).fit(train, test)
        driving = driving_worker(slots_for(c, "cpu"))
        other = next(p for w, p in c.run(os.getpid).items() if w != driving)
        lost = mgpu.MatrixFactorization(**opts, checkpoint_dir=str(tmp_path))

        def kill(entry):
            if entry["epoch"] == 4:
                os.kill(other, signal.SIGKILL)

        last = tmp_path / "mf-epoch-4.npz"
        with pytest.raises(RuntimeError, match=r"lost in epoch 5: .*fit\(\.\.\., resume="
                           + re.escape(repr(str(last))) + r"\)"):
            lost.fit(train, test, callback=kill)
    with connect(gpus=False, n_workers=2):
        again = mgpu.MatrixFactorization(**opts, checkpoint_dir=str(tmp_path)).fit(
            train, test, resume=last)
    h, w = again.history_, whole.history_
    assert [e["epoch"] for e in h] == list(range(5, 13))
    # it went on from epoch 4's factors (epoch 1 of a fresh start is far above)
    assert abs(h[0]["test_rmse"] - w[4]["test_rmse"]) < 0.02 < w[0]["test_rmse"] - w[4][
        "test_rmse"]
    assert abs(h[-1]["test_rmse"] - w[-1]["test_rmse"]) <= 0.01 * w[-1]["test_rmse"]
    assert (tmp_path / "mf-epoch-12.npz").exists()


def test_a_checkpoint_that_does_not_fit_is_refused(tmp_path):
    R = sp.random(30, 20, density=0.3, format="coo", random_state=0)
    mf = mgpu.MatrixFactorization(4, epochs=3, checkpoint_dir=str(tmp_path)).fit(R)
    assert len(mf.history_) == 3
    done = tmp_path / "mf-epoch-3.npz"
    with pytest.raises(ValueError, match="of epoch 3; with epochs=3 no epoch is left"):
        mgpu.MatrixFactorization(4, epochs=3).fit(R, resume=done)
    with pytest.raises(ValueError, match=r"holds P \(30, 4\) and Q \(20, 4\); this fit needs "
                       r"P \(30, 8\)"):
        mgpu.MatrixFactorization(8, epochs=5).fit(R, resume=done)
    np.savez(tmp_path / "other.npz", P=np.zeros((30, 4)))
    with pytest.raises(ValueError, match="must be a checkpoint of a fit"):
        mgpu.MatrixFactorization(4, epochs=5).fit(R, resume=tmp_path / "other.npz")
    resumed = mgpu.MatrixFactorization(4, epochs=5).fit(R, resume=tmp_path / "mf-epoch-2.npz")
    assert [e["epoch"] for e in resumed.history_] == [3, 4, 5]


@pytest.mark.parametrize("mode", ["gpu", "hsgd"])
def test_gpu_modes_refuse_a_cluster_without_gpus(client, mode):
    R = sp.coo_matrix(np.array([[1.0, 2.0], [3.0, 0.0]]))
    with pytest.raises(ValueError, match=f"mode='{mode}' needs GPU workers; the cluster has none"):
        mgpu.MatrixFactorization(k=2, mode=mode, epochs=1).fit(R)


def _independent_ratings(n: int, seed: int):
    """n ratings touching n distinct users and n distinct items: no two updates of one pass
    share a row of P or Q, so the GPU's concurrent updates must equal the sequential pass."""
    rng = np.random.default_rng(seed)
    return (rng.permutation(n).astype(np.int32), rng.permutation(n).astype(np.int32),
            rng.uniform(1, 5, n))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, rtol", [(np.float32, 2e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("k", [7, 32, 128, 200, 256])
def test_gpu_sgd_kernel_equals_the_cpu_pass_without_conflicts(dtype, rtol, k):
    import cupy

    u, i, r = _independent_ratings(5000, k)
    rng = np.random.default_rng(1)
    P0, Q0 = rng.random((5000, k)).astype(dtype), rng.random((5000, k)).astype(dtype)
    P, Q = P0.astype(np.float64), Q0.astype(np.float64)
    sgd_block(u, i, r, P, Q, 0.01, 0.05, 0.02)
    Pg, Qg = cupy.asarray(P0), cupy.asarray(Q0)
    order = cupy.asarray(np.random.default_rng(2).permutation(5000))
    sgd_block(cupy.asarray(u), cupy.asarray(i), cupy.asarray(r.astype(dtype)), Pg, Qg, 0.01,
              0.05, 0.02, order)
    np.testing.assert_allclose(Pg.get(), P, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(Qg.get(), Q, rtol=rtol, atol=rtol)


@pytest.mark.gpu
def test_gpu_sgd_kernel_refuses_what_it_cannot_take():
    import cupy

    u, i, r = (cupy.asarray(a) for a in _independent_ratings(10, 0))
    P, Q = cupy.ones((10, 300)), cupy.ones((10, 300))
    with pytest.raises(ValueError, match=r"1 <= k <= 256. Got P float64 \(10, 300\)"):
        sgd_block(u, i, r, P, Q, 0.01, 0.0, 0.0)
    with pytest.raises(ValueError, match="int32 ids"):
        sgd_block(u.astype(cupy.int64), i, r, P[:, :8].copy(), Q[:, :8].copy(), 0.01, 0.0, 0.0)


@pytest.mark.gpu
def test_gpu_host_keeps_segments_on_the_device_and_matches_the_cpu():
    """Two blocks of one column in one GPU host call, on ratings without shared rows (so the
    lock-free kernel must equal the sequential pass), one staged there and one fetched from a
    CPU host with the item segment: the same segments as numba's passes; the next call
    starts from what the first left on the device."""
    from mgpu.distributed import connect
    from mgpu.mf.hosts import BlockHost, call

    b1, b2 = _independent_ratings(3000, 0), _independent_ratings(3000, 1)
    rng = np.random.default_rng(2)
    P1, P2, Q = rng.random((3000, 64)), rng.random((3000, 64)), rng.random((3000, 64))
    want = [x.copy() for x in (P1, P2, Q)]
    for (users, items, ratings), P in zip((b1, b2), want[:2]):
        sgd_block(users, items, ratings, P, want[2], 0.01, 0.05, 0.05)
    with connect() as client:
        w = next(iter(workers_now(client)))
        gpu, src = (client.submit(BlockHost, kind, 1, {"conflicts": None}, workers=[w],
                                  actor=True, pure=False).result() for kind in ("gpu", "cpu"))
        call(client, gpu, "set_peers", {"src": src}).result()
        call(client, src, "put", {2: b2}, {("q", 0): Q}).result()
        call(client, gpu, "put", {1: b1}, {("p", 0): P1, ("p", 1): P2}, [1]).result()
        call(client, gpu, "run", [1, 2], [(("p", 0), 0, None, False), (("p", 1), 0, None, False)],
             (("q", 0), 0, "src", False), [(("p", 0), 1), (("p", 1), 1)], (("q", 0), 1), 0.01,
             0.05, 3, {2: "src"}).result(timeout=60)
        got = call(client, gpu, "collect", {("p", 0): 1, ("p", 1): 1, ("q", 0): 1}).result()
        for key, ref in zip((("p", 0), ("p", 1), ("q", 0)), want):
            np.testing.assert_allclose(got[key], ref, rtol=1e-12, atol=1e-12)
        assert call(client, src, "held").result() == {}  # the item segment moved
        call(client, gpu, "run", [1], [(("p", 0), 1, None, False)], (("q", 0), 1, None, False),
             [(("p", 0), 2)], (("q", 0), 2), 0.01, 0.05, 4).result(timeout=60)
        sgd_block(*b1, want[0], want[2], 0.01, 0.05, 0.05)
        again = call(client, gpu, "collect", {("p", 0): 2, ("q", 0): 2}).result()
        np.testing.assert_allclose(again[("p", 0)], want[0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(again[("q", 0)], want[2], rtol=1e-12, atol=1e-12)
        # the device's own timings of each call's parts fit in the call's run
        times = call(client, gpu, "call_times").result()
        assert len(times) == 2
        for t in times:
            assert min(t["h2d"], t["kernel"], t["copy"]) > 0
            assert t["h2d"] + t["kernel"] + t["copy"] <= t["run"]


@pytest.mark.gpu
def test_gpu_mode_reaches_the_movielens_target(data_dir):
    from mgpu.distributed import connect

    R = load_ratings(data_dir / "ratings" / "ml-latest-small-2016_ratings.csv.gz").matrix
    train, test = _split(R.tocoo())
    with connect(gpus=True, n_workers=1):
        mf = mgpu.MatrixFactorization(k=128, lr=0.005, reg=0.05, epochs=80,
                                      target_rmse=MOVIELENS_TARGET, mode="gpu")
        mf.fit(train, test)
    assert mf.history_[-1]["test_rmse"] <= MOVIELENS_TARGET and len(mf.history_) < 80
    starts = [e for e in mf.schedule_events_ if e.kind in ("assign", "steal")]
    assert starts and all(e.slot.endswith("#gpu") for e in starts)


@pytest.mark.gpu
def test_hsgd_runs_blocks_on_gpu_and_cpu_workers_of_one_cluster(data_dir):
    """A mixed cluster (a GPU worker from dask-cuda and a CPU worker): GPU slots run on the
    GPU worker, CPU slots on the CPU worker, and the model still reaches the target."""
    from mgpu.distributed import connect, describe_workers

    R = load_ratings(data_dir / "ratings" / "ml-latest-small-2016_ratings.csv.gz").matrix
    train, test = _split(R.tocoo())
    with connect(gpus=True, n_workers=1, cpu_threads=2) as client:
        infos = describe_workers(client)
        gpu_workers = {a for a, i in infos.items() if i["gpu"]}
        assert len(gpu_workers) == 1 and len(infos) == 2
        assert {a: i["nthreads"] for a, i in infos.items() if not i["gpu"]}.popitem()[1] == 2
        mf = mgpu.MatrixFactorization(k=128, lr=0.005, reg=0.05, epochs=80,
                                      target_rmse=MOVIELENS_TARGET, mode="hsgd")
        mf.fit(train, test)
    assert mf.history_[-1]["test_rmse"] <= MOVIELENS_TARGET
    starts = [e for e in mf.schedule_events_ if e.kind in ("assign", "steal")]
    on_gpu = [e for e in starts if e.slot.endswith("#gpu")]
    on_cpu = [e for e in starts if not e.slot.endswith("#gpu")]
    assert on_gpu and on_cpu
    assert {e.slot.split("#")[0] for e in on_gpu} == gpu_workers
    assert not {e.slot.split("#")[0] for e in on_cpu} & gpu_workers


@pytest.mark.gpu
@pytest.mark.multi_gpu(2)
def test_hsgd_blocks_land_on_two_gpu_workers_and_a_cpu_worker_by_the_schedulers_events(
        data_dir):
    """A mixed cluster of two dask-cuda GPU workers (two GPUs, told apart by UUID) and one CPU
    worker: the ``mgpu-assign`` events that the Dask scheduler received put GPU slots' blocks
    on both GPU workers and CPU slots' blocks on the CPU worker only, every block of every
    epoch once, and the model reaches the target."""
    from mgpu.distributed import connect, describe_workers

    R = load_ratings(data_dir / "ratings" / "ml-latest-small-2016_ratings.csv.gz").matrix
    train, test = _split(R.tocoo())
    with connect(gpus=True, n_workers=2, cpu_threads=2) as client:
        infos = describe_workers(client)
        gpu_workers = {a for a, i in infos.items() if i["gpu"]}
        cpu_workers = set(infos) - gpu_workers
        assert len(gpu_workers) == 2 and len(cpu_workers) == 1, infos
        assert len({infos[a]["gpu"]["uuid"] for a in gpu_workers}) == 2, infos
        mf = mgpu.MatrixFactorization(k=128, lr=0.005, reg=0.05, epochs=80,
                                      target_rmse=MOVIELENS_TARGET, mode="hsgd")
        mf.fit(train, test)
        starts = [e for e in mf.schedule_events_ if e.kind in ("assign", "steal")]
        deadline = time.monotonic() + 30  # the last epoch's message may still be on its way
        while True:
            logged = [ev for topic in ("mgpu-assign", "mgpu-steal")
                      for _, msg in client.get_events(topic) for ev in msg["events"]]
            if len(logged) >= len(starts) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert mf.history_[-1]["test_rmse"] <= MOVIELENS_TARGET
    assert mf.division_["gpu_slots"] == 2
    assert len(logged) == len(starts) > 0
    on_gpu = {ev["slot"].split("#")[0] for ev in logged if ev["slot"].endswith("#gpu")}
    on_cpu = {ev["slot"].split("#")[0] for ev in logged if not ev["slot"].endswith("#gpu")}
    assert on_gpu == gpu_workers and on_cpu == cpu_workers, (on_gpu, on_cpu, infos)
    per_epoch: dict[int, list[int]] = {}
    for e in mf.schedule_events_:
        if e.kind == "finish":
            per_epoch.setdefault(e.epoch, []).append(e.block)
    assert len(per_epoch) == len(mf.history_)
    for done in per_epoch.values():
        assert len(done) == len(set(done)) == mf.division_["blocks"]


@pytest.mark.gpu
def test_hsgd_star_runs_the_gpu_mode_division_when_the_cpus_would_only_slow_it(data_dir):
    """A calibration whose CPU thread is 10,000× slower than the GPU: the plan gives the CPU
    slots nothing, and hsgd* runs the gpu mode's division on the GPU alone (as many tasks an
    epoch, so never slower for being hsgd*)."""
    from mgpu.distributed import connect

    n = [float(2 ** e) for e in range(10, 21)]
    crawl = Calibration("made-up", n, [x / 1e3 for x in n], [x / 1e8 for x in n],
                        [x / 1e8 for x in n], 1e-4, 1e-4, "test")
    R = load_ratings(data_dir / "ratings" / "ml-latest-small-2016_ratings.csv.gz").matrix
    train, test = _split(R.tocoo())
    runs = {}
    with connect(gpus=True, n_workers=1, cpu_threads=3):
        for mode in ("hsgd*", "gpu"):
            mf = mgpu.MatrixFactorization(k=128, lr=0.005, reg=0.05, epochs=80,
                                          target_rmse=MOVIELENS_TARGET, mode=mode,
                                          calibration=crawl)
            mf.fit(train, test)
            runs[mode] = mf
    star, gpu = runs["hsgd*"], runs["gpu"]
    assert star.history_[-1]["test_rmse"] <= MOVIELENS_TARGET
    assert (star.division_["cpu_slots"], star.division_["alpha"]) == (0, 1.0)
    assert (star.division_["rows"], star.division_["cols"]) == (gpu.division_["rows"],
                                                                gpu.division_["cols"])
    starts = [e for e in star.schedule_events_ if e.kind in ("assign", "steal")]
    assert starts and all(e.slot.endswith("#gpu") for e in starts)
    tasks = {m: len({(e.epoch, e.task) for e in r.schedule_events_ if e.kind == "assign"})
             / len(r.history_) for m, r in runs.items()}
    assert tasks["hsgd*"] == tasks["gpu"]


def _three_to_one() -> Calibration:
    """A calibration whose GPU runs 3× as fast as a CPU thread, 0.1 ms per task."""
    n = [float(2 ** e) for e in range(10, 21)]
    return Calibration("made-up", n, [x / 1e6 for x in n], [x / 6e6 for x in n],
                       [x / 6e6 for x in n], 1e-4, 1e-4, "test")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["hsgd*", "hsgd-static", "hsgd-linear"])
def test_cost_model_modes_on_a_mixed_cluster(data_dir, mode):
    """With a GPU 3× a CPU thread, HSGD*'s modes use every CPU slot, give the GPU half the
    ratings (1 GPU against 3 threads) in the non-uniform division, start every slot on its own
    rows, and reach the target."""
    from mgpu.distributed import connect

    import dask.config

    R = load_ratings(data_dir / "ratings" / "ml-latest-small-2016_ratings.csv.gz").matrix
    train, test = _split(R.tocoo())
    with connect(gpus=True, n_workers=1, cpu_threads=3), \
            dask.config.set({"mgpu.mf.replan": False}):  # the division the model gives
        mf = mgpu.MatrixFactorization(k=128, lr=0.005, reg=0.05, epochs=80,
                                      target_rmse=MOVIELENS_TARGET, mode=mode,
                                      calibration=_three_to_one())
        mf.fit(train, test)
    assert mf.history_[-1]["test_rmse"] <= MOVIELENS_TARGET
    d = mf.division_
    assert (d["gpu_slots"], d["cpu_slots"]) == (1, 3)
    assert (d["rows"], d["cols"]) == (4 + 4, 3 + 2 + 1)  # ⌈4/1⌉ GPU sub-rows + 4 CPU rows
    assert 0.4 < d["alpha"] < 0.6
    h = mf.history_
    assert all(e["gpu_ratings"] + e["cpu_ratings"] == train.nnz for e in h)
    assert all(e["gpu_predicted_s"] > 0 and e["cpu_predicted_s"] > 0 for e in h)
    # a slot's own queue holds its own rows: the GPU's are the first four row strata
    # (block id // 6 < 4), so every block taken from an own queue ran on its own kind of slot
    own = [e for e in mf.schedule_events_ if e.kind == "assign"]
    assert own and all((e.block // 6 < 4) == e.slot.endswith("#gpu") for e in own)
    if mode == "hsgd-static":
        assert all(e.kind == "assign" for e in mf.schedule_events_ if e.kind != "finish")


@pytest.mark.gpu
def test_hsgd_star_calibrates_on_the_cluster_and_plans_from_it(data_dir, tmp_path):
    """Without a calibration, fit measures one on the cluster, caches it, and divides the
    ratings as the plan from it says (the CPU slots worth using, α)."""
    import dask.config

    from mgpu.distributed import connect
    from mgpu.mf.calibration import cached
    from mgpu.mf.planning import plan

    R = load_ratings(data_dir / "ratings" / "ml-latest-small-2016_ratings.csv.gz").matrix
    train, test = _split(R.tocoo())
    with dask.config.set({"mgpu.mf.calibration-cache": str(tmp_path / "cal.json"),
                          "mgpu.mf.replan": False}):  # the division the plan gives
        with connect(gpus=True, n_workers=1, cpu_threads=3):
            mf = mgpu.MatrixFactorization(k=128, lr=0.005, reg=0.05, epochs=80,
                                          target_rmse=MOVIELENS_TARGET, mode="hsgd*")
            mf.fit(train, test)
        cal = mf.calibration_
        assert cached(cal.key) == cal
    assert "gpu=NVIDIA" in cal.key and len(cal.kernel_s) == len(cal.cpu_s) == len(cal.sizes)
    assert "|items~" in cal.key and 0 < cal.block[0] <= train.shape[1]  # a column stratum
    assert 0.2 < cal.cpu_load < 5.0  # the CPU's runs beside the GPU, against the curve's
    assert mf.history_[-1]["test_rmse"] <= MOVIELENS_TARGET
    # the GPUs-alone option priced on one of its blocks, measured before the plan
    alone = mf.gpus_alone_
    assert alone["per_rating_s"] > 0 and alone["epoch_s"] > alone["per_rating_s"] * train.nnz
    # and no GPU block priced faster than that rate, as fit plans
    predict = {"gpu": cal.predictor("gpu", floor=alone["per_rating_s"]),
               "cpu": cal.predictor("cpu")}
    used, alpha = plan(train.nnz, predict, 1, 3, alone["epoch_s"])
    d = mf.division_
    assert d["cpu_slots"] == used and d["alpha"] == pytest.approx(alpha, abs=0.05)
    assert d["cols"] == (used + 3 if used else 2)  # the GPU alone: the gpu mode's 2×2 grid


@pytest.mark.gpu
def test_hsgd_star_hands_rows_over_at_the_rates_its_epochs_measured():
    """A calibration far from this machine (a GPU 25× faster than a CPU thread, where the
    GPU, held to 2 warps, is slower than one): after epoch 1 whole rows of blocks go from
    the GPU to the CPU slots, halfway toward the share the measured rates balance, the time
    it takes is training time, and every block still runs once an epoch, the scheduler's
    events numbering the epochs on. (The other way, a calibration that prices the GPU too
    slow, hinged on the GPU's measured rate over a small share, which its calls' overhead
    sets: 0.137 against a CPU row of 0.14 once the CPU blocks ran in LIBMF's order. A GPU
    held to 2 warps is slower than a CPU thread whatever its calls cost.) Eight million
    ratings and six CPU threads; the division's GPU sub-rows are 1/7 of its share."""
    import dask.config

    from mgpu.distributed import connect
    from mgpu.mf.planning import measured_alpha
    from mgpu.synthetic import planted_ratings

    n = [float(2 ** e) for e in range(10, 21)]
    fast_gpu = Calibration("made-up", n, [x / 4e6 for x in n], [x / 1e9 for x in n],
                           [x / 1e8 for x in n], 1e-4, 1e-4, "test")
    train, test = _split(planted_ratings(40_000, 8_000, 8_000_000, seed=1))
    epochs = 6
    with connect(gpus=True, n_workers=1, cpu_threads=6), \
            dask.config.set({"mgpu.mf.replan": True, "mgpu.mf.gpu-warps": 2}):
        mf = mgpu.MatrixFactorization(k=128, lr=0.01, reg=0.05, epochs=epochs, mode="hsgd*",
                                      calibration=fast_gpu)
        mf.fit(train, test)
    h = mf.history_
    planned = mf.division_["alpha_planned"]
    assert planned > 0.5
    first = measured_alpha(h[0], 1, mf.division_["cpu_slots"])
    assert first is not None and first < planned - 0.2
    # before epoch 2 the GPU gave rows away: its share went toward halfway to the measured
    assert h[1].get("rows_moved", 0) >= 1 and h[1]["replan_s"] > 0, (
        f"no rows moved: planned {planned:.3f}, measured {first:.3f}, epoch 1 "
        f"{ {k: v for k, v in h[0].items() if k.startswith(('gpu', 'cpu'))} }")
    assert "rows_moved" not in h[0]
    assert h[0]["alpha"] == pytest.approx(planned)
    goal = planned + 0.5 * (first - planned)
    assert h[1]["alpha"] < planned and abs(h[1]["alpha"] - goal) < planned - goal
    assert mf.division_["alpha"] == pytest.approx(h[-1]["alpha"])
    assert h[1]["seconds"] - h[0]["seconds"] >= h[1]["replan_s"]
    assert all(e["gpu_ratings"] + e["cpu_ratings"] == train.nnz for e in h)
    done = [e.epoch for e in mf.schedule_events_ if e.kind == "finish"]
    assert sorted(set(done)) == list(range(1, epochs + 1))
    n_blocks = mf.division_["blocks"]
    assert [done.count(k) for k in range(1, epochs + 1)] == [n_blocks] * epochs
