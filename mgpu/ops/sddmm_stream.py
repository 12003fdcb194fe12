"""SDDMM of host operands through one GPU in tiles, for problems larger than the GPU.

S (scipy CSR) and the factors A, B (numpy) stay in host memory; the device holds one column
panel of B and one row block of S and A at a time, within a budget of its memory:

- B is cut into ``n_panels`` column panels of at most half the budget (one panel, B whole,
  when it fits);
- for each panel, S's rows are cut into blocks whose rows of A, nonzeros and results fill
  the rest of the budget; each block's nonzeros in the panel go to the device with its rows
  of A, the virtual-warp CSR kernel computes them, and the values come back to their places
  in P.

So B crosses the bus once, A once per panel, and S's nonzeros once. What fits where is
decided from the sizes before anything is copied: a single row too large for the budget is
refused up front with the numbers (:class:`mgpu.backends.memory.DeviceMemoryError`).

The loop is written against a small device interface (:class:`Device`): the GPU's
(:class:`GpuDevice`) moves arrays and runs the kernel; :class:`HostDevice` runs the same
tiles with the CPU backend, so that the cutting is tested where there is no GPU.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numba
import numpy as np
import scipy.sparse as sp
from dask.utils import format_bytes

from mgpu.backends.memory import DeviceMemoryError
from mgpu.backends.jit import njit
# The devices a stream runs on live with the backends; their names stay importable here.
from mgpu.backends.stream import GpuDevice, HostDevice

__all__ = ["GpuDevice", "HostDevice", "StreamPlan", "plan_stream", "sddmm_streamed"]

_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class StreamPlan:
    """How S, A and B are cut to pass through a device of ``budget`` bytes."""

    budget: int
    panels: tuple[tuple[int, int], ...]  # column ranges of B
    blocks: tuple[tuple[int, int], ...]  # row ranges of S and A
    panel_bytes: int  # the largest panel of B on the device
    block_bytes: int  # the most one block of S, A and P takes there

    @property
    def tiles(self) -> int:
        return len(self.panels) * len(self.blocks)


def plan_stream(indptr: np.ndarray, n_cols: int, K: int, itemsize: int, budget: int,
                what: str = "SDDMM") -> StreamPlan:
    """Panels of B and blocks of S's rows for a device of ``budget`` bytes.

    A block's bytes count its rows of A (``K`` values each), its indptr (int32) and, for
    each of its nonzeros, the value and column (int32) of S and the result; a block's
    nonzeros are at most 2^31 - 1 (int32 row pointers).

    Raises
    ------
    DeviceMemoryError
        When one row of S and A, beside the largest panel of B, exceeds the budget.

    Examples
    --------
    >>> plan = plan_stream(np.array([0, 2, 4, 6, 8]), 10, 4, 4, budget=250)
    >>> plan.panels, plan.blocks
    (((0, 5), (5, 10)), ((0, 3), (3, 4)))
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    m = len(indptr) - 1
    row_nnz = np.diff(indptr)
    b_bytes = n_cols * K * itemsize
    n_panels = max(1, -(-b_bytes // max(1, budget // 2)))
    width = -(-n_cols // n_panels) if n_cols else 0
    panels = tuple((c, min(n_cols, c + width)) for c in range(0, n_cols, max(width, 1))) \
        or ((0, 0),)
    panel_bytes = max((c1 - c0) * K * itemsize for c0, c1 in panels)
    row_bytes = K * itemsize + 4 + row_nnz * (2 * itemsize + 4)
    room = budget - panel_bytes
    widest = int(row_bytes.max(initial=0))
    if widest > room:
        r = int(row_bytes.argmax())
        raise DeviceMemoryError(
            f"{what}: row {r} of S ({int(row_nnz[r]):,} nonzeros) with its row of A needs "
            f"{format_bytes(widest)} on the device beside a panel of B "
            f"({format_bytes(panel_bytes)}); the budget is {format_bytes(budget)}. Raise "
            "the working memory, or lower K."
        )
    blocks = []
    cum = np.concatenate([[0], np.cumsum(row_bytes)])
    r0 = 0
    while r0 < m:
        # the most rows from r0 within the room, and within int32 nonzeros
        r1 = int(np.searchsorted(cum, cum[r0] + room, side="right")) - 1
        r1 = min(r1, int(np.searchsorted(indptr, indptr[r0] + _INT32_MAX, side="right")) - 1)
        r1 = max(r1, r0 + 1)
        blocks.append((r0, min(r1, m)))
        r0 = min(r1, m)
    block_bytes = max((int(cum[b] - cum[a]) for a, b in blocks), default=0)
    return StreamPlan(budget=int(budget), panels=panels, blocks=tuple(blocks) or ((0, 0),),
                      panel_bytes=int(panel_bytes), block_bytes=block_bytes)


class Device(Protocol):
    def put(self, X: np.ndarray) -> Any: ...

    def sddmm(self, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray,
              shape: tuple[int, int], A: Any, B: Any, hadamard: bool) -> np.ndarray: ...


# A panel's part of a block of S: in each row, the nonzeros whose column is in [c0, c1), in
# their order, columns made relative to c0; and their values back to their places. The rows
# go over numba's threads. (indptr: the block's row pointers, absolute; cols and vals its
# nonzeros, from indptr[0].)

@njit(parallel=True, nogil=True)
def _panel_counts(indptr, cols, c0, c1, counts):  # pragma: no cover (numba)
    base = indptr[0]
    for i in numba.prange(len(indptr) - 1):
        c = 0
        for p in range(indptr[i] - base, indptr[i + 1] - base):
            if c0 <= cols[p] < c1:
                c += 1
        counts[i] = c


@njit(parallel=True, nogil=True)
def _panel_take(indptr, cols, data, c0, c1, t_indptr, t_indices, t_data):  # pragma: no cover
    base = indptr[0]
    for i in numba.prange(len(indptr) - 1):
        q = t_indptr[i]
        for p in range(indptr[i] - base, indptr[i + 1] - base):
            if c0 <= cols[p] < c1:
                t_indices[q] = cols[p] - c0
                t_data[q] = data[p]
                q += 1


@njit(parallel=True, nogil=True)
def _panel_put(indptr, cols, c0, c1, t_indptr, vals, out):  # pragma: no cover (numba)
    base = indptr[0]
    for i in numba.prange(len(indptr) - 1):
        q = t_indptr[i]
        for p in range(indptr[i] - base, indptr[i + 1] - base):
            if c0 <= cols[p] < c1:
                out[p] = vals[q]
                q += 1


def sddmm_streamed(S: sp.csr_matrix, A: np.ndarray, B: np.ndarray, hadamard: bool,
                   dtype: np.dtype, plan: StreamPlan, device: Device,
                   progress: Callable[[int], None] | None = None) -> sp.csr_matrix:
    """P = S ∘ (A Bᵀ) of checked host operands, tile by tile through ``device``.

    ``progress`` is called with the number of S's nonzeros done after each tile (with
    several panels a nonzero counts in the panel that holds its column).
    """
    dtype = np.dtype(dtype)
    out = np.empty(S.nnz, dtype=dtype)
    indptr = S.indptr.astype(np.int64, copy=False)
    data = S.data.astype(dtype, copy=False)
    one_panel = len(plan.panels) == 1
    for c0, c1 in plan.panels:
        Bp = device.put(np.ascontiguousarray(B[c0:c1], dtype=dtype))
        for r0, r1 in plan.blocks:
            lo, hi = int(indptr[r0]), int(indptr[r1])
            cols = S.indices[lo:hi]
            if one_panel:
                t_indptr = (indptr[r0:r1 + 1] - lo).astype(np.int32)
                t_indices, t_data = cols.astype(np.int32, copy=False), data[lo:hi]
            else:
                t_indptr = np.zeros(r1 - r0 + 1, dtype=np.int64)
                _panel_counts(indptr[r0:r1 + 1], cols, c0, c1, t_indptr[1:])
                np.cumsum(t_indptr, out=t_indptr)
                t_indices = np.empty(int(t_indptr[-1]), dtype=np.int32)
                t_data = np.empty(len(t_indices), dtype=dtype)
                _panel_take(indptr[r0:r1 + 1], cols, data[lo:hi], c0, c1, t_indptr, t_indices,
                            t_data)
                t_indptr = t_indptr.astype(np.int32)
            if len(t_indices):
                vals = device.sddmm(t_indptr, t_indices, np.ascontiguousarray(t_data),
                                    (r1 - r0, c1 - c0),
                                    np.ascontiguousarray(A[r0:r1], dtype=dtype), Bp, hadamard)
                if one_panel:
                    out[lo:hi] = vals
                else:
                    _panel_put(indptr[r0:r1 + 1], cols, c0, c1, t_indptr, vals, out[lo:hi])
            if progress is not None:
                progress(len(t_indices))
        del Bp
    return sp.csr_matrix((out, S.indices.copy(), S.indptr.copy()), shape=S.shape)
