"""The GaP topic model on one device and spread over a cluster: the same iterations."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from mgpu.synthetic import powerlaw_corpus
from workflows import gap


def _corpus() -> sp.csr_matrix:
    return powerlaw_corpus(600, 300, 0.03, seed=3).astype(np.float64)


@pytest.mark.parametrize("parts", [1, 3])
def test_cluster_fit_equals_one_device(client, parts):
    S = _corpus()
    one = gap.fit(S, 5, iters=6, seed=2)
    seen = []
    spread = gap.fit_distributed(S, 5, parts=parts, client=client, iters=6, seed=2,
                                 progress=seen.append)
    assert [h["iteration"] for h in spread.history] == list(range(1, 7)) == \
        [h["iteration"] for h in seen]
    np.testing.assert_allclose([h["loglik_per_token"] for h in spread.history],
                               [h["loglik_per_token"] for h in one.history], rtol=1e-10)
    np.testing.assert_allclose(spread.X, one.X, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(spread.L, one.L, rtol=1e-9, atol=1e-15)
    assert all(h["step_s"] > 0 for h in spread.history)
    assert len(spread.tiles) == parts
    assert sum(t["rows"] for t in spread.tiles) == S.shape[0]
    assert sum(t["nnz"] for t in spread.tiles) == S.nnz
    assert {t["worker"] for t in spread.tiles} <= set(client.scheduler_info()["workers"])


def test_cluster_fit_on_the_ap_corpus(client, data_dir):
    from mgpu import io

    S = sp.csr_matrix(io.load(str(data_dir / "bow" / "ap.dat.gz")), dtype=np.float64)
    one = gap.fit(S, 8, iters=4)
    spread = gap.fit_distributed(S, 8, parts=4, client=client, iters=4)
    ll = [h["loglik_per_token"] for h in spread.history]
    np.testing.assert_allclose(ll, [h["loglik_per_token"] for h in one.history], rtol=1e-9)
    assert ll[-1] > ll[0]


def test_cluster_fit_refuses_bad_input(client):
    with pytest.raises(ValueError, match="topics and iters must be >= 1"):
        gap.fit_distributed(_corpus(), 0, client=client)
    with pytest.raises(TypeError, match="must be a scipy sparse matrix"):
        gap.fit_distributed(np.ones((3, 3)), 2, client=client)
    with pytest.raises(ValueError, match="non-negative counts"):
        gap.fit_distributed(sp.csr_matrix(-np.ones((3, 3))), 2, client=client)
