"""Kernel launches for the hot small calls, with the arguments packed by one ``struct`` call.

CuPy's own launch (``RawKernel.__call__``) looks at every argument's type, boxes each value
in a new object and builds a new pointer array on every call: some microseconds for a
kernel of a dozen arguments, a large part of a product of a few tens of microseconds. A
:class:`Launcher` is made once per kernel, device and signature: it holds an argument buffer
with one 8-byte slot per argument and the array of the slots' addresses that
``cuLaunchKernel`` reads (``kernelParams``), both made once. A launch writes the call's
values into the slots with one precompiled ``struct.Struct.pack_into`` and calls
``cupy.cuda.driver.launchKernel`` on the current stream.

The signature says each argument's C type, one letter each (:data:`KINDS`): ``p`` a pointer
(a device address as a Python int, 0 for null), ``i`` int, ``q`` long long, ``f`` float,
``d`` double. The driver copies as many bytes from each slot as the kernel's parameter
takes (it knows the parameter sizes from the compiled kernel); a 4-byte value sits in the
first four bytes of its slot (little-endian), padded with zeros. A value that does not fit
its type (an int past int32's range, a negative address) or is not a number (a cupy array
passed where its address belongs) makes ``pack_into`` raise, never a silent truncation;
see :func:`address` for arrays.

A launch repeated with the same sizes (a plan's) is held as a :class:`PreparedLaunch`
(:meth:`Launcher.prepare`): grid, block and every argument but the few device addresses that
change from call to call are packed once into a buffer of its own; a call writes those
addresses into their slots and launches.

Imported without CuPy: :func:`layout` is pure (the CPU tests check it); CuPy is imported
when a launcher is made.
"""
from __future__ import annotations

import ctypes
import struct
import threading
from typing import Any

__all__ = ["KINDS", "SLOT", "Launcher", "PreparedLaunch", "address", "launcher", "layout"]

SLOT = 8  # bytes per argument: the largest parameter these kernels take (a pointer, 64-bit)

# signature letter -> (struct code of the value, its size in bytes)
KINDS: dict[str, tuple[str, int]] = {
    "p": ("Q", 8),  # a pointer (unsigned 64-bit address)
    "q": ("q", 8),  # long long
    "i": ("i", 4),  # int
    "f": ("f", 4),  # float
    "d": ("d", 8),  # double
}


def layout(signature: str) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
    """The ``struct`` format that packs ``signature``'s values into their slots
    (little-endian, no alignment of its own: each value at the start of its 8-byte slot,
    zeros after a 4-byte one), and each argument's offset and size in bytes."""
    fmt, offsets, sizes = ["<"], [], []
    for i, kind in enumerate(signature):
        if kind not in KINDS:
            raise ValueError(f"argument {i} of kernel signature {signature!r} is {kind!r}; "
                             f"expected one of {''.join(KINDS)}")
        code, size = KINDS[kind]
        fmt.append(code + (f"{SLOT - size}x" if size < SLOT else ""))
        offsets.append(i * SLOT)
        sizes.append(size)
    return "".join(fmt), tuple(offsets), tuple(sizes)


def address(a: Any) -> int:
    """The device address of a cupy array's first element (0 for None): the value of a
    ``p`` argument."""
    return 0 if a is None else a.data.ptr


class Launcher:
    """One kernel on one device with its argument slots (see the module's text); call it as
    ``launcher(grid, block, args, shared_mem=0)``, ``grid`` and ``block`` tuples of up to
    three ints, ``args`` the values in the signature's order, on the current stream.
    Thread-safe: the slots are written and launched under a lock (the driver copies them at
    the launch). ``launch`` and ``current_stream`` stand for
    ``cupy.cuda.driver.launchKernel`` and ``cupy.cuda.get_current_stream`` (the defaults)."""

    __slots__ = ("function", "signature", "_ptr", "_pack", "_buf", "_params", "_params_addr",
                 "_lock", "_launch", "_stream", "_driver")

    def __init__(self, function: Any, signature: str, *, launch: Any = None,
                 current_stream: Any = None) -> None:
        fmt, offsets, _ = layout(signature)
        self._driver = launch is None  # the driver's launch: needs a context in the thread
        if launch is None or current_stream is None:
            import cupy
            from cupy.cuda import driver

            launch = driver.launchKernel if launch is None else launch
            if current_stream is None:
                current_stream = cupy.cuda.get_current_stream
        self.function = function  # a cupy.cuda.Function: keeps its module loaded
        self.signature = signature
        self._ptr = int(function.ptr)
        self._pack = struct.Struct(fmt)
        n = max(1, len(signature))
        self._buf = (ctypes.c_uint64 * n)()  # 8-byte aligned, zeroed
        base = ctypes.addressof(self._buf)
        self._params = (ctypes.c_void_p * n)(*(base + o for o in offsets))
        self._params_addr = ctypes.addressof(self._params)
        self._lock = threading.Lock()
        self._launch, self._stream = launch, current_stream

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple,
                 shared_mem: int = 0) -> None:
        gx, gy, gz = (*grid, 1, 1)[:3]
        bx, by, bz = (*block, 1, 1)[:3]
        if self._driver and not getattr(_thread, "bound", False):
            _bind_context()
        stream = self._stream().ptr
        with self._lock:
            self._pack.pack_into(self._buf, 0, *args)
            self._launch(self._ptr, gx, gy, gz, bx, by, bz, shared_mem, stream,
                         self._params_addr, 0)

    def prepare(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple,
                free: tuple[int, ...], shared_mem: int = 0) -> PreparedLaunch:
        """This kernel's launch with ``grid``, ``block`` and ``args`` packed once into a
        buffer of its own, all but the arguments at positions ``free`` (pointers, ``p``,
        each written by every call: their values in ``args`` are placeholders)."""
        for i in free:
            if not 0 <= i < len(self.signature) or self.signature[i] != "p":
                raise ValueError(f"argument {i} of kernel signature {self.signature!r} cannot "
                                 "change per call: only pointers ('p') do")
        return PreparedLaunch(self, grid, block, args, free, shared_mem)


class PreparedLaunch:
    """One launch of a :class:`Launcher`'s kernel with its grid, block, shared memory and
    most arguments fixed (:meth:`Launcher.prepare`): its own argument buffer and address
    table, packed once. A call, ``prepared(v0, v1, ...)``, writes the device addresses of
    the ``free`` arguments, in their order, into their slots (one item assignment each:
    no ``struct`` call, no tuple of every argument) and launches on the current stream.
    An address must be a non-negative int below 2**64 (a device pointer, 0 for null).
    Thread-safe, as the launcher: the slots are written and launched under a lock."""

    __slots__ = ("launcher", "free", "_buf", "_params", "_params_addr", "_lock", "_dims",
                 "_smem")

    def __init__(self, launcher: Launcher, grid: tuple[int, ...], block: tuple[int, ...],
                 args: tuple, free: tuple[int, ...], shared_mem: int = 0) -> None:
        fmt, offsets, _ = layout(launcher.signature)
        n = max(1, len(launcher.signature))
        self.launcher = launcher  # keeps the kernel's module loaded
        self.free = tuple(free)
        self._buf = (ctypes.c_uint64 * n)()
        struct.Struct(fmt).pack_into(self._buf, 0, *args)
        base = ctypes.addressof(self._buf)
        self._params = (ctypes.c_void_p * n)(*(base + o for o in offsets))
        self._params_addr = ctypes.addressof(self._params)
        self._lock = threading.Lock()
        self._dims = (*(*grid, 1, 1)[:3], *(*block, 1, 1)[:3])
        self._smem = int(shared_mem)

    def __call__(self, *addresses: int) -> None:
        L = self.launcher
        if L._driver and not getattr(_thread, "bound", False):
            _bind_context()
        stream = L._stream().ptr
        buf = self._buf
        with self._lock:
            for i, a in zip(self.free, addresses, strict=True):
                buf[i] = a  # an int, else TypeError (an array passed for its address)
                if a < 0:  # c_uint64 would take it modulo 2**64
                    raise ValueError(f"argument {i}: a negative device address ({a})")
            L._launch(L._ptr, *self._dims, self._smem, stream, self._params_addr, 0)


_launchers: dict[tuple, Launcher] = {}
_thread = threading.local()  # .bound: this thread has the device's context current
_lock = threading.Lock()


def _bind_context() -> None:
    """Make the current device's primary context current in this thread: the driver's
    launch needs one, and a thread that has made no runtime call yet (a Dask worker's
    thread, say) has none, where CuPy's own launch would have bound it."""
    from cupy.cuda import runtime

    runtime.setDevice(runtime.getDevice())
    _thread.bound = True


def launcher(name: str, expression: str, name_expressions: tuple[str, ...],
             signature: str, declared: Any = None) -> Launcher:
    """The :class:`Launcher` of ``kernels/<name>``'s ``expression`` on the current device
    (compiled with ``name_expressions`` by :func:`mgpu.backends.loader.get_function` on
    first use), memoised by (file, expression, signature, device). ``declared``: the
    instantiations ``expression`` must be among, when not ``name_expressions`` itself
    (a file compiled one instantiation a module)."""
    import cupy

    key = (name, expression, signature, cupy.cuda.runtime.getDevice())
    found = _launchers.get(key)
    if found is not None:
        return found
    if declared is not None and expression not in declared:
        raise ValueError(f"{expression!r} is not among the instantiations of {name}")
    from mgpu.backends.loader import get_function

    kernel = get_function(name, expression, name_expressions).kernel  # this device's
    with _lock:
        return _launchers.setdefault(key, Launcher(kernel, signature))
