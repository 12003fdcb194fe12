"""What the current GPU can still hold, and the refusal when an operation would need more.

An operation that knows what it will allocate asks :func:`require_gpu` first, so that a
problem too large for the device ends in :class:`DeviceMemoryError` naming both numbers,
before any of it is allocated, never in CUDA's out-of-memory error halfway through.

CuPy is imported only when a GPU is asked about.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

from dask.utils import format_bytes

__all__ = ["DeviceMemoryError", "gpu_available", "require_gpu", "require_gpu_unless_small",
           "small_request"]

# A request of at most this much, and at most 1/256 of the device (or of the pool's limit),
# is not asked of the device before it is allocated (require_gpu_unless_small).
_SMALL_BYTES = 64 << 20
_SMALL_SHARE = 256


class DeviceMemoryError(MemoryError):
    """An operation needs more GPU memory than the device has available (raised before any
    of it is allocated)."""


def gpu_available() -> tuple[int, int]:
    """``(available, capacity)`` in bytes on the current device for this process.

    Available: the device's free memory plus what CuPy's memory pool holds unused, within
    the pool's limit when one is set (``cupy.get_default_memory_pool().set_limit``).
    Capacity: the device's memory, or the pool's limit when that is smaller.
    """
    import cupy

    free, total = cupy.cuda.runtime.memGetInfo()
    pool = cupy.get_default_memory_pool()
    available = int(free) + int(pool.free_bytes())
    limit = int(pool.get_limit())
    if limit:
        available = min(available, limit - int(pool.used_bytes()))
        total = min(int(total), limit)
    return max(0, available), int(total)


def require_gpu(nbytes: int, what: str, hint: str = "") -> int | None:
    """Raise :class:`DeviceMemoryError` unless ``nbytes`` more fit on the current device;
    return the bytes available (before the ``nbytes``), or None while a CUDA graph is being
    captured (nothing is asked of the device then).

    ``what`` names the operation and its operands ("SDDMM of S 3×4 with 12 nonzeros");
    ``hint`` says what to do instead.
    """
    import cupy

    if cupy.cuda.get_current_stream().is_capturing():
        return None  # no query of the device in the middle of a capture
    available, capacity = gpu_available()
    if nbytes > available:
        dev = cupy.cuda.runtime.getDevice()
        raise DeviceMemoryError(
            f"{what} needs {format_bytes(int(nbytes))} of GPU memory on device {dev}; "
            f"{format_bytes(available)} of its {format_bytes(capacity)} are available."
            + (f" {hint}" if hint else "")
        )
    return available


@functools.lru_cache(maxsize=None)
def _device_bytes(device: int) -> int:
    import cupy

    return int(cupy.cuda.runtime.getDeviceProperties(device)["totalGlobalMem"])


def small_request(nbytes: int) -> bool:
    """Whether ``nbytes`` is small enough not to ask the current device before allocating
    it: at most 64 MiB and at most 1/256 of the device's memory (or of the CuPy pool's
    limit, when one is set). Only a device already all but full could fail such a
    request, and then with CuPy's own out-of-memory error; the query it saves
    (``cudaMemGetInfo``, a few microseconds) is a large part of a small call."""
    import cupy

    cap = _device_bytes(cupy.cuda.runtime.getDevice())
    limit = int(cupy.get_default_memory_pool().get_limit())
    if limit:
        cap = min(cap, limit)
    return nbytes <= min(_SMALL_BYTES, cap // _SMALL_SHARE)


def require_gpu_unless_small(nbytes: int, what: str | Callable[[], str],
                             hint: str = "") -> None:
    """:func:`require_gpu` for a request that is not :func:`small_request`; ``what`` may be
    a callable, so that its words are made only for a request that is asked about."""
    if small_request(nbytes):
        return
    require_gpu(nbytes, what() if callable(what) else what, hint)
