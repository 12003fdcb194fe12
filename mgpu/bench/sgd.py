"""``mgpu bench sgd``: updates per second of the GPU SGD block kernel (``kernels/sgd.cu``), and
``mgpu bench sgd-seeds``: the gpu mode's MovieLens fit over several seeds.

Ratings are drawn on the GPU with power-law user and item degrees (Netflix's shape by
default: 480,189 users, 17,770 items, 100M ratings, the busiest user and item with about the
shares Netflix's have, 0.02% and 0.25%), factors of k columns; one timed pass visits every
rating once. The wavefront scheme (``mgpu.mf.gpu-scheme``'s default, :mod:`mgpu.mf.schedule`)
runs the ratings in its schedule, built once on the device (its seconds reported apart,
and its heaviest column group: a pass takes that group's ratings one after another, so the
pass's time over them bounds the time a warp spends on a rating);
the lock-free scheme visits them in a random order with the warps in flight bounded as
matrix factorisation bounds them (``mgpu.mf.gpu-conflicts``) or not at all. The bytes
column counts what a pass must move at least: the two factor rows read and written, the
rating and its two ids read.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np


def _draw(n: int, weights: Any, rng: Any) -> Any:
    import cupy

    cdf = cupy.cumsum(weights / weights.sum())
    return cupy.minimum(cupy.searchsorted(cdf, rng.random(n)), weights.size - 1).astype(
        cupy.int32)


def bench_gpu(n_users: int, n_items: int, n_ratings: int, ks: tuple[int, ...], *,
              conflicts: tuple[float | None, ...] = (None,), wavefront: bool = True,
              groups: tuple[int | None, ...] = (None,), depths: tuple[int | None, ...] = (None,),
              dtype: Any = np.float32, repeats: int = 5,
              seed: int = 0) -> list[dict[str, Any]]:
    """Median time of one pass of the SGD kernel over ``n_ratings`` ratings, per k: the
    wavefront scheme (``wavefront``; per grid size in ``groups``, None: the one the shape
    gives, :func:`mgpu.mf.schedule.wave_groups`, and per ratings in flight per warp in
    ``depths``, None: the kernel's default; depths a k lacks are left out) and the lock-free
    one per bound on conflicts."""
    import cupy

    from mgpu.backends.cupy_sgd import sgd_wave_gpu, wave_occupancy, wave_warps, warps_for
    from mgpu.backends.instances import SGD_KPL, wave_default_depth, wave_depths, wave_kernel
    from mgpu.backends.loader import c_type
    from mgpu.backends.timing import time_gpu
    from mgpu.mf.schedule import build_schedule
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
    schemes: list[tuple[str, Any, Any]] = [("wavefront", g, d) for g in groups
                                           for d in depths] if wavefront else []
    schemes += [("hogwild", c, None) for c in conflicts]
    staged: dict[Any, Any] = {("hogwild", c): (users, items, ratings, None) for c in conflicts}
    build_s, heaviest = {}, {}
    if wavefront:  # CuPy compiles the build's kernels on first use: not the build's time
        build_schedule(users[:4096], items[:4096], n_users, n_items, seed=seed)
    for g in groups if wavefront else ():  # built once, as a fit builds it once per block
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        order, sched = build_schedule(users, items, n_users, n_items, seed=seed, groups=g)
        staged["wavefront", g] = (users[order], items[order], ratings[order], sched)
        del order
        cupy.cuda.Device().synchronize()
        build_s[g] = time.perf_counter() - t0
        cells = cupy.diff(sched.offsets).reshape(sched.groups, sched.groups)
        heaviest[g] = int(cells.sum(axis=0).max())  # a column group's ratings: one chain
    for k, (scheme, c, depth) in ((k, sc) for k in ks for sc in schemes):
        t_kpl = (c_type(np.dtype(dtype)), next(w for w in SGD_KPL if k <= 32 * w))
        if depth is not None and depth not in wave_depths(*t_kpl):
            continue
        depth = depth or wave_default_depth(*t_kpl)  # the kernel's default
        P = (rng.random((n_users, k), dtype=np.float64) / np.sqrt(k)).astype(dtype)
        Q = (rng.random((n_items, k), dtype=np.float64) / np.sqrt(k)).astype(dtype)
        before = rmse(*host, P.get().astype(np.float64), Q.get().astype(np.float64))
        u, i, r, sched = staged[scheme, c]
        asked, c = (c, None) if sched is not None else (None, c)  # wavefront: G asked, no bound
        if sched is not None:
            def one_pass() -> None:
                sgd_wave_gpu(u, i, r, P, Q, 0.005, 0.05, 0.05, sched, depth=depth)
        else:
            def one_pass() -> None:
                sgd_block(u, i, r, P, Q, 0.005, 0.05, 0.05, conflicts=c)
        t = time_gpu(one_pass, repeats=repeats, warmup=1)
        after = rmse(*host, P.get().astype(np.float64), Q.get().astype(np.float64))
        item = np.dtype(dtype).itemsize
        moved = n_ratings * (4 * k * item + item + 8)
        occ = None
        if sched is not None:
            expr = wave_kernel(*t_kpl, depth)
            warps, occ = wave_warps(expr, sched.groups)[0], wave_occupancy(expr)
        else:
            warps = warps_for(users, items, n_users, n_items, c)
        out.append({"device": dev, "n_users": n_users, "n_items": n_items,
                    "n_ratings": n_ratings, "busiest_user_item": busiest, "k": k,
                    "dtype": np.dtype(dtype).name, "scheme": scheme, "conflicts": c,
                    "groups": sched.groups if sched is not None else None,
                    "schedule_s": build_s[asked] if sched is not None else None,
                    # the pass is at least this column group's ratings one after another
                    "heaviest_column": heaviest[asked] if sched is not None else None,
                    "depth": depth if sched is not None else None,
                    "warps": warps,
                    # what the residency rests on: blocks of 2 warps an SM (the driver's
                    # occupancy calculator), registers a thread, blocks those allow
                    "blocks_per_sm": occ.blocks_per_sm if occ else None,
                    "regs": occ.regs if occ else None,
                    "blocks_by_registers": occ.by_registers if occ else None,
                    "shared_bytes": occ.shared if occ else None,
                    "blocks_by_shared": occ.by_shared if occ else None,
                    "occupancy_source": occ.source if occ else None,
                    "median_s": t, "updates_per_s": n_ratings / t,
                    "gb_per_s": moved / t / 1e9,
                    "rmse_sample_before": before, "rmse_sample_after": after})
    return out


def _warps(r: dict[str, Any]) -> str:
    if r.get("blocks_per_sm") is None:
        return f"{r['warps']:,}"
    return (f"{r['warps']:,} ({r['occupancy_source']}: {r['blocks_per_sm']} blocks/SM; "
            f"{r['regs']} regs allow {r['blocks_by_registers']}, {r['shared_bytes']:,} B "
            f"shared {r['blocks_by_shared']})")


def _label(r: dict[str, Any]) -> str:
    if r.get("scheme") == "wavefront":
        chain = r["median_s"] / r["heaviest_column"] * 1e6 if r["heaviest_column"] else 0.0
        return (f"wavefront, {r['groups']:,}² cells, {r['depth']} in flight a warp (built in "
                f"{r['schedule_s']:.2f} s; heaviest column group {r['heaviest_column']:,} "
                f"ratings, the pass {chain:.2f} µs each)")
    return f"hogwild, bound {'none' if r['conflicts'] is None else r['conflicts']}"


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| device | ratings | users × items | k | dtype | scheme | warps | "
            "ms per pass | G updates/s | GB/s (factor rows read + written) | "
            "RMSE on 1M ratings: start → after the passes |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {r['device']} | {r['n_ratings']:,} | {r['n_users']:,} × "
                     f"{r['n_items']:,} | {r['k']} | {r['dtype']} | "
                     f"{_label(r)} | {_warps(r)} | "
                     f"{r['median_s'] * 1e3:.1f} | "
                     f"{r['updates_per_s'] / 1e9:.2f} | {r['gb_per_s']:.0f} | "
                     f"{r['rmse_sample_before']:.3f} → {r['rmse_sample_after']:.3f} |")
    return "\n".join(lines)


def movielens_seeds(train: Any, test: Any, seeds: tuple[int, ...], *, k: int = 128,
                    lr: float = 0.005, reg: float = 0.05, epochs: int = 80,
                    targets: tuple[float, ...] = (0.98, 0.91),
                    progress: Any = None) -> list[dict[str, Any]]:
    """The gpu mode of :class:`mgpu.mf.MatrixFactorization` fitted once per seed on the
    current cluster (at the configured ``mgpu.mf.gpu-scheme``), each stopped at the lowest
    of ``targets``: per seed the epochs to each target (None: not reached), the final and
    best test RMSE and the training seconds. ``progress(row)`` hears of each seed."""
    from mgpu.mf import MatrixFactorization

    rows = []
    for seed in seeds:
        mf = MatrixFactorization(k, lr=lr, reg=reg, epochs=epochs, mode="gpu", seed=seed,
                                 target_rmse=min(targets)).fit(train, test)
        h = mf.history_
        row: dict[str, Any] = {"seed": seed, "epochs": len(h), "final_rmse": h[-1]["test_rmse"],
                               "best_rmse": min(e["test_rmse"] for e in h),
                               "seconds": h[-1]["seconds"]}
        for target in targets:
            row[f"epochs_to_{target}"] = next((e["epoch"] for e in h
                                              if e["test_rmse"] <= target), None)
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


def seeds_markdown(rows: list[dict[str, Any]], targets: tuple[float, ...]) -> str:
    head = ("| seed | " + " | ".join(f"epochs to {t}" for t in targets)
            + " | epochs run | final test RMSE | best | training s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cells = [str(r[f"epochs_to_{t}"]) if r[f"epochs_to_{t}"] else "**not reached**"
                 for t in targets]
        lines.append(f"| {r['seed']} | " + " | ".join(cells) + f" | {r['epochs']} | "
                     f"{r['final_rmse']:.4f} | {r['best_rmse']:.4f} | {r['seconds']:.2f} |")
    for t in targets:
        hit = sum(r[f"epochs_to_{t}"] is not None for r in rows)
        lines.append(f"\ntarget {t}: reached in {hit} of {len(rows)} seeds")
    return "\n".join(lines)
