"""GradientMF (full-batch gradient descent with Adam, SDDMM + SpMM steps) spread over a CPU
cluster's workers against the one-process path, and its steps against dense arithmetic."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from mgpu.mf import split_ratings
from mgpu.models import GradientMF


def test_cluster_train_on_movielens_equals_one_process(client, data_dir):
    from mgpu.io import load_ratings

    path = data_dir / "ratings" / "ml-latest-small-2016_ratings.csv.gz"
    if not path.is_file():
        pytest.skip(f"{path.name} not found in {path.parent}")
    R = load_ratings(path).matrix
    train, test = split_ratings(R, 0.1, 0)
    one = GradientMF(k=8, iters=5).fit(train, test)
    seen = []
    spread = GradientMF(k=8, iters=5).fit(train, test, parts=3, client=client,
                                          progress=seen.append)
    assert [h["iteration"] for h in spread.history_] == [1, 2, 3, 4, 5] == \
        [h["iteration"] for h in seen]
    for key in ("train_rmse", "test_rmse"):
        # float32 ratings: V's gradient summed tile by tile rounds differently, nothing more
        np.testing.assert_allclose([h[key] for h in spread.history_],
                                   [h[key] for h in one.history_], rtol=1e-7)
    assert spread.history_[-1]["train_rmse"] < spread.history_[0]["train_rmse"]
    assert spread.U_.shape == one.U_.shape and spread.V_.shape == one.V_.shape
    np.testing.assert_allclose(spread.U_, one.U_, rtol=0, atol=1e-5)
    np.testing.assert_allclose(spread.V_, one.V_, rtol=0, atol=1e-5)
    assert all(h["step_s"] > 0 for h in spread.history_)


def test_cluster_train_in_float64_is_the_same_to_rounding(client):
    rng = np.random.default_rng(0)
    R = sp.random(80, 50, density=0.2, format="csr", random_state=rng,
                  data_rvs=lambda n: rng.uniform(1, 5, n))
    train, test = split_ratings(R, 0.2, 1)
    one = GradientMF(k=4, iters=8, lr=0.05).fit(train, test)
    spread = GradientMF(k=4, iters=8, lr=0.05).fit(train, test, parts=4, client=client)
    for key in ("train_rmse", "test_rmse"):
        np.testing.assert_allclose([h[key] for h in spread.history_],
                                   [h[key] for h in one.history_], rtol=1e-12)
    np.testing.assert_allclose(spread.U_, one.U_, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(spread.V_, one.V_, rtol=1e-10, atol=1e-13)
    no_test = GradientMF(k=4, iters=3, lr=0.05).fit(train, parts=2, client=client)
    assert "test_rmse" not in no_test.history_[0]
    np.testing.assert_allclose([h["train_rmse"] for h in no_test.history_],
                               [h["train_rmse"] for h in one.history_[:3]], rtol=1e-12)


def test_cluster_train_of_a_dask_array_keeps_its_tiles(client):
    """Ratings given as a dask array of row tiles are fitted where the tiles are."""
    import mgpu

    rng = np.random.default_rng(0)
    R = sp.random(80, 50, density=0.2, format="csr", random_state=rng,
                  data_rvs=lambda n: rng.uniform(1, 5, n))
    train, test = split_ratings(R, 0.2, 1)
    one = GradientMF(k=4, iters=8, lr=0.05).fit(train, test)
    Rd = mgpu.from_scipy(train, 3, client=client)
    spread = GradientMF(k=4, iters=8, lr=0.05).fit(Rd, test)
    for key in ("train_rmse", "test_rmse"):  # μ is summed tile by tile: rounding only
        np.testing.assert_allclose([h[key] for h in spread.history_],
                                   [h[key] for h in one.history_], rtol=1e-12)
    np.testing.assert_allclose(spread.U_, one.U_, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(spread.predict(test).data, one.predict(test).data, rtol=1e-10)
    holders = mgpu.distributed.chunk_workers(Rd, client)
    assert [t["worker"] for t in spread.tiles_] == [holders[(i, 0)][0] for i in range(3)]
    assert sum(t["nnz"] for t in spread.tiles_) == train.nnz


def test_cluster_train_refuses_bad_input(client):
    R = sp.csr_matrix(np.ones((3, 3)))
    with pytest.raises(ValueError, match="k and iters must be >= 1"):
        GradientMF(k=0).fit(R, client=client)
    with pytest.raises(TypeError, match="'R' parameter of GradientMF.fit on a cluster must be "
                                        "a scipy"):
        GradientMF().fit(np.ones((3, 3)), client=client)
    with pytest.raises(ValueError, match=r"'test' parameter of GradientMF.fit must have "
                                         r"R's shape \(3, 3\)\. Got \(3, 4\)"):
        GradientMF().fit(R, sp.csr_matrix(np.ones((3, 4))), client=client)


def _ratings() -> sp.csr_matrix:
    rng = np.random.default_rng(5)
    return sp.random(40, 30, density=0.2, format="csr", random_state=rng,
                     data_rvs=lambda n: rng.uniform(1, 5, n))


def _backwards(R: sp.csr_matrix) -> sp.csr_matrix:
    """R with every row's entries stored in reverse (unsorted indices)."""
    indices, data = R.indices.copy(), R.data.copy()
    for r in range(R.shape[0]):
        a, b = R.indptr[r], R.indptr[r + 1]
        indices[a:b], data[a:b] = indices[a:b][::-1].copy(), data[a:b][::-1].copy()
    return sp.csr_matrix((data, indices, R.indptr.copy()), shape=R.shape)


def test_fit_leaves_the_callers_ratings_as_they_were(client):
    R = _backwards(_ratings())
    indices, data = R.indices.copy(), R.data.copy()
    one = GradientMF(k=2, iters=2).fit(R)
    spread = GradientMF(k=2, iters=2).fit(R, parts=2, client=client)
    np.testing.assert_array_equal(R.indices, indices)
    np.testing.assert_array_equal(R.data, data)
    np.testing.assert_allclose(spread.U_, one.U_, rtol=1e-10, atol=1e-13)


def test_duplicate_ratings_are_refused_on_one_device_and_on_a_cluster(client):
    """Two ratings of one item by one user: refused the same way everywhere, not summed."""
    R = _ratings()
    r = int(np.flatnonzero(np.diff(R.indptr))[0])
    at = R.indptr[r]
    dup = sp.csr_matrix((np.insert(R.data, at, 3.0), np.insert(R.indices, at, R.indices[at]),
                         np.concatenate([R.indptr[:r + 1], R.indptr[r + 1:] + 1])),
                        shape=R.shape)
    words = r"'R' parameter of GradientMF.fit rates an item more than once .*R.sum_duplicates"
    for fit in (lambda M: GradientMF(iters=1).fit(M),
                lambda M: GradientMF(iters=1).fit(M, parts=2, client=client)):
        with pytest.raises(ValueError, match=words):
            fit(dup)
        with pytest.raises(ValueError, match=words):
            fit(dup.tocoo())
    # from_scipy sums duplicates: a dask array of row tiles that keeps them
    import dask.array as da

    tiles = da.from_array(dup, chunks=(20, R.shape[1]), asarray=False)
    with pytest.raises(ValueError, match=words):
        GradientMF(iters=1).fit(tiles, client=client)
    GradientMF(iters=1).fit(R)  # R itself is taken


def test_seed_none_fits_on_one_device_and_on_a_cluster(client):
    R = _ratings()
    for fit in (lambda m: m.fit(R), lambda m: m.fit(R, parts=2, client=client)):
        model = fit(GradientMF(k=2, iters=2, seed=None))
        assert model.U_.shape == (R.shape[0], 2) and np.isfinite(model.U_).all()


def test_nan_in_test_is_refused_by_name(client):
    R = _ratings()
    test = R.copy()
    test.data[2] = np.nan
    with pytest.raises(ValueError, match="'test' parameter of GradientMF.fit holds NaN"):
        GradientMF(iters=2).fit(R, test)
    with pytest.raises(ValueError, match="'test' parameter of GradientMF.fit on a cluster "
                                         "holds NaN"):
        GradientMF(iters=2).fit(R, test, parts=2, client=client)


def _dense_reference(R: sp.csr_matrix, k: int, reg: float, lr: float, iters: int, seed: int):
    """The same steps on dense float64 arrays: the residual at the ratings, its products
    with the factors, and Adam with per-row means of the gradient."""
    mask = (R != 0).toarray() if R.nnz == np.count_nonzero(R.data) else None
    assert mask is not None
    Rd = R.toarray()
    m, n = R.shape
    mean = R.data.mean()
    rng = np.random.default_rng(seed)
    U = rng.normal(0, 0.1, (m, k))
    V = rng.normal(0, 0.1, (n, k))
    cnt = {"U": np.maximum(mask.sum(1), 1)[:, None], "V": np.maximum(mask.sum(0), 1)[:, None]}
    mom = {"U": np.zeros_like(U), "V": np.zeros_like(V)}
    sq = {"U": np.zeros_like(U), "V": np.zeros_like(V)}
    rmse = []
    for it in range(1, iters + 1):
        E = mask * (U @ V.T + mean - Rd)
        rmse.append(np.sqrt((E[mask] ** 2).mean()))
        grads = {"U": E @ V, "V": E.T @ U}
        for name, A in (("U", U), ("V", V)):
            g = grads[name] / cnt[name] + reg * A
            mom[name] = 0.9 * mom[name] + 0.1 * g
            sq[name] = 0.999 * sq[name] + 0.001 * g * g
            A -= lr * (mom[name] / (1 - 0.9 ** it)) / (np.sqrt(sq[name] / (1 - 0.999 ** it))
                                                       + 1e-8)
    return U, V, rmse


def test_train_steps_match_a_dense_float64_reference(xp):
    """SDDMM, the residual, its transpose by one gather and both SpMMs, on CPU and GPU,
    against dense float64 arithmetic (empty rows and columns included)."""
    rng = np.random.default_rng(3)
    R = sp.random(40, 30, density=0.15, format="csr", random_state=rng,
                  data_rvs=lambda s: rng.uniform(1, 5, s))
    R = sp.csr_matrix(R.multiply(np.arange(40)[:, None] % 7 != 0))  # empty rows
    R.eliminate_zeros()
    U, V, rmse = _dense_reference(R, 3, 0.1, 0.05, 6, 2)
    if xp is not np:
        import cupyx.scipy.sparse as csp

        R = csp.csr_matrix(R)
    model = GradientMF(k=3, reg=0.1, lr=0.05, iters=6, seed=2).fit(R)
    host = (lambda a: a.get()) if xp is not np else np.asarray
    np.testing.assert_allclose([h["train_rmse"] for h in model.history_], rmse, rtol=1e-12)
    np.testing.assert_allclose(host(model.U_), U, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(host(model.V_), V, rtol=1e-10, atol=1e-13)


def test_train_refuses_nan_ratings_and_reports_divergence(xp):
    R = sp.random(30, 20, density=0.3, format="csr", random_state=4, dtype=np.float32)
    R.data = R.data * 4 + 1
    bad = R.copy()
    bad.data[5] = np.nan
    on = (lambda M: M) if xp is np else __import__("cupyx.scipy.sparse").scipy.sparse.csr_matrix
    with pytest.raises(ValueError, match="'R' parameter of GradientMF.fit holds NaN or "
                                         "infinity"):
        GradientMF(iters=2).fit(on(bad))
    # Adam moves every entry by about lr a step: 1e20 overflows float32 products at once
    with pytest.raises(FloatingPointError, match=r"GradientMF diverged at step 2: the training "
                                                 r"RMSE is (inf|nan)\. Lower the learning "
                                                 r"rate \(lr=1e\+20\)"):
        GradientMF(iters=5, lr=1e20).fit(on(R))


def _movielens_like(seed: int = 0) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    return sp.random(60, 40, density=0.3, format="csr", random_state=rng,
                     data_rvs=lambda n: rng.integers(1, 6, n).astype(float))


def test_a_finite_but_exploding_rmse_is_divergence(xp):
    """lr=100 throws the factors to a training RMSE in the thousands, finite, which used to
    end the fit as if nothing had happened; a rising RMSE past ten times its start stops it,
    naming the step and the learning rate."""
    R = _movielens_like()
    on = (lambda M: M) if xp is np else __import__("cupyx.scipy.sparse").scipy.sparse.csr_matrix
    with pytest.raises(FloatingPointError, match=r"GradientMF diverged at step 2: the training "
                                                 r"RMSE rose to [\d.e+]+, past 10 times its "
                                                 r"scale at the start .*\(lr=100\)"):
        GradientMF(k=4, lr=100, iters=20).fit(on(R))
    # a large rate whose RMSE overshoots and comes back is left alone
    model = GradientMF(k=4, lr=1.0, iters=60).fit(on(R))
    h = [rec["train_rmse"] for rec in model.history_]
    assert max(h) > h[0] > h[-1]


def test_a_cluster_fit_stops_on_divergence_too(client):
    train, test = split_ratings(_movielens_like(), 0.2, 0)
    with pytest.raises(FloatingPointError, match=r"GradientMF diverged at step 2: .*\(lr=100\)"):
        GradientMF(k=4, lr=100, iters=10).fit(train, test, parts=2, client=client)


@pytest.mark.gpu
def test_gpu_steps_replayed_as_a_cuda_graph_are_the_eager_steps():
    """From the second step on the GPU step is one CUDA graph launch; it must compute what the
    launches one by one compute, bit for bit, with the test predictions and Adam steps in
    between on the same stream. (Bit for bit on this matrix: its rows are too short for an
    SpMM row to be cut among warps, whose double atomics could add in another order.)"""
    import cupyx.scipy.sparse as csp

    from mgpu.backends.graph import Replay

    rng = np.random.default_rng(5)
    R = sp.random(500, 300, density=0.05, format="csr", random_state=rng, dtype=np.float32,
                  data_rvs=lambda s: rng.uniform(1, 5, s))
    train, test = (csp.csr_matrix(M) for M in split_ratings(R, 0.2, 3))
    eager = GradientMF(k=16, iters=8, lr=0.05, cuda_graph=False).fit(train, test)
    replayed = GradientMF(k=16, iters=8, lr=0.05).fit(train, test)
    for key in ("train_rmse", "test_rmse"):
        assert [h[key] for h in replayed.history_] == [h[key] for h in eager.history_]
    np.testing.assert_array_equal(replayed.U_.get(), eager.U_.get())
    np.testing.assert_array_equal(replayed.V_.get(), eager.V_.get())
    assert replayed.history_[-1]["train_rmse"] < replayed.history_[0]["train_rmse"]
    # a step that waits on the device cannot be captured, and says why
    import cupy

    s = cupy.cuda.Stream(non_blocking=True)
    x = cupy.ones(4)
    with pytest.raises(Exception, match="(?i)captur"):
        Replay(lambda: float(x.sum()), s)
    doubled = Replay(lambda: x * 2, s)()
    s.synchronize()  # the replay runs on s; get() copies on the default stream
    assert doubled.get().tolist() == [2.0] * 4
