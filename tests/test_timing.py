"""The GPU timing helpers of the benchmarks (mgpu.backends.timing): medians by CUDA events,
and timing in rounds, where every function is timed once a round."""
from __future__ import annotations

import time

import pytest


@pytest.mark.gpu
def test_rounds_time_each_function_apart_and_in_turn():
    import cupy

    from mgpu.backends.timing import time_gpu_rounds

    order = []
    x = cupy.ones(1 << 20, dtype=cupy.float32)

    def short():
        order.append("short")
        x.sum()

    def long():  # the host's 2 ms sit between the events: the stream waits for them
        order.append("long")
        time.sleep(0.002)
        x.sum()

    t = time_gpu_rounds({"short": short, "long": long}, repeats=5, warmup=1)
    assert set(t) == {"short", "long"}
    assert 0 < t["short"] < 0.001 and 0.002 <= t["long"] < 0.05
    assert order == ["short", "long"] * 6  # one warm-up round, then 5 rounds, in turn
