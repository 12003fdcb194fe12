"""``mgpu bench sgd``: updates per second of the GPU SGD block kernel (``kernels/sgd.cu``).

Ratings are drawn on the GPU with power-law user and item degrees (Netflix's shape by
default: 480,189 users, 17,770 items, 100M ratings, the busiest user and item with about the
shares Netflix's have, 0.02% and 0.25%), factors of k columns; one timed pass visits every
rating once in a random order, with the warps in flight bounded as matrix factorisation
bounds them (``mgpu.mf.gpu-conflicts``) or not at all. The bytes column counts what a pass must move
at least: the two factor rows read and written, the rating and its two ids read.
"""
from __future__ import annotations

from typing import Any

import numpy as np


def _draw(n: int, weights: Any, rng: Any) -> Any:
    import cupy

    cdf = cupy.cumsum(weights / weights.sum())
    return cupy.minimum(cupy.searchsorted(cdf, rng.random(n)), weights.size - 1).astype(
        cupy.int32)


def bench_gpu(n_users: int, n_items: int, n_ratings: int, ks: tuple[int, ...], *,
              conflicts: tuple[float | None, ...] = (None,), dtype: Any = np.float32,
              repeats: int = 5, seed: int = 0) -> list[dict[str, Any]]:
    """Median time of one pass of the SGD kernel over ``n_ratings`` ratings, per k and per
    bound on conflicts."""
    import cupy

    from mgpu.backends.cupy_sgd import warps_for
    from mgpu.backends.timing import time_gpu
    from mgpu.mf.sgd import rmse, sgd_block

    rng = cupy.random.default_rng(seed)
    # independent draws: the ratings come in random order already
    users = _draw(n_ratings, 1.0 / cupy.arange(1, n_users + 1) ** 0.35, rng)
    items = _draw(n_ratings, 1.0 / cupy.arange(1, n_items + 1) ** 0.45, rng)
    busiest = (int(cupy.bincount(users).max()), int(cupy.bincount(items).max()))
    ratings = rng.integers(1, 6, n_ratings).astype(dtype)
    dev = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
    out = []
    sample = slice(0, min(n_ratings, 1_000_000))
    host = [a[sample].get() for a in (users, items, ratings)]
    for k, c in ((k, c) for k in ks for c in conflicts):
        P = (rng.random((n_users, k), dtype=np.float64) / np.sqrt(k)).astype(dtype)
        Q = (rng.random((n_items, k), dtype=np.float64) / np.sqrt(k)).astype(dtype)
        before = rmse(*host, P.get().astype(np.float64), Q.get().astype(np.float64))
        t = time_gpu(lambda: sgd_block(users, items, ratings, P, Q, 0.005, 0.05, 0.05,
                                       conflicts=c), repeats=repeats, warmup=1)
        after = rmse(*host, P.get().astype(np.float64), Q.get().astype(np.float64))
        item = np.dtype(dtype).itemsize
        moved = n_ratings * (4 * k * item + item + 8)
        out.append({"device": dev, "n_users": n_users, "n_items": n_items,
                    "n_ratings": n_ratings, "busiest_user_item": busiest, "k": k,
                    "dtype": np.dtype(dtype).name, "conflicts": c,
                    "warps": warps_for(users, items, n_users, n_items, c),
                    "median_s": t, "updates_per_s": n_ratings / t, "gb_per_s": moved / t / 1e9,
                    "rmse_sample_before": before, "rmse_sample_after": after})
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| device | ratings | users × items | k | dtype | conflicts bound | warps | "
            "ms per pass | G updates/s | GB/s (factor rows read + written) | "
            "RMSE on 1M ratings: start → after the passes |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {r['device']} | {r['n_ratings']:,} | {r['n_users']:,} × "
                     f"{r['n_items']:,} | {r['k']} | {r['dtype']} | "
                     f"{'none' if r['conflicts'] is None else r['conflicts']} | {r['warps']:,} | "
                     f"{r['median_s'] * 1e3:.1f} | "
                     f"{r['updates_per_s'] / 1e9:.2f} | {r['gb_per_s']:.0f} | "
                     f"{r['rmse_sample_before']:.3f} → {r['rmse_sample_after']:.3f} |")
    return "\n".join(lines)
