"""Timing helpers: warm-up, repeats, medians; CUDA events on the GPU (the benchmarks and the
SDDMM tuner)."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def time_cpu(fn: Callable[[], Any], *, repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_gpu(fn: Callable[[], Any], *, repeats: int = 10, warmup: int = 2) -> float:
    """Median time of ``fn()`` on the current CUDA stream in seconds (CUDA events)."""
    import cupy

    for _ in range(warmup):
        fn()
    cupy.cuda.Device().synchronize()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return statistics.median(times)


def time_gpu_rounds(fns: dict[str, Callable[[], Any]], *, repeats: int = 10,
                    warmup: int = 2) -> dict[str, float]:
    """Median time of each of ``fns`` on the current CUDA stream in seconds (CUDA events),
    timed in rounds: a round times every function once, in turn. Calls of tens of
    microseconds are at the mercy of the machine's state (the device's clocks, the host's
    load), which can stay off for a whole series; in rounds such a stretch falls on every
    function alike, so their ratios hold where separate series would not."""
    import cupy

    for _ in range(warmup):
        for fn in fns.values():
            fn()
    cupy.cuda.Device().synchronize()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times[name].append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def warm_device(seconds: float = 0.25) -> None:
    """Keep the current GPU busy for ``seconds``, so that the calls timed next run at its
    working clocks: an idle GPU (as after seconds of kernel compilation and tuning) sits at
    its lowest clocks, and calls that wait for the device after a few microseconds of work
    each do not raise them quickly."""
    import cupy

    x = cupy.ones(1 << 24, dtype=cupy.float32)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            x *= 1.0000001
        cupy.cuda.get_current_stream().synchronize()
