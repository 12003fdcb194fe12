"""The peers' distance-and-select step of ``mgpu bench knn`` (expanded_select), on the host:
the k nearest by cosine and euclidean distance, against scikit-learn's pairwise distances."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import pairwise_distances

from mgpu.bench.knn import expanded_select


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_expanded_select_gives_each_querys_k_nearest(metric):
    rng = np.random.default_rng(4)
    X, Q, k = rng.standard_normal((200, 12)), rng.standard_normal((30, 12)), 7
    sq = (X * X).sum(axis=1)
    dist, ids = expanded_select(Q @ X.T, (Q * Q).sum(axis=1), sq, np.sqrt(sq), metric, k)
    ref = pairwise_distances(Q, X, metric=metric)
    assert dist.shape == ids.shape == (30, k)
    np.testing.assert_allclose(dist, np.take_along_axis(ref, ids, 1), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(np.sort(dist, axis=1), np.sort(ref, axis=1)[:, :k], rtol=1e-9,
                               atol=1e-9)
