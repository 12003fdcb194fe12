"""The devices a streamed SDDMM (:mod:`mgpu.ops.sddmm_stream`) runs its tiles on.

:class:`GpuDevice` moves host arrays to the current GPU through pinned buffers and runs the
virtual-warp CSR kernel; :class:`HostDevice` runs the same tiles with the CPU backend, so
that the cutting is tested where there is no GPU. CuPy is imported only when a
:class:`GpuDevice` is made.
"""
from __future__ import annotations

import time
from typing import Any

import numba
import numpy as np
import scipy.sparse as sp

from mgpu.backends.dispatch import sddmm_lookup
from mgpu.backends.jit import njit

__all__ = ["GpuDevice", "HostDevice"]

_COPY_BYTES = 1 << 26  # host-to-device copies go through two pinned buffers of this size


@njit(parallel=True, nogil=True)
def _copy_bytes(dst: np.ndarray, src: np.ndarray, parts: int) -> None:  # pragma: no cover
    """dst[:] = src[:] for byte arrays, in ``parts`` over numba's threads."""
    n = src.size
    step = (n + parts - 1) // parts
    for p in numba.prange(parts):
        a = p * step
        b = min(n, a + step)
        if a < b:
            dst[a:b] = src[a:b]


class GpuDevice:
    """The current GPU: arrays copied with CuPy, tiles run by the virtual-warp CSR kernel
    (the scheme that needs no tiled layout, so a block takes only what the plan counts).

    A host array goes to the device through two pinned buffers of ``piece_bytes``: while
    one piece crosses the bus, the host's threads fill the other buffer with the next.
    (``cupy.asarray`` would stage the whole array in pinned memory, which CuPy's pinned pool
    then keeps: a panel of B of 20 GB would hold 20 GB more of host memory; a copy from
    pageable memory runs at a fraction of the bus's speed.) ``seconds`` adds up the time
    spent copying to the device, and in the kernel with its values' way back."""

    def __init__(self, piece_bytes: int = _COPY_BYTES) -> None:
        import cupy

        self.piece_bytes = int(piece_bytes)
        self._pinned = [cupy.cuda.alloc_pinned_memory(self.piece_bytes) for _ in range(2)]
        self._buffers = [np.frombuffer(m, np.uint8, self.piece_bytes) for m in self._pinned]
        self._stream = cupy.cuda.Stream(non_blocking=True)
        self.seconds = {"to device": 0.0, "kernel and back": 0.0}

    def put(self, X: np.ndarray) -> Any:
        import cupy

        t0 = time.perf_counter()
        X = np.ascontiguousarray(X)
        cupy.cuda.get_current_stream().synchronize()  # no kernel still reads reused memory
        out = cupy.empty(X.shape, dtype=X.dtype)
        src = X.reshape(-1).view(np.uint8)
        done: list[Any] = [None, None]
        for k, off in enumerate(range(0, src.size, self.piece_bytes)):
            b = k % 2
            if done[b] is not None:
                done[b].synchronize()  # the buffer's last piece has left it
            n = min(self.piece_bytes, src.size - off)
            _copy_bytes(self._buffers[b][:n], src[off:off + n], 4 * numba.get_num_threads())
            cupy.cuda.runtime.memcpyAsync(out.data.ptr + off, self._pinned[b].ptr, n,
                                          cupy.cuda.runtime.memcpyHostToDevice,
                                          self._stream.ptr)
            done[b] = self._stream.record()
        self._stream.synchronize()
        self.seconds["to device"] += time.perf_counter() - t0
        return out

    def sddmm(self, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray,
              shape: tuple[int, int], A: Any, B: Any, hadamard: bool) -> np.ndarray:
        import cupy
        import cupyx.scipy.sparse as csp

        from mgpu.backends.cupy import run_csr

        S = csp.csr_matrix((self.put(data), self.put(indices), self.put(indptr)), shape=shape)
        A = self.put(A)
        t0 = time.perf_counter()
        out = cupy.empty(len(indices), dtype=A.dtype)
        run_csr(S, A, B, hadamard, out)
        vals = out.get()
        self.seconds["kernel and back"] += time.perf_counter() - t0
        return vals


class HostDevice:
    """The CPU backend behind the same interface: the tiles of a streamed SDDMM run where
    there is no GPU (tests of the cutting)."""

    def put(self, X: np.ndarray) -> Any:
        return np.array(X)

    def sddmm(self, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray,
              shape: tuple[int, int], A: Any, B: Any, hadamard: bool) -> np.ndarray:
        return sddmm_lookup(sp.csr_matrix((data, indices, indptr), shape=shape), A, B,
                            hadamard, None).data
