"""The finiteness flag of the checked GPU calls (SDDMM, SpMV, SpMM): set on the device, read
with the result after the call's one wait, with no copy back.

A checked call takes a flag (:func:`device_flag`), launches ``kernels/flags.cu`` over the
operands' values (:func:`flag_nonfinite`, one launch for up to three arrays of a dtype)
beside its own kernels, and reads the flag once those kernels are done
(:meth:`Flag.raised`: one wait on the call's stream). Only a raised flag makes the caller
look for the first bad position, on its slow path.

The flags are 4-byte slots of a page of pinned host memory mapped into every device's
address space (``cudaHostAlloc`` with ``cudaHostAllocMapped | cudaHostAllocPortable``): a
kernel writes the slot across the bus, the host reads it as ordinary memory after the
wait, so there is neither a device allocation, nor a memset, nor a device-to-host copy per
call. A slot is zeroed by the host when it is taken and goes back to the free list only
after the wait on its stream, so no kernel of an earlier call can still write to it: a
failed call (a raised flag, or an error between the launch and the wait) never leaks a
raised slot into the next call. Calls on several streams or threads hold different slots.

Imported only with CuPy (by the GPU backends).
"""
from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Sequence
from typing import Any

import cupy
import numpy as np

from mgpu.backends.instances import INSTANCES
from mgpu.backends.launch import launcher
from mgpu.backends.loader import c_type

__all__ = ["Flag", "device_flag", "flag_csr", "flag_nonfinite"]

_FLAGS = "flags.cu"
_FLAGS_INSTANCES = INSTANCES[_FLAGS]
_SLOTS = 1024  # int32 flags in one page of pinned memory; another page if they are all taken
_THREADS = 256
_BLOCKS_PER_SM = 8  # resident blocks of 256 threads on an SM: the grid-stride loop's width


class _Page:
    """One page of pinned, mapped host memory cut into int32 flag slots."""

    def __init__(self) -> None:
        rt = cupy.cuda.runtime
        self.ptr = rt.hostAlloc(4 * _SLOTS, rt.hostAllocMapped | rt.hostAllocPortable)
        self.values = np.ctypeslib.as_array((ctypes.c_int32 * _SLOTS).from_address(self.ptr))
        self.values[:] = 0
        self.free = list(range(_SLOTS - 1, -1, -1))  # LIFO: the slot just freed is in cache
        self._device_ptr: dict[int, int] = {}

    def device_ptr(self, device: int) -> int:
        """The page's address in ``device``'s kernels (the host address under unified
        addressing, as the driver reports it)."""
        ptr = self._device_ptr.get(device)
        if ptr is None:
            ptr = int(cupy.cuda.runtime.pointerGetAttributes(self.ptr).devicePointer) or self.ptr
            self._device_ptr[device] = ptr
        return ptr


_pages: list[_Page] = []
_lock = threading.Lock()


class Flag:
    """One flag slot taken for one call (:func:`device_flag`), a context manager that
    gives it back: ``addr`` (int) is its device address, for :mod:`mgpu.backends.launch`;
    ``ptr`` the same as a numpy uint64, for CuPy's launches; :meth:`raised` waits for the
    call's stream and reads it."""

    __slots__ = ("_page", "_slot", "_stream", "addr", "_read")

    def __init__(self, page: _Page, slot: int, stream: Any, device: int) -> None:
        self._page, self._slot, self._stream = page, slot, stream
        self.addr = page.device_ptr(device) + 4 * slot
        self._read: bool | None = None

    @property
    def ptr(self) -> np.uint64:
        return np.uint64(self.addr)

    def raised(self) -> bool:
        """Whether a kernel raised the flag: waits for everything queued so far on the stream
        the flag was taken on (the one wait of a checked call), then reads it; later calls
        return the same answer without waiting again."""
        if self._read is None:
            self._stream.synchronize()
            self._read = bool(self._page.values[self._slot])
        return self._read

    def __enter__(self) -> Flag:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        _give_back(self, quiet=exc_type is not None)


def device_flag() -> Flag:
    """A zeroed flag for one checked call on the current device and stream, to use in a
    ``with`` block: it is given back when the block ends, at once when :meth:`Flag.raised`
    was read, else after a wait on the stream (an error between the launches and the
    read), so that no kernel still writes to the slot when the next call takes it."""
    device = cupy.cuda.runtime.getDevice()
    stream = cupy.cuda.get_current_stream()
    try:  # nearly always: a slot of the first page (list.pop is atomic: no lock)
        page = _pages[0]
        slot = page.free.pop()
    except IndexError:  # no page yet, or the first one's slots all held
        with _lock:
            while True:
                page = next((p for p in _pages if p.free), None)
                if page is None:  # more calls in flight than slots: a new page
                    page = _Page()
                    _pages.append(page)
                try:
                    slot = page.free.pop()
                    break
                except IndexError:  # taken by a call on the fast path meanwhile
                    continue
    page.values[slot] = 0  # visible to the device before the launches that follow
    return Flag(page, slot, stream, device)


def _give_back(flag: Flag, quiet: bool) -> None:
    """The slot back to its page's free list once no kernel can write to it: after the
    read, or after a wait on its stream. ``quiet``: an error of that wait is not raised
    (another error is on its way), and the slot stays out of use."""
    if flag._read is None:
        try:
            flag._stream.synchronize()
        except Exception:
            if not quiet:
                raise
            return
    flag._page.free.append(flag._slot)  # atomic: no lock


@functools.lru_cache(maxsize=None)
def _max_blocks(device: int) -> int:
    rt = cupy.cuda.runtime
    # 16: cudaDevAttrMultiProcessorCount, where CuPy does not export the name
    sms = rt.deviceGetAttribute(getattr(rt, "cudaDevAttrMultiProcessorCount", 16), device)
    return int(sms) * _BLOCKS_PER_SM


# mgpu_flag_nonfinite's arguments (mgpu.backends.launch): three (array, size) pairs, the flag
_SIGNATURE = "pqpqpqp"


def flag_nonfinite(arrays: Sequence[cupy.ndarray], flag: Flag) -> None:
    """Launch the check of every value of ``arrays`` (float32 or float64; other dtypes hold
    no NaN and are skipped; a strided array is copied first) on the current stream:
    ``flag`` is raised when any holds NaN or infinity. One launch per dtype, for up to
    three arrays each."""
    by_dtype: dict[np.dtype, list[cupy.ndarray]] = {}
    for a in arrays:
        if a.size and a.dtype.kind == "f":
            by_dtype.setdefault(a.dtype, []).append(
                a if a.flags.c_contiguous else cupy.ascontiguousarray(a))
    for dtype, group in by_dtype.items():
        launch = launcher(_FLAGS, f"mgpu_flag_nonfinite<{c_type(dtype)}>", _FLAGS_INSTANCES,
                          _SIGNATURE)
        for s in range(0, len(group), 3):
            part = group[s:s + 3]
            args: list[int] = []
            for a in part:
                args += [a.data.ptr, a.size]
            args += [0, 0] * (3 - len(part))
            n = sum(int(a.size) for a in part)
            blocks = min(-(-n // _THREADS), _max_blocks(cupy.cuda.runtime.getDevice()))
            launch((blocks,), (_THREADS,), (*args, flag.addr))


def flag_csr(X: Any, flag: Flag) -> None:
    """Launch the check of a cupyx CSR matrix ``X`` (int32 index arrays, float32 or float64
    values) on the current stream: ``flag`` is raised when its row pointers do not run
    from 0 to nnz without decreasing, a column index is outside [0, n), or a value is NaN
    or infinite. One launch."""
    rows, cols = X.shape
    n = max(rows, X.nnz, 1)
    blocks = min(-(-n // _THREADS), _max_blocks(cupy.cuda.runtime.getDevice()))
    launch = launcher(_FLAGS, f"mgpu_flag_csr<{c_type(X.dtype)}>", _FLAGS_INSTANCES, "pqppqqp")
    launch((blocks,), (_THREADS,), (X.indptr.data.ptr, rows, X.indices.data.ptr,
                                    X.data.data.ptr, X.nnz, cols, flag.addr))
