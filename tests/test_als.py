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
