"""The synthetic matrices of the benchmarks."""
from __future__ import annotations

import numpy as np


def test_power_law_draws_equal_one_searchsorted():
    from mgpu.synthetic import _inverse_cdf

    rng = np.random.default_rng(5)
    cdf = np.cumsum(rng.random(3000))
    cdf /= cdf[-1]
    u = rng.random(3_000_000)  # several chunks of the threaded search
    np.testing.assert_array_equal(_inverse_cdf(cdf, u), np.searchsorted(cdf, u, side="right"))
