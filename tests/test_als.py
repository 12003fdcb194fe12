"""The ALS workflow spread over a CPU cluster's workers against the one-process path."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from workflows import als


def test_cluster_train_on_movielens_equals_one_process(client, data_dir):
    from mgpu.io import load_ratings

    path = data_dir / "ratings" / "ml-latest-small-2016_ratings.csv.gz"
    if not path.is_file():
        pytest.skip(f"{path.name} not found in {path.parent}")
    R = load_ratings(path).matrix
    train, test = als.split(R, 0.1, 0)
    one = als.train(train, test, k=8, iters=5)
    seen = []
    spread = als.train_distributed(train, test, parts=3, client=client, k=8, iters=5,
                                   progress=seen.append)
    assert [h["iteration"] for h in spread.history] == [1, 2, 3, 4, 5] == \
        [h["iteration"] for h in seen]
    for key in ("train_rmse", "test_rmse"):
        # float32 ratings: V's gradient summed tile by tile rounds differently, nothing more
        np.testing.assert_allclose([h[key] for h in spread.history],
                                   [h[key] for h in one.history], rtol=1e-7)
    assert spread.history[-1]["train_rmse"] < spread.history[0]["train_rmse"]
    assert spread.U.shape == one.U.shape and spread.V.shape == one.V.shape
    np.testing.assert_allclose(spread.U, one.U, rtol=0, atol=1e-5)
    np.testing.assert_allclose(spread.V, one.V, rtol=0, atol=1e-5)
    assert all(h["step_s"] > 0 for h in spread.history)


def test_cluster_train_in_float64_is_the_same_to_rounding(client):
    rng = np.random.default_rng(0)
    R = sp.random(80, 50, density=0.2, format="csr", random_state=rng,
                  data_rvs=lambda n: rng.uniform(1, 5, n))
    train, test = als.split(R, 0.2, 1)
    one = als.train(train, test, k=4, iters=8, lr=0.05)
    spread = als.train_distributed(train, test, parts=4, client=client, k=4, iters=8, lr=0.05)
    for key in ("train_rmse", "test_rmse"):
        np.testing.assert_allclose([h[key] for h in spread.history],
                                   [h[key] for h in one.history], rtol=1e-12)
    np.testing.assert_allclose(spread.U, one.U, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(spread.V, one.V, rtol=1e-10, atol=1e-13)
    no_test = als.train_distributed(train, parts=2, client=client, k=4, iters=3, lr=0.05)
    assert "test_rmse" not in no_test.history[0]
    np.testing.assert_allclose([h["train_rmse"] for h in no_test.history],
                               [h["train_rmse"] for h in one.history[:3]], rtol=1e-12)


def test_cluster_train_refuses_bad_input(client):
    R = sp.csr_matrix(np.ones((3, 3)))
    with pytest.raises(ValueError, match="k and iters must be >= 1"):
        als.train_distributed(R, k=0, client=client)
    with pytest.raises(TypeError, match="'R' parameter of train_distributed must be a scipy"):
        als.train_distributed(np.ones((3, 3)), client=client)
    with pytest.raises(ValueError, match=r"'test' parameter of train_distributed must have "
                                         r"R's shape \(3, 3\)\. Got \(3, 4\)"):
        als.train_distributed(R, sp.csr_matrix(np.ones((3, 4))), client=client)


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
    model = als.train(R, k=3, reg=0.1, lr=0.05, iters=6, seed=2)
    host = (lambda a: a.get()) if xp is not np else np.asarray
    np.testing.assert_allclose([h["train_rmse"] for h in model.history], rmse, rtol=1e-12)
    np.testing.assert_allclose(host(model.U), U, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(host(model.V), V, rtol=1e-10, atol=1e-13)


def test_train_refuses_nan_ratings_and_reports_divergence(xp):
    R = sp.random(30, 20, density=0.3, format="csr", random_state=4, dtype=np.float32)
    R.data = R.data * 4 + 1
    bad = R.copy()
    bad.data[5] = np.nan
    on = (lambda M: M) if xp is np else __import__("cupyx.scipy.sparse").scipy.sparse.csr_matrix
    with pytest.raises(ValueError, match="'R' parameter of train holds NaN or infinity"):
        als.train(on(bad), iters=2)
    # Adam moves every entry by about lr a step: 1e20 overflows float32 products at once
    with pytest.raises(FloatingPointError, match=r"ALS diverged at step 2: the training RMSE "
                                                 r"is (inf|nan)\. Lower the learning rate "
                                                 r"\(lr=1e\+20\)"):
        als.train(on(R), iters=5, lr=1e20)


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
    train, test = (csp.csr_matrix(M) for M in als.split(R, 0.2, 3))
    eager = als.train(train, test, k=16, iters=8, lr=0.05, cuda_graph=False)
    replayed = als.train(train, test, k=16, iters=8, lr=0.05)
    for key in ("train_rmse", "test_rmse"):
        assert [h[key] for h in replayed.history] == [h[key] for h in eager.history]
    np.testing.assert_array_equal(replayed.U.get(), eager.U.get())
    np.testing.assert_array_equal(replayed.V.get(), eager.V.get())
    assert replayed.history[-1]["train_rmse"] < replayed.history[0]["train_rmse"]
    # a step that waits on the device cannot be captured, and says why
    import cupy

    s = cupy.cuda.Stream(non_blocking=True)
    x = cupy.ones(4)
    with pytest.raises(Exception, match="(?i)captur"):
        Replay(lambda: float(x.sum()), s)
    doubled = Replay(lambda: x * 2, s)()
    s.synchronize()  # the replay runs on s; get() copies on the default stream
    assert doubled.get().tolist() == [2.0] * 4
