"""The HSGD* cost model on curves of known shape: fits, threshold, split."""
from __future__ import annotations

import math

import numpy as np
import pytest

from mgpu.sched.cost import (Curve, calibrate, fit_gpu_curve, fit_linear, fit_piecewise, split,
                             threshold)


def _saturating(n, a, b, tau, form):
    """A GPU-like curve: speed a·g(n)+b up to tau, then constant speed (linear time)."""
    g = (lambda x: math.sqrt(math.log(x))) if form == "sqrtlog" else math.log
    speed_tau = a * g(tau) + b
    return np.array([x / (a * g(x) + b) if x < tau else x / speed_tau for x in n])


@pytest.mark.parametrize("form", ["log", "sqrtlog"])
def test_gpu_fit_predicts_within_15_percent(form):
    rng = np.random.default_rng(0)
    sizes = np.geomspace(1e4, 1e8, 17)
    true = _saturating(sizes, 2e7, 1e6, 3e6, form)
    measured = true * rng.uniform(0.99, 1.01, size=true.size)
    curve = fit_gpu_curve(sizes, measured, form)
    assert 5e5 <= curve.tau <= 2e7
    held_out = np.geomspace(2e4, 8e7, 9)
    want = _saturating(held_out, 2e7, 1e6, 3e6, form)
    got = np.array([curve(x) for x in held_out])
    assert (np.abs(got - want) / want).max() < 0.15


def test_cpu_fit_and_threshold():
    sizes = np.array([1e3, 1e4, 1e5, 1e6])
    curve = fit_linear(sizes, 2e-8 * sizes + 1e-4)
    assert curve.a == pytest.approx(2e-8, rel=1e-6) and curve.b == pytest.approx(1e-4, rel=1e-4)
    # speed 1, 2, 3, 3.01, 3.01: from the third size on it changes by less than 2%
    n = np.array(sizes.tolist() + [1e7])
    speeds = np.array([1.0, 2.0, 3.0, 3.01, 3.01])
    assert threshold(n, n / speeds) == 1e5
    assert threshold(n, n / np.array([1.0, 2.0, 3.0, 4.0, 5.0])) == math.inf


def test_piecewise_cpu_fit_follows_a_cost_per_rating_that_is_not_constant():
    """A CPU block's cost per rating falls while copies amortise and rises once the segment
    leaves the cache: through the sizes measured the piecewise curve is exact, between them
    within the two neighbours' per-rating costs, where the best line is 20%+ off."""
    sizes = np.array([2.0 ** e for e in range(10, 21)])
    per = np.interp(np.log2(sizes), [10, 14, 17, 20], [450e-9, 250e-9, 650e-9, 650e-9])
    noisy = sizes * per * np.random.default_rng(1).uniform(0.995, 1.005, sizes.size)
    c = fit_piecewise(sizes, noisy)
    assert [c(x) for x in sizes] == pytest.approx(list(noisy), rel=1e-12)
    mids = np.sqrt(sizes[1:] * sizes[:-1])
    for m, lo, hi in zip(mids, per[:-1], per[1:]):
        assert min(lo, hi) * 0.99 <= c(m) / m <= max(lo, hi) * 1.01
    assert c(2.0 ** 22) == pytest.approx(4 * noisy[-1])  # the largest's cost per rating
    assert c(100) == c(1024) == noisy[0] and c(0) == 0.0  # not extrapolated below
    line = fit_linear(sizes, noisy)
    assert max(abs(line(x) / t - 1) for x, t in zip(sizes, noisy)) > 0.2
    # a noisy measurement never makes a larger block cheaper
    dip = fit_piecewise(np.array([1e3, 2e3, 4e3]), np.array([1.0, 0.9, 3.0]))
    assert dip(2e3) == 1.0 and dip(1.5e3) == 1.0 and dip(3e3) == 2.0
    with pytest.raises(ValueError, match="two increasing positive sizes"):
        fit_piecewise(np.array([2e3, 1e3]), np.array([1.0, 2.0]))


def test_split_evens_out_the_two_sides():
    gpu = Curve("linear", 1 / 4e6, 0.01)
    cpu = Curve("linear", 1 / 1e6, 0.0)
    for n_g, n_c in ((1, 1), (2, 16), (4, 8)):
        alpha = split(5e7, gpu, cpu, n_g, n_c)
        grid = np.linspace(0, 1, 100_001)
        gaps = [abs(gpu(a * 5e7) / n_g - cpu((1 - a) * 5e7) / n_c) for a in grid[::100]]
        best = grid[::100][int(np.argmin(gaps))]
        assert abs(alpha - best) < 2e-3
        assert gpu(alpha * 5e7) / n_g == pytest.approx(cpu((1 - alpha) * 5e7) / n_c, rel=1e-4)
    assert split(1e6, gpu, cpu, 0, 4) == 0.0 and split(1e6, gpu, cpu, 2, 0) == 1.0


def test_calibrate_averages_prefix_runs_and_refuses_bad_sizes():
    calls = []

    def run(n):
        calls.append(n)
        return n * 1e-6 + (0.001 if len(calls) % 2 else -0.001)

    n, t = calibrate(run, [4000, 1000, 2000], repeats=2)
    assert n.tolist() == [1000, 2000, 4000]
    np.testing.assert_allclose(t, [1e-3, 2e-3, 4e-3])
    assert calls == [1000, 1000, 2000, 2000, 4000, 4000]
    with pytest.raises(ValueError, match="at least two positive prefix sizes"):
        calibrate(run, [1000])
    with pytest.raises(ValueError, match="form must be"):
        fit_gpu_curve(n, t, "cubic")
