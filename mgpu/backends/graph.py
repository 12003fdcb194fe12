"""A fixed sequence of GPU launches captured once as a CUDA graph and replayed.

An iterative method on a small problem (GradientMF on a ratings file of 10⁵ entries) spends its GPU
step launching kernels, not running them: a dozen launches from Python cost more than their
work. Captured as one CUDA graph, the step is one launch. Imported only with CuPy.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cupy

__all__ = ["Replay"]


class Replay:
    """``fn()``'s launches captured as one CUDA graph on ``stream``, then replayed.

    Each call launches the graph on ``stream`` (no wait) and returns what ``fn()`` returned
    at capture: the same arrays, overwritten by the replay. Capturing runs nothing, so
    ``fn`` must have run once before (kernels compiled, plans tuned). Work on another stream
    is not ordered with the replay: read the results on ``stream``, or after
    ``stream.synchronize()``, and have the inputs ready before the call.

    ``fn`` must only launch work: no wait on the device and no copy to the host (the capture
    fails with an error saying so). It reads its inputs at fixed addresses, so they are to be
    updated in place between calls. The memory it allocates comes from a pool of this
    object's own, kept as long as the object lives: every replay writes to those addresses
    again, and no other allocation may be handed them in between.
    """

    def __init__(self, fn: Callable[[], Any], stream: cupy.cuda.Stream) -> None:
        self._pool = cupy.cuda.MemoryPool()
        self._stream = stream
        with cupy.cuda.using_allocator(self._pool.malloc), stream:
            stream.begin_capture()
            try:
                out = fn()
            except BaseException:
                try:
                    stream.end_capture()
                except Exception:  # the failed call may have invalidated the capture
                    pass
                raise
            self._graph = stream.end_capture()
        self.out = out

    def __call__(self) -> Any:
        self._graph.launch(self._stream)
        return self.out
