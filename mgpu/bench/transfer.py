"""``mgpu bench transfer``: one array moved between two workers by Dask, over TCP and UCX.

The data that stays in Dask (a tile sent to another worker, a result gathered) moves between
workers through Dask's comms: over TCP a GPU buffer goes through host memory on both sides;
over UCX (``mgpu.connect(protocol="ucx")``) it can go over NVLink or InfiniBand directly. This
measures one such move as the workers see it.

Each repeat makes a fresh array of random values on the first worker (a new key, so the
second worker has no replica yet), then runs a task on the second worker that needs it. The
second worker's own record of the fetch (``Worker.transfer_incoming_log``: the comm read and
the deserialisation) gives the transfer's seconds; the task's round trip from the client
(submit to result, the transfer included) is reported beside it. The task returns a sample
sum that is checked against the sender's, so a move that changed the data is an error, not a
number.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from mgpu.distributed import connect, workers_now

__all__ = ["bench_transfer", "transfer_markdown"]

_STRIDE = 4099  # elements between the samples the checksum reads


def _make(n: int, seed: int, gpu: bool) -> Any:
    """``n`` float32 random values, on the worker's GPU (CuPy) or in host memory."""
    if gpu:
        import cupy

        x = cupy.random.default_rng(seed).random(n, dtype=cupy.float32)
        cupy.cuda.get_current_stream().synchronize()
        return x
    return np.random.default_rng(seed).random(n, dtype=np.float32)


def _checksum(x: Any) -> float:
    return float(x[::_STRIDE].astype("float64").sum())


def _describe(x: Any) -> tuple[float, str]:
    """The sample sum of ``x`` and the library of its array (numpy or cupy)."""
    return _checksum(x), type(x).__module__.split(".")[0]


def _use_rmm_pool(nbytes: int) -> None:
    """On a GPU worker: an RMM pool of ``nbytes`` for CuPy and for what UCX receives, so that
    UCX maps the pool between two workers once rather than every new buffer (dask-cuda's
    advice for NVLink)."""
    import cupy
    import rmm
    from rmm.allocators.cupy import rmm_cupy_allocator

    rmm.reinitialize(pool_allocator=True, initial_pool_size=nbytes)
    cupy.cuda.set_allocator(rmm_cupy_allocator)


def _fetched(dask_worker: Any, key: str) -> float | None:
    """Seconds this worker spent fetching ``key`` from another worker (its last record)."""
    found = [e["duration"] for e in dask_worker.transfer_incoming_log
             if key in e.get("keys", {})]
    return found[-1] if found else None


def _one(client: Any, src: str, dst: str, n: int, seed: int, gpu: bool) -> dict[str, Any]:
    """Make an array on ``src``, then time a task on ``dst`` that needs it."""
    pin = {"allow_other_workers": False, "pure": False}
    x = client.submit(_make, n, seed, gpu, workers=[src], **pin)
    want, kind = client.submit(_describe, x, workers=[src], **pin).result()
    t0 = time.perf_counter()
    got = client.submit(_checksum, x, workers=[dst], **pin).result()
    wall = time.perf_counter() - t0
    if not got == want:  # NaN too
        raise RuntimeError(f"the array moved from {src} to {dst} changed on the way: sample "
                           f"sum {got!r}, sent {want!r}")
    fetch = client.run(_fetched, key=x.key, workers=[dst])[dst]
    if fetch is None:
        raise RuntimeError(f"{dst} ran the task without fetching the array from {src}: "
                           "nothing was moved")
    return {"transfer_s": fetch, "wall_s": wall, "kind": kind}


def bench_transfer(nbytes: int, protocols: tuple[str, ...], *, gpu: bool, repeats: int = 5,
                   rmm_pool: int | None = None,
                   progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """One row per protocol: the median GB/s of moving ``nbytes`` of float32 between two
    workers of an embedded cluster speaking that protocol (two GPU workers with ``gpu``,
    else two CPU worker processes), over ``repeats`` moves after one warm-up move (which
    opens the connection between the two workers). ``rmm_pool``: bytes of an RMM pool on
    each GPU worker, for every protocol alike."""
    n = max(1, nbytes // 4)
    rows = []
    for protocol in protocols:
        t0 = time.perf_counter()
        with connect(gpus=gpu, n_workers=2, protocol=protocol) as client:
            src, dst = sorted(workers_now(client))[:2]
            scheme = client.scheduler.address.split("://")[0]
            if rmm_pool:
                client.run(_use_rmm_pool, rmm_pool)
            if progress:
                progress(f"{protocol}: cluster at {client.scheduler.address} up in "
                         f"{time.perf_counter() - t0:.1f} s")
            _one(client, src, dst, n, 0, gpu)
            runs = [_one(client, src, dst, n, 1 + i, gpu) for i in range(repeats)]
        gbps = [4 * n / r["transfer_s"] / 1e9 for r in runs]
        wall = [4 * n / r["wall_s"] / 1e9 for r in runs]
        rows.append({"protocol": protocol, "scheme": scheme, "array": runs[0]["kind"],
                     "bytes": 4 * n, "repeats": repeats, "rmm_pool": rmm_pool,
                     "gbps": statistics.median(gbps),
                     "gbps_min": min(gbps), "gbps_max": max(gbps),
                     "task_gbps": statistics.median(wall),
                     "transfer_s": [r["transfer_s"] for r in runs],
                     "wall_s": [r["wall_s"] for r in runs]})
        if progress:
            progress(f"{protocol}: {rows[-1]['gbps']:.2f} GB/s (median of {repeats})")
    return rows


def transfer_markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table, with each protocol's speed against the first's."""
    base = rows[0]["gbps"] if rows else 0.0
    lines = ["| protocol | array | size | transfer GB/s (median) | min–max | task round trip "
             "GB/s | vs " + (rows[0]["protocol"] if rows else "-") + " |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['protocol']} ({r['scheme']}://) | {r['array']} | "
                     f"{r['bytes'] / 1e9:.3g} GB | {r['gbps']:.2f} | {r['gbps_min']:.2f}–"
                     f"{r['gbps_max']:.2f} | {r['task_gbps']:.2f} | "
                     f"{r['gbps'] / base if base else float('nan'):.2f}× |")
    return "\n".join(lines)
