"""The HSGD* cost model (Yu, thesis ch. 3): fitted time curves and the CPU/GPU split α.

Pure functions, no Dask, no GPU. Times are measured on growing *prefixes* S1, S1+S2, … of
one shuffled sample (so that larger runs contain the smaller ones, as the thesis does), a few
repeats each, averaged (:func:`calibrate`). Then:

- CPU: time piecewise linear in the number of ratings, through the sizes measured
  (:func:`fit_piecewise`). The thesis fits one line, ``t = a·n + b`` (:func:`fit_linear`,
  still Qilin's model here), but a CPU block's cost per rating is not constant: it falls
  as blocks grow (fixed costs amortised) and rises again once the user segment no longer
  fits in cache, so the best single line misses blocks by tens of percent at both ends of
  the sizes HSGD* uses.
- GPU, below a threshold τ where the speed still grows: transfer ``t = n / (a·sqrt(ln n) + b)``
  and kernel ``t = n / (a·ln n + b)``; above τ both are linear. The GPU's time is the larger
  of the two, because copies and kernels overlap on streams (:func:`fit_gpu_curve`).
- Every curve is fitted on relative residuals (the sizes grow geometrically; a plain fit
  follows the largest and misses small blocks by more than their own time), a saturating one
  with its speed kept positive over the sizes measured and not extrapolated below them.
- τ is the first size from which the speed (n / t) stays within 2% (:func:`threshold`).
- α, the share of ratings for the GPUs, makes the two sides finish together:
  ``argmin |T_g(α·N)/n_g − T_c((1−α)·N)/n_c|`` (:func:`split`).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Curve", "calibrate", "fit_gpu_curve", "fit_linear", "fit_piecewise", "split",
           "threshold"]


@dataclass(frozen=True)
class Curve:
    """Seconds for n ratings: a saturating form below ``tau``, linear from ``tau`` on.

    ``form`` is "linear", "sqrtlog" (n / (a·sqrt(ln n) + b)), "log" (n / (a·ln n + b)) or
    "piecewise" (straight between the ``knots``, (ratings, seconds) pairs; see
    :func:`fit_piecewise`).
    """

    form: str
    a: float
    b: float
    tau: float = math.inf
    slope: float = 0.0  # the linear part above tau: t = slope·n + icpt
    icpt: float = 0.0
    lo: float = 0.0  # the smallest size measured: a saturating form is not extrapolated below
    knots: tuple[tuple[float, float], ...] = ()

    def __call__(self, n: float) -> float:
        n = float(n)
        if n <= 0:
            return 0.0
        if self.form == "piecewise":
            (n0, t0), (n1, t1) = self.knots[0], self.knots[-1]
            if n >= n1:  # beyond the sizes measured: the largest one's time per rating
                return t1 * n / n1
            return float(np.interp(max(n, n0), *zip(*self.knots)))
        if n >= self.tau:
            return self.slope * n + self.icpt
        if self.form == "linear":
            return self.a * n + self.b
        # below the sizes measured, a block costs what the smallest one did (latency-bound)
        n = max(n, self.lo)
        return n / max(self.a * _g(self.form, n) + self.b, 1e-300)


def _g(form: str, n: Any) -> Any:
    """The growth of a saturating form's speed: sqrt(ln n) or ln n."""
    ln = np.log(np.maximum(n, math.e))
    return np.sqrt(ln) if form == "sqrtlog" else ln


def calibrate(run: Callable[[int], float], sizes: Sequence[int], repeats: int = 3
              ) -> tuple[np.ndarray, np.ndarray]:
    """Mean seconds of ``run(n)`` for each prefix size n (``run`` times one pass itself)."""
    sizes = np.asarray(sorted(int(n) for n in sizes), dtype=np.float64)
    if sizes.size < 2 or sizes[0] <= 0:
        raise ValueError("calibrate needs at least two positive prefix sizes.")
    times = np.array([np.mean([run(int(n)) for _ in range(repeats)]) for n in sizes])
    return sizes, times


def _line(n: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """``t = a·n + b`` by least squares on relative residuals: calibration sizes grow
    geometrically, and a plain fit would follow the largest ones and miss the small blocks
    by their whole size (its intercept alone can exceed a small block's time)."""
    a, b = np.polyfit(n, t, 1, w=1.0 / np.maximum(t, 1e-300))
    return float(a), float(b)


def fit_linear(n: np.ndarray, t: np.ndarray) -> Curve:
    """Least-squares ``t = a·n + b`` (relative residuals).

    >>> c = fit_linear(np.array([1e3, 2e3, 4e3]), np.array([1.0, 2.0, 4.0]) * 1e-3)
    >>> round(c(8e3), 6)
    0.008
    """
    a, b = _line(np.asarray(n, float), np.asarray(t, float))
    return Curve("linear", a, b)


def fit_piecewise(n: np.ndarray, t: np.ndarray) -> Curve:
    """Time straight between the sizes measured (made non-decreasing: a larger block never
    costs less), the smallest size's time below them, the largest's time per rating above.

    >>> c = fit_piecewise(np.array([1e3, 2e3, 4e3]), np.array([1.0, 1.5, 4.0]) * 1e-3)
    >>> [round(c(m) * 1e3, 3) for m in (500, 1500, 3000, 8000)]
    [1.0, 1.25, 2.75, 8.0]
    """
    n = np.asarray(n, float)
    t = np.asarray(t, float)
    if n.size < 2 or np.any(np.diff(n) <= 0) or n[0] <= 0:
        raise ValueError("fit_piecewise needs at least two increasing positive sizes.")
    t = np.maximum.accumulate(t)
    return Curve("piecewise", 0.0, 0.0, lo=float(n[0]),
                 knots=tuple((float(a), float(b)) for a, b in zip(n, t)))


def threshold(n: np.ndarray, t: np.ndarray, tol: float = 0.02) -> float:
    """The first size from which the speed n/t stays within ``tol`` (relative) over all the
    larger sizes measured; inf if it never settles (the last size alone does not count)."""
    speed = np.asarray(n, float) / np.asarray(t, float)
    for i in range(len(speed) - 1):
        rest = speed[i:]
        if rest.max() - rest.min() <= tol * rest.max():
            return float(n[i])
    return math.inf


def fit_gpu_curve(n: np.ndarray, t: np.ndarray, form: str, tol: float = 0.02) -> Curve:
    """Fit a GPU side (``form`` "sqrtlog" for transfers, "log" for kernels) with its τ."""
    if form not in ("sqrtlog", "log"):
        raise ValueError(f"form must be 'sqrtlog' or 'log'. Got {form!r}.")
    n = np.asarray(n, float)
    t = np.asarray(t, float)
    tau = threshold(n, t, tol)
    below = n < tau
    if below.sum() >= 2:
        a, b = _fit_saturating(n[below], t[below], form)
    else:  # no saturating range measured: a constant speed
        a, b = 0.0, float(np.mean(n / t))
    return _with_linear_tail(Curve(form, a, b, lo=float(n.min())), n, t, tau)


def _fit_saturating(n: np.ndarray, t: np.ndarray, form: str) -> tuple[float, float]:
    """``t = n / (a·g(n) + b)`` by least squares on log time (relative error at every size).

    The speed ``a·g(n) + b`` is parametrised by its (log) values at the smallest and largest
    size, so it stays positive over the sizes measured whatever the data; a fit of the speed
    itself against g(n) follows the largest sizes and can cross zero at the smallest.
    """
    from scipy.optimize import least_squares

    g = _g(form, n)
    g0, g1 = float(g.min()), float(g.max())
    speed = n / t

    def coef(x: np.ndarray) -> tuple[float, float]:
        s0, s1 = np.exp(x)
        a = (s1 - s0) / (g1 - g0) if g1 > g0 else 0.0
        return a, s0 - a * g0

    def resid(x: np.ndarray) -> np.ndarray:
        a, b = coef(x)
        return np.log(a * g + b) - np.log(speed)

    x0 = np.log([speed[np.argmin(g)], speed[np.argmax(g)]])
    a, b = coef(least_squares(resid, x0).x)
    return float(a), float(b)


def _with_linear_tail(c: Curve, n: np.ndarray, t: np.ndarray, tau: float) -> Curve:
    """``c`` below τ, and from τ on the straight line through the sizes measured there."""
    above = n >= tau
    if above.sum() >= 2:
        slope, icpt = _line(n[above], t[above])
    elif above.sum() == 1:
        slope, icpt = float(t[above][0] / n[above][0]), 0.0
    else:
        return c
    return Curve(c.form, c.a, c.b, tau, slope, icpt, c.lo)


def split(total: float, gpu: Callable[[float], float], cpu: Callable[[float], float],
          n_gpus: int, n_cpu_threads: int, tol: float = 1e-6) -> float:
    """α in [0, 1]: the GPUs' share of ``total`` ratings that evens out the two sides.

    ``gpu`` and ``cpu`` give seconds for a number of ratings on one side as a whole.

    >>> round(split(1e6, lambda n: n / 3e6, lambda n: n / 1e6, 1, 1), 3)  # GPU 3× faster
    0.75
    """
    if n_gpus <= 0:
        return 0.0
    if n_cpu_threads <= 0:
        return 1.0

    def gap(alpha: float) -> float:
        return gpu(alpha * total) / n_gpus - cpu((1 - alpha) * total) / n_cpu_threads

    lo, hi = 0.0, 1.0
    if gap(lo) >= 0:
        return 0.0
    if gap(hi) <= 0:
        return 1.0
    while hi - lo > tol:  # gap grows with α: bisection
        mid = 0.5 * (lo + hi)
        if gap(mid) < 0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
