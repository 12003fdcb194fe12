"""The HSGD* cost model (Yu, thesis ch. 3): fitted time curves and the CPU/GPU split α.

Pure functions, no Dask, no GPU. Times are measured on growing *prefixes* S1, S1+S2, … of
one shuffled sample (so that larger runs contain the smaller ones, as the thesis does), a few
repeats each, averaged (:func:`calibrate`). Then:

- CPU: time linear in the number of ratings, ``t = a·n + b`` (:func:`fit_linear`).
- GPU, below a threshold τ where the speed still grows: transfer ``t = n / (a·sqrt(ln n) + b)``
  and kernel ``t = n / (a·ln n + b)``; above τ both are linear. The GPU's time is the larger
  of the two, because copies and kernels overlap on streams (:func:`fit_gpu_curve`).
- τ is the first size from which the speed (n / t) stays within 2% (:func:`threshold`).
- α, the share of ratings for the GPUs, makes the two sides finish together:
  ``argmin |T_g(α·N)/n_g − T_c((1−α)·N)/n_c|`` (:func:`split`).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Curve", "calibrate", "fit_gpu_curve", "fit_linear", "split", "threshold"]


@dataclass(frozen=True)
class Curve:
    """Seconds for n ratings: a saturating form below ``tau``, linear from ``tau`` on.

    ``form`` is "linear", "sqrtlog" (n / (a·sqrt(ln n) + b)) or "log" (n / (a·ln n + b)).
    """

    form: str
    a: float
    b: float
    tau: float = math.inf
    slope: float = 0.0  # the linear part above tau: t = slope·n + icpt
    icpt: float = 0.0

    def __call__(self, n: float) -> float:
        n = float(n)
        if n <= 0:
            return 0.0
        if self.form == "linear":
            return self.a * n + self.b
        if n >= self.tau:
            return self.slope * n + self.icpt
        g = math.sqrt(math.log(max(n, math.e))) if self.form == "sqrtlog" else \
            math.log(max(n, math.e))
        return n / max(self.a * g + self.b, 1e-300)


def calibrate(run: Callable[[int], float], sizes: Sequence[int], repeats: int = 3
              ) -> tuple[np.ndarray, np.ndarray]:
    """Mean seconds of ``run(n)`` for each prefix size n (``run`` times one pass itself)."""
    sizes = np.asarray(sorted(int(n) for n in sizes), dtype=np.float64)
    if sizes.size < 2 or sizes[0] <= 0:
        raise ValueError("calibrate needs at least two positive prefix sizes.")
    times = np.array([np.mean([run(int(n)) for _ in range(repeats)]) for n in sizes])
    return sizes, times


def fit_linear(n: np.ndarray, t: np.ndarray) -> Curve:
    """Least-squares ``t = a·n + b``.

    >>> c = fit_linear(np.array([1e3, 2e3, 4e3]), np.array([1.0, 2.0, 4.0]) * 1e-3)
    >>> round(c(8e3), 6)
    0.008
    """
    a, b = np.polyfit(np.asarray(n, float), np.asarray(t, float), 1)
    return Curve("linear", float(a), float(b))


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
        g = np.sqrt(np.log(np.maximum(n[below], math.e))) if form == "sqrtlog" else \
            np.log(np.maximum(n[below], math.e))
        a, b = np.polyfit(g, n[below] / t[below], 1)
    else:  # no saturating range measured: a constant speed
        a, b = 0.0, float(np.mean(n / t))
    above = ~below
    if above.sum() >= 2:
        slope, icpt = np.polyfit(n[above], t[above], 1)
    elif above.sum() == 1:
        slope, icpt = float(t[above][0] / n[above][0]), 0.0
    else:
        slope, icpt = 0.0, 0.0
    return Curve(form, float(a), float(b), tau, float(slope), float(icpt))


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
