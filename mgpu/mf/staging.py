"""Ratings and factor segments on a GPU worker's device: staging a block once, pinned host
copies of what a call updated, and one block of the GPUs-alone division timed.

These run on GPU workers only: a block host (:mod:`mgpu.mf.hosts`) stages its GPU's blocks
and copies its results back with them, the calibration (:mod:`mgpu.mf.calibration`) times
its GPU prefixes with them, and :class:`mgpu.mf.MatrixFactorization` prices the GPUs alone
with :func:`time_alone_block`. This module imports none of those, so they all import it.
CuPy is imported inside each function: ``import mgpu`` never imports it.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from mgpu.mf.schedule import SCHEMES, WaveSchedule, build_schedule, check_scheme
from mgpu.mf.sgd import sgd_block

__all__ = ["SCHEMES", "host_copy", "run_staged", "stage_block", "time_alone_block"]


def stage_block(block: tuple[np.ndarray, np.ndarray, np.ndarray], dtype: Any, seed: int,
                scheme: str = "wavefront") -> tuple[Any, Any, Any, WaveSchedule | None]:
    """A block's ratings on the GPU, ordered once for every pass.

    ``scheme="wavefront"`` (``mgpu.mf.gpu-scheme``'s default): in the order of the block's
    wavefront schedule (:func:`mgpu.mf.schedule.build_schedule`, built here on the device,
    once; the same as one built on the host), which the returned schedule runs.
    ``"hogwild"``: in a random order drawn once, as cuMF_SGD shuffles once (thousands of
    warps in flight reorder the updates anyway).

    Parameters
    ----------
    block : tuple of ndarray of shape (n_ratings,)
        The block's users, items (local ids) and ratings, on the host.
    dtype : numpy dtype
        The ratings' dtype on the device (the factors').
    seed : int
        Seed of the order (and of the schedule's passes).
    scheme : {'wavefront', 'hogwild'}, default='wavefront'

    Returns
    -------
    users, items, ratings : cupy.ndarray of shape (n_ratings,)
        int32 ids and ``dtype`` ratings on the current device, in the staged order.
    schedule : WaveSchedule or None
        The wavefront schedule (its offsets on the device), None for ``"hogwild"``.
    """
    import cupy

    check_scheme(scheme)
    users, items, ratings = block
    schedule = None
    if scheme == "wavefront":  # built on the device: its sort takes milliseconds there
        n_users = int(users.max()) + 1 if users.size else 0
        n_items = int(items.max()) + 1 if items.size else 0
        u, i = cupy.asarray(users, dtype=cupy.int64), cupy.asarray(items, dtype=cupy.int64)
        order, schedule = build_schedule(u, i, n_users, n_items, seed=seed)
        return (u[order].astype(cupy.int32), i[order].astype(cupy.int32),
                cupy.asarray(ratings, dtype=dtype)[order], schedule)
    order = np.random.default_rng(seed).permutation(users.shape[0])
    return (cupy.asarray(users[order].astype(np.int32)),
            cupy.asarray(items[order].astype(np.int32)),
            cupy.asarray(ratings[order].astype(dtype)), schedule)


def run_staged(staged: tuple[Any, Any, Any, WaveSchedule | None], P: Any, Q: Any, lr: float,
               reg_p: float, reg_q: float, gpu_kw: dict[str, Any]) -> None:
    """One pass of SGD over a block staged by :func:`stage_block`, by its scheme: the
    wavefront schedule's next pass, or the lock-free pass under ``gpu_kw``'s
    ``conflicts``; ``gpu_kw``'s ``max_warps`` caps either (``scheme`` is the staging's)."""
    users, items, ratings, schedule = staged
    kw = {key: v for key, v in gpu_kw.items() if key != "scheme"}
    if schedule is not None:
        kw.pop("conflicts", None)  # a schedule has no collisions to bound
    sgd_block(users, items, ratings, P, Q, lr, reg_p, reg_q, schedule=schedule, **kw)


def host_copy(a: Any) -> np.ndarray:
    """A device array's host copy, in pinned memory (CuPy's pinned pool).

    The copy is the GPU's DMA, not a staging copy by a CPU core that the CPU slots keep
    busy: with every CPU thread running SGD beside it, a pageable copy waits for a core and
    a GPU call takes markedly longer.

    Parameters
    ----------
    a : cupy.ndarray

    Returns
    -------
    ndarray
        Of ``a``'s shape and dtype, backed by pinned memory.
    """
    import cupyx

    out = cupyx.empty_pinned(a.shape, a.dtype)
    a.get(out=out)
    return out


def time_alone_block(users: np.ndarray, items: np.ndarray, ratings: np.ndarray, n_users: int,
                     n_items: int, k: int, dtype: str, gpu_kw: dict[str, Any],
                     repeats: int = 2) -> dict[str, float]:
    """Runs on a GPU worker: a block of the GPUs-alone division timed as an epoch runs it.

    A share of a block costs about the block's time per rating: it touches the same rows,
    drawn as often relative to each other, so the device's caches see the same footprint.
    The curves of :func:`mgpu.mf.calibration.calibrate`, fitted on prefixes of one stratum
    of the division with CPU slots, can price this larger block too fast (they extrapolate
    past the sizes measured); the kernel runs the division's own smaller blocks no faster
    per rating than this one, so the rate measured here also bounds theirs
    (:meth:`mgpu.mf.calibration.Calibration.predictor`'s ``floor``).

    Parameters
    ----------
    users, items, ratings : ndarray of shape (n_ratings,)
        Local ids and ratings of (a random share of) one of the division's blocks.
    n_users, n_items : int
        Rows of the block's user and item segments.
    k : int
        Latent factors.
    dtype : str
        The factors' dtype.
    gpu_kw : dict
        The GPU's keywords of :func:`mgpu.mf.sgd.sgd_block`.
    repeats : int, default=2
        Timed passes, after an untimed one.

    Returns
    -------
    dict
        ``per_rating_s``: the kernel's seconds per rating (mean over the timed passes);
        ``copy_s``: seconds to copy both segments back to the host.
    """
    import cupy

    if users.size == 0:
        return {"per_rating_s": 0.0, "copy_s": 0.0}
    rng = np.random.default_rng(users.size)
    staged = stage_block((users, items, ratings), np.dtype(dtype), 0,
                         gpu_kw.get("scheme", "wavefront"))
    P = cupy.asarray(rng.random((n_users, k)) / np.sqrt(k), dtype=dtype)
    Q = cupy.asarray(rng.random((n_items, k)) / np.sqrt(k), dtype=dtype)
    stream = cupy.cuda.get_current_stream()
    times = []
    for rep in range(repeats + 1):
        stream.synchronize()
        t0 = time.perf_counter()
        run_staged(staged, P, Q, 0.005, 0.05, 0.05, gpu_kw)
        stream.synchronize()
        if rep:
            times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    host_copy(P)
    host_copy(Q)
    return {"per_rating_s": float(np.mean(times)) / users.size,
            "copy_s": time.perf_counter() - t0}
