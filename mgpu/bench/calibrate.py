"""Calibrating HSGD*'s cost model on a cluster's CPU and GPU workers: ``mgpu calibrate``.

Picks a GPU worker and a CPU worker of the cluster (the embedded one: a GPU worker and a CPU
worker of ``cpu_threads`` threads where GPUs are visible, one CPU worker otherwise), cuts the
block window of the division HSGD* makes on those slots, and times block calls on it with
:func:`mgpu.mf.calibration.calibrate`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["calibrate_on_cluster", "netflix_sample"]


def netflix_sample(max_ratings: int) -> tuple[Any, str]:
    """Planted ratings of Netflix's shape, and their label."""
    from mgpu.synthetic import planted_ratings

    return (planted_ratings(480_189, 17_770, max_ratings, seed=0),
            "planted ratings 480,189×17,770")


def _connect(address: str | None, cpu_threads: int) -> Any:
    from mgpu.distributed.cluster import connect, visible_gpus

    if address is not None:
        return connect(address)
    if visible_gpus():  # a GPU worker and a CPU worker
        return connect(gpus=True, cpu_threads=cpu_threads)
    return connect(gpus=False, n_workers=1)


def calibrate_on_cluster(C: Any, k: int, *, address: str | None = None,
                         max_ratings: int = 4_000_000, repeats: int = 3, cpu_threads: int = 1,
                         started: Callable[[Any, str | None, str | None], None] | None = None
                         ) -> Any:
    """Calibrate the cost model on the ratings ``C`` (COO) with factors of ``k`` columns.

    ``started(window, cpu_worker, gpu_worker)`` hears which block window is timed on which
    workers before the timing starts. Returns the calibration (not yet cached).

    Raises
    ------
    ValueError
        ``k``, ``repeats`` or ``cpu_threads`` below 1, or ``max_ratings`` below 2.
    """
    from mgpu.distributed import describe_workers
    from mgpu.mf.calibration import block_window, calibrate
    from mgpu.mf.division import columns
    from mgpu.mf.model import gpu_options

    if k < 1 or max_ratings < 2 or repeats < 1 or cpu_threads < 1:
        raise ValueError("-k, --repeats and --cpu-threads must be >= 1, --max-ratings >= 2")
    client = _connect(address, cpu_threads)
    try:
        infos = describe_workers(client)
        gpu = next((a for a, i in infos.items() if i.get("gpu") and "error" not in i["gpu"]),
                   None)
        cpu = next((a for a, i in infos.items() if not i.get("gpu")), None)
        window = block_window(C.row, C.col, C.shape,
                              columns(int(gpu is not None), cpu_threads if cpu else 0),
                              want=min(max_ratings, 1 << 16))
        if started is not None:
            started(window, cpu, gpu)
        return calibrate(client, C.row, C.col, C.data, k, cpu_worker=cpu, gpu_worker=gpu,
                         gpu_kw=gpu_options(), max_ratings=max_ratings, repeats=repeats,
                         cpu_threads=cpu_threads, window=window)
    finally:
        client.close()
