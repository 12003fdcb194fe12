"""GPU SpGEMM (``kernels/spgemm.cu`` and CuPy), registered on
:data:`mgpu.backends.spgemm_lookup` (its CSR helpers, and the check of CSR operands, are
in :mod:`mgpu.backends.cupy_csr`).

The product runs in two passes over the intermediate products (see the kernel file): a
symbolic pass counts each row's output (a short row's products stand for its count), then the
numeric pass fills it. Between them the size of C is known (exactly, or bounded where rows
are short: counted exactly instead where the bound would not fit), so C is refused with the
numbers (:class:`DeviceMemoryError`) before the numeric pass when it does not fit the
device, or, with ``to_host``, computed in row blocks that do and copied to the host one by
one. The scratch of both passes (hash
tables in global memory for the longest rows) is sized to what the device has left and
used in batches: a product whose output fits is never refused for scratch space.

The sum is in :mod:`mgpu.backends.cupy_spadd`.
"""
from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

import cupy
import cupyx.scipy.sparse as csp
import numpy as np
import scipy.sparse as sp
from dask.utils import format_bytes

from mgpu.backends.cupy import current_facts
from mgpu.backends.cupy_csr import csr_of, indptr_of, int32_indices, rows_of, sort_rows
from mgpu.backends.dispatch import spgemm_lookup
from mgpu.backends.instances import (INSTANCES, SPGEMM_CLOSE_RUN, SPGEMM_NUMERIC, SPGEMM_RATIO,
                                     SPGEMM_RUN, SPGEMM_SYMBOLIC, spgemm_dynamic,
                                     spgemm_shared)
from mgpu.backends.launch import Launcher, launcher
from mgpu.backends.loader import c_type, get_function
from mgpu.backends.memory import (DeviceMemoryError, gpu_available, require_gpu,
                                  require_gpu_unless_small)

__all__ = ["spgemm_gpu"]

logger = logging.getLogger(__name__)

_FILE = "spgemm.cu"
_EMPTY = 0x7FFFFFFF
_INT32_MAX = np.iinfo(np.int32).max
# Share of the device's free memory the batched scratch (global tables) may take at once.
_SCRATCH_SHARE = 0.5


# each kernel's arguments, one letter each (mgpu.backends.launch): launched by a Launcher,
# whose packing costs a fraction of CuPy's own launch (a product makes some twenty launches)
_SIGNATURES = {
    "mgpu_spgemm_shared": "ppppppppippqpppi",
    "mgpu_spgemm_global": "ppppppppippppp",
    "mgpu_spgemm_global_gather": "pipppppqppp",
    "mgpu_spgemm_global_rank": "pippppqpppi",
    "mgpu_spgemm_dense": "ppppppppipqqpp",
    "mgpu_spgemm_dense_count": "pipqp",
    "mgpu_spgemm_dense_place": "pipqippqppp",
    "mgpu_spgemm_row_cum": "pippp",
    "mgpu_spgemm_masked": "pppqpppppppp",
    "mgpu_spgemm_nonzeros": "iipqppp",
    "mgpu_spgemm_compact": "iipqpppppp",
    "mgpu_spgemm_bin_count": "iipppqqqpipp",
    "mgpu_spgemm_bin_fill": "iipppqqqpippp",
    "mgpu_spgemm_scan_reduce": "ppqp",
    "mgpu_spgemm_scan_partials": "pq",
    "mgpu_spgemm_scan_apply": "ppqpppp",
    "mgpu_spgemm_close_up": "iipqpppppp",
}
# the bins' status on the device (long long): each bin's rows (0 .. 15), each bin's rows
# listed so far (16 .. 31), a total read in the same copy (32), the short rows (33), their
# products (34) and each bin's short rows (36 .. 51); as kernels/spgemm.cu
_STATUS = 52
_TOTAL = 32
_SHORT = 33
_SHORT_FLOPS = 34
_SHORT_BINS = 36
# A row of at most this many products is short (None: as many as the largest shared numeric
# table takes, half its slots). Short rows may skip the symbolic pass: their products (at most
# n) then stand for their counts to size their places in C beforehand, the numeric pass leaves
# slack after their entries, and one copy closes it up.
_SHORT_PRODUCTS: int | None = None
# They skip it where the whole product has at most this many products and they hold at
# least _SHORT_SHARE of them: the count would read those products once more, where the copy
# moves each entry of C once, and C is small. Elsewhere they are counted like the others: a
# graph's A·Aᵀ has a C about as big as its products, whose copy costs more than the count
# (email-Enron's, soc-Slashdot0902's), and where long rows hold most products (a
# bag-of-words A·Aᵀ) skipping the short rows' count spares little of the pass.
_SLACK_PRODUCTS = 1 << 24
_SHORT_SHARE = 0.5
_SCAN_TILE = 256 * 8  # values a block of the scan takes (MGPU_SCAN_TILE)


def _kernel(expr: str) -> Launcher:
    return launcher(_FILE, expr, INSTANCES[_FILE], _SIGNATURES[expr.split("<", 1)[0]])


_OPTED_IN: dict[tuple[str, int], int] = {}


def _opt_in(expr: str, nbytes: int) -> None:
    """Let ``expr`` take ``nbytes`` of dynamic shared memory (the device's opt-in; set once
    per kernel and device, and raised when more is asked)."""
    key = (expr, cupy.cuda.runtime.getDevice())
    if _OPTED_IN.get(key, 0) < nbytes:
        fn = get_function(_FILE, expr, INSTANCES[_FILE])
        if fn.max_dynamic_shared_size_bytes < nbytes:
            fn.max_dynamic_shared_size_bytes = nbytes
        _OPTED_IN[key] = nbytes


def _ptr(a: cupy.ndarray | None) -> int:
    return 0 if a is None else a.data.ptr


def _scan(values: cupy.ndarray, n: int, out: cupy.ndarray, *, b_ptr: cupy.ndarray | None = None,
          out32: cupy.ndarray | None = None, total: int = 0) -> None:
    """out[0] = 0, out[i + 1] = the sum of the first i + 1 of n values (int64 ``out`` of n + 1;
    ``out32`` alike as int32, where given; the sum of all n also to the int64 at device
    address ``total``, where not 0): ``values`` itself (int32), or with ``b_ptr`` the
    lengths of the B rows that the column indices ``values`` pick. Three launches."""
    tiles = max(1, -(-n // _SCAN_TILE))
    partial = cupy.empty(tiles, dtype=cupy.int64)
    flag = "false" if b_ptr is None else "true"
    _kernel(f"mgpu_spgemm_scan_reduce<{flag}>")((tiles,), (256,), (
        values.data.ptr, _ptr(b_ptr), n, partial.data.ptr))
    _kernel("mgpu_spgemm_scan_partials")((1,), (256,), (partial.data.ptr, tiles))
    _kernel(f"mgpu_spgemm_scan_apply<{flag}>")((tiles,), (256,), (
        values.data.ptr, _ptr(b_ptr), n, partial.data.ptr, out.data.ptr, _ptr(out32), total))


def _products(A: csp.csr_matrix, B: csp.csr_matrix) -> cupy.ndarray:
    """The intermediate products' prefix sums over A's nonzeros (nnz(A) + 1 values, int64):
    cum[j] = the products of A's nonzeros before j."""
    cum = cupy.empty(A.nnz + 1, dtype=cupy.int64)
    _scan(A.indices, A.nnz, cum, b_ptr=B.indptr)
    return cum


def _of_rows(cum: cupy.ndarray, indptr: cupy.ndarray, rows: cupy.ndarray) -> cupy.ndarray:
    """The products of each of ``rows`` (int64)."""
    return cum[indptr[rows + 1]] - cum[indptr[rows]]


# The numeric pass places the columns of a row of a dynamic-memory table by a bitmap of C's
# columns (and its running counts) beside the table, not by a sort, where the two take at
# most this much shared memory (8 bytes per 32 columns: B of up to 262,144 columns)
_BITMAP_BYTES = 64 * 1024
# ... the rows of a block's static table likewise (the bitmap alone in dynamic shared memory),
# where it takes at most this much: B of up to 98,304 columns, so that the bitmap does not
# cut the blocks an SM holds by much; and where it has no more words than the table slots
# (its clearing and scan, per row, then cost less than a sort). A bitonic sort of a row of a
# few hundred columns takes dozens of the block's barriers, and ten times the instructions
# of its products.
_STATIC_BITMAP_BYTES = 24 * 1024
# ... and the rows of the tables in global memory by such a bitmap alone (a block a row), where
# it takes at most this much (and the device allows it): B of up to 929,792 columns
_GLOBAL_BITMAP_BYTES = 227 * 1024
# The rows past the shared-memory tables take a dense accumulator each (a bit and a value for
# every column of C) in place of a hash table in global memory where B's columns fit that
# bitmap and the accumulators take at most this many times the tables' memory: a product is
# then an addition at its column's place, with no probing (such rows hold thousands of
# columns, a tenth or more of a graph's vertices)
_DENSE_OVER_TABLES = 2
_DENSE_SPAN = 256 * 4 * 8  # products a block of mgpu_spgemm_dense takes at a time (its SPAN)


@functools.lru_cache(maxsize=None)
def _tables(device: int, numeric: bool, t: str, n: int = 0
            ) -> tuple[tuple[int, int, str, int, int], ...]:
    """The shared-memory tables this device can hold, smallest first: (threads per row,
    slots, kernel, dynamic shared memory in bytes or 0, bitmap words or 0). ``n``: the
    columns of C (numeric pass)."""
    limit = current_facts().smem_optin
    itemsize = 4 if t == "float" else 8
    out = []
    for group, table in (SPGEMM_NUMERIC if numeric else SPGEMM_SYMBOLIC):
        dyn = words = 0
        if spgemm_dynamic(table, numeric):
            dyn = table * (4 + (itemsize if numeric else 0))
            if dyn > limit:
                break
            w = -(-n // 32)
            if numeric and 0 < 8 * w <= min(_BITMAP_BYTES, limit - dyn):
                words = w
                dyn += 8 * w
        elif numeric and group > 32 and 0 < -(-n // 32) <= table and (
                8 * -(-n // 32) <= _STATIC_BITMAP_BYTES):
            words = -(-n // 32)
            dyn = 8 * words
        out.append((group, table, spgemm_shared(t, group, table, numeric), dyn, words))
    return tuple(out)


def _launch_shared(expr: str, dyn: int, words: int, nrows: int, group: int, args: tuple
                   ) -> None:
    block = max(256, group)
    grid = (_grid(nrows, block // group),)
    if dyn:
        _opt_in(expr, dyn)
    _kernel(expr)(grid, (block,), args + (words,), shared_mem=dyn)


# A bin of warp-sized tables with fewer rows than this many a streaming multiprocessor runs
# in the next table of a whole block instead: its warps would leave most of the device idle
# while each works through its row's products alone (a matrix of a few thousand rows of
# thousands of products, such as a stiffness matrix squared), where a block's threads share
# them eight times as finely
_FEW_WARPS_PER_SM = 32
# Streams beside the caller's for the kernels of the bins: each bin's kernel alone is often
# too small to fill the device (a few thousand rows of a few hundred products), and the bins
# are independent, so they run at once
_SIDE_STREAMS = 4
_SIDES = threading.local()  # .of: {device: (side streams with their events, start event)}


def _side_streams() -> tuple[tuple[tuple[cupy.cuda.Stream, cupy.cuda.Event], ...],
                             cupy.cuda.Event]:
    """This thread's side streams on the current device, each with an event, and an event
    for the caller's stream: made once and reused (a stream's wait takes an event as last
    recorded, and only this thread records them)."""
    of = getattr(_SIDES, "of", None)
    if of is None:
        of = _SIDES.of = {}
    dev = cupy.cuda.runtime.getDevice()
    found = of.get(dev)
    if found is None:
        found = of[dev] = (tuple((cupy.cuda.Stream(non_blocking=True),
                                  cupy.cuda.Event(disable_timing=True))
                                 for _ in range(_SIDE_STREAMS)),
                           cupy.cuda.Event(disable_timing=True))
    return found


def _at_once(launches: list[Any]) -> None:
    """Call the ``launches`` (each queues kernels) so that their kernels run concurrently:
    the first on the current stream, the others on side streams that first wait for
    everything queued on the current one so far; the current stream then waits for them
    all, so what is queued on it next sees their results."""
    if len(launches) <= 1:
        for launch in launches:
            launch()
        return
    main = cupy.cuda.get_current_stream()
    sides, start = _side_streams()
    start.record(main)
    for side, _ in sides[:len(launches) - 1]:
        side.wait_event(start)
    for i, launch in enumerate(launches[1:]):
        with sides[i % len(sides)][0]:
            launch()
    launches[0]()
    for side, done in sides[:len(launches) - 1]:
        done.record(side)
        main.wait_event(done)


def _grid(items: int, per_block: int) -> int:
    """Blocks for ``items`` work items of ``per_block`` each: enough to fill the device a few
    times over, grid-stride loops doing the rest."""
    return int(max(1, min(-(-items // per_block), current_facts().sms * 32)))


_EDGES: dict[tuple, cupy.ndarray] = {}


def _edges(edges: tuple[int, ...]) -> cupy.ndarray:
    key = (edges, cupy.cuda.runtime.getDevice())
    arr = _EDGES.get(key)
    if arr is None:
        arr = _EDGES[key] = cupy.asarray(edges, dtype=cupy.int64)
    return arr


def _bins(A: csp.csr_matrix, cum: cupy.ndarray, r0: int, r1: int, edges: tuple[int, ...], *,
          n: int = 0, sizes: cupy.ndarray | None = None, total: int = 0, few: int = 0,
          bounds: cupy.ndarray | None = None) -> tuple[cupy.ndarray, np.ndarray, int, int]:
    """Rows r0..r1 listed by bin (bin b >= 1 holds sizes in (edges[b-2], edges[b-1]], the
    last bin sizes past edges[-1]; empty rows are not listed), where each bin starts in
    that list (bin b at starts[b] .. starts[b + 1]), the int64 at device address ``total``
    (0: none), and the short rows left out, read in the same copy: two launches and one
    wait. The size of a row is min(its products, n) without ``sizes`` (the symbolic pass),
    else ``sizes[row]``; at least its products / SPGEMM_RATIO either way. Without
    ``sizes``, a row of 1 to ``few`` products is short, and the short rows skip the count
    where the product is small (see _SLACK_PRODUCTS; ``total``: all the products): then
    they are not listed, and their products (at most n) go to ``bounds[row]``; else they
    are listed as the others."""
    products = sizes is None
    ratio = SPGEMM_RATIO[0 if products else 1]
    status = cupy.zeros(_STATUS, dtype=cupy.int64)

    def args(few: int) -> tuple:
        return (r0, r1, A.indptr.data.ptr, cum.data.ptr, _ptr(A.indptr if products else sizes),
                n, ratio, few if products else 0, _edges(edges).data.ptr, len(edges),
                status.data.ptr)

    flag = "true" if products else "false"
    grid = (_grid(max(r1 - r0, 1), 256),)
    _kernel(f"mgpu_spgemm_bin_count<{flag}>")(grid, (256,), args(few) + (total,))
    status_h = status.get()
    short = int(status_h[_SHORT])
    counts = status_h[1:len(edges) + 2]
    total_h = status_h[_TOTAL]  # the int64 at total: all the products where symbolic
    if short and total_h <= _SLACK_PRODUCTS and status_h[_SHORT_FLOPS] >= _SHORT_SHARE * total_h:
        counts = counts - status_h[_SHORT_BINS + 1:_SHORT_BINS + len(edges) + 2]
    else:
        few = short = 0
    starts = np.zeros(len(edges) + 3, dtype=np.int64)
    starts[2:] = np.cumsum(counts)  # bin 0 (empty rows) takes no place
    rows = cupy.empty(int(starts[-1]), dtype=cupy.int32)
    if rows.size or short:
        _kernel(f"mgpu_spgemm_bin_fill<{flag}>")(grid, (256,), args(few) + (rows.data.ptr,
                                                                          _ptr(bounds)))
    return rows, starts, int(total_h), short


def _batches(sizes: np.ndarray, budget: int, what: str) -> list[tuple[int, int]]:
    """Cut consecutive items of ``sizes`` bytes into batches of at most ``budget`` bytes (a
    batch of one item may exceed it only if that one item fits what the device has; else
    :class:`DeviceMemoryError`)."""
    out, start, acc = [], 0, 0
    for i, s in enumerate(sizes.tolist()):
        if acc and acc + s > budget:
            out.append((start, i))
            start, acc = i, 0
        acc += s
    if len(sizes):
        out.append((start, len(sizes)))
    biggest = int(sizes.max()) if len(sizes) else 0
    if biggest > budget:
        require_gpu(biggest, what)
    return out


class _Product:
    """One product A @ B on the current device."""

    def __init__(self, A: csp.csr_matrix, B: csp.csr_matrix, few: int = 0) -> None:
        self.A, self.B = A, B
        self.few = few  # the most products of a short row (0: none is)
        self.slack = False  # whether a short row was met: C's places hold slack
        self.m, self.n = A.shape[0], B.shape[1]
        self.dtype = A.dtype
        self.t = c_type(A.dtype)
        self.what = (f"SpGEMM of A {A.shape[0]}×{A.shape[1]} with {A.nnz:,} nonzeros and B "
                     f"{B.shape[0]}×{B.shape[1]} with {B.nnz:,}")
        # cum, the bins' rows, row_nnz and C's row offsets (int64 and int32)
        require_gpu_unless_small(8 * (A.nnz + 1) + 28 * (self.m + 1), self.what)
        self.cum = _products(A, B)
        # the numeric pass's count of exact zeros, and C's size once closed up: one copy
        self.tail = cupy.zeros(2, dtype=cupy.int64)
        self.zeros = self.tail[:1]
        self.operands = (A.indptr.data.ptr, A.indices.data.ptr, A.data.data.ptr,
                         B.indptr.data.ptr, B.indices.data.ptr, B.data.data.ptr,
                         self.cum.data.ptr)

    def symbolic(self) -> cupy.ndarray:
        """Each row's count of distinct columns (int32, m values); a short row's bound
        instead (its products, at most n), which the numeric pass replaces by its count."""
        row_nnz = cupy.zeros(self.m, dtype=cupy.int32)
        tables = _tables(cupy.cuda.runtime.getDevice(), False, self.t)
        edges = tuple(table // 2 for _, table, _, _, _ in tables)  # at most half full
        rows, starts, _, short = _bins(self.A, self.cum, 0, self.m, edges, n=self.n,
                                       few=self.few, bounds=row_nnz,
                                       total=self.cum.data.ptr + 8 * self.A.nnz)
        self.slack = short > 0
        # no output: row_nnz, cum and A's values stand in for C's arrays
        out = (row_nnz.data.ptr, self.cum.data.ptr, 0, row_nnz.data.ptr,
               self.A.data.data.ptr, self.zeros.data.ptr)
        self._shared(tables, rows, starts, out)
        big = rows[starts[len(edges) + 1]:]
        if big.size:
            self._global(big, lambda: 2 * cupy.minimum(_of_rows(self.cum, self.A.indptr, big),
                                                       self.n), row_nnz, None, edges[-1])
        return row_nnz

    def _shared(self, tables: tuple, rows: cupy.ndarray, starts: np.ndarray, out: tuple
                ) -> None:
        """The shared-memory kernel of each non-empty bin, all at once (:func:`_at_once`);
        ``out``: the kernels' arguments after the listed rows (row_nnz, c_off, c_base,
        c_idx, c_val, zeros)."""
        launches = []
        few = current_facts().sms * _FEW_WARPS_PER_SM
        for b, (group, table, expr, dyn, words) in enumerate(tables, start=1):
            r = rows[starts[b]:starts[b + 1]]
            if r.size:
                if group == 32 and r.size < few:  # a block's table instead: see _FEW_WARPS_PER_SM
                    group, _, expr, dyn, words = next(
                        (t for t in tables if t[0] > 32 and t[1] >= table), tables[b - 1])
                args = self.operands + (r.data.ptr, r.size) + out
                launches.append(functools.partial(_launch_shared, expr, dyn, words, r.size,
                                                  group, args))
        _at_once(launches[::-1])  # the largest tables' (the longest rows') first

    def offsets(self, row_nnz: cupy.ndarray) -> tuple[cupy.ndarray, cupy.ndarray]:
        """C's row offsets from the rows' counts: int64, and int32 (right where C has fewer
        than 2³¹ nonzeros)."""
        c_off = cupy.empty(self.m + 1, dtype=cupy.int64)
        c_off32 = cupy.empty(self.m + 1, dtype=cupy.int32)
        _scan(row_nnz, self.m, c_off, out32=c_off32)
        return c_off, c_off32

    def numeric_bins(self, row_nnz: cupy.ndarray, c_off: cupy.ndarray, r0: int, r1: int
                     ) -> tuple[cupy.ndarray, np.ndarray, int]:
        """The numeric pass's bins of rows r0..r1 (:func:`_bins`) and C's places (c_off[m]:
        its nonzeros, or more with slack), in one wait."""
        tables = _tables(cupy.cuda.runtime.getDevice(), True, self.t, self.n)
        edges = tuple(table // 2 for _, table, _, _, _ in tables)
        return _bins(self.A, self.cum, r0, r1, edges, sizes=row_nnz,
                     total=c_off.data.ptr + 8 * self.m)[:3]

    def close_up(self, c_off: cupy.ndarray, lens: cupy.ndarray, r0: int, r1: int, base: int,
                 idx: cupy.ndarray, val: cupy.ndarray
                 ) -> tuple[cupy.ndarray, cupy.ndarray, cupy.ndarray]:
        """Rows r0..r1 of C (after the numeric pass: lens[row] entries from c_off[row] -
        base on, then slack) without the slack and without exact zeros: (row offsets from 0
        as int32, idx, val). Where the numeric pass met no exact zero (nearly always), the
        rows' offsets are their counts' prefix sums, read with that count in one copy, and
        one launch moves the entries; else :func:`_close_up` counts and copies."""
        n = r1 - r0
        off = cupy.empty(n + 1, dtype=cupy.int64)
        off32 = cupy.empty(n + 1, dtype=cupy.int32)
        _scan(lens[r0:r1], n, off, out32=off32, total=self.tail.data.ptr + 8)
        zeros, kept = (int(v) for v in self.tail.get())
        if zeros:
            return _close_up(c_off, lens, r0, r1, base, idx, val, kept - zeros)
        out_idx = cupy.empty(kept, dtype=cupy.int32)
        out_val = cupy.empty(kept, dtype=self.dtype)
        if kept:
            grid = (_grid(idx.size, 256 * SPGEMM_CLOSE_RUN),)  # idx: the rows' places
            _kernel(f"mgpu_spgemm_close_up<{self.t}, {SPGEMM_CLOSE_RUN}>")(grid, (256,), (
                r0, r1, c_off.data.ptr, base, lens.data.ptr, idx.data.ptr, val.data.ptr,
                off.data.ptr, out_idx.data.ptr, out_val.data.ptr))
        return off32, out_idx, out_val

    def _global(self, rows: cupy.ndarray, want: Callable[[], cupy.ndarray],
                row_nnz: cupy.ndarray, out: tuple | None, floor: int) -> None:
        """The rows past the shared-memory tables (each of a size above ``floor``), with
        dense accumulators (:meth:`_dense`) or tables of at least ``want()`` slots each in
        global memory, in batches that fit. Symbolic (``out`` None): counts into row_nnz.
        Numeric (``out`` = (c_off, c_base, c_idx, c_val)): fills C's rows, then places them
        in column order."""
        numeric = out is not None
        slot = 4 + (self.dtype.itemsize if numeric else 0)
        words = -(-self.n // 32)
        dense = 4 * words + (self.n * self.dtype.itemsize if numeric else 0)
        least = slot << (2 * floor + 1).bit_length()  # the least table of a row past floor
        if (8 * words <= min(current_facts().smem_optin, _GLOBAL_BITMAP_BYTES)
                and dense <= _DENSE_OVER_TABLES * least):
            self._dense(rows, dense, words, floor, row_nnz, out)
            return
        # the few long rows' sizes are worked out on the host: one copy down, one up a batch
        want_h, flops_h = cupy.stack([want().astype(cupy.int64),
                                      _of_rows(self.cum, self.A.indptr, rows)]).get()
        sizes_h = np.left_shift(1, np.ceil(np.log2(np.maximum(want_h, 2))).astype(np.int64))
        budget = int(gpu_available()[0] * _SCRATCH_SHARE)
        what = f"{self.what}: a hash table for one row of {int(sizes_h.max()):,} slots"
        for b0, b1 in _batches(sizes_h * slot, budget, what):
            r = rows[b0:b1]
            offsets = np.zeros((2, b1 - b0 + 1), dtype=np.int64)
            np.cumsum(sizes_h[b0:b1], out=offsets[0, 1:])
            np.cumsum(flops_h[b0:b1], out=offsets[1, 1:])
            toff, rcum = cupy.asarray(offsets)
            slots, total = int(offsets[0, -1]), int(offsets[1, -1])
            keys = cupy.full(slots, _EMPTY, dtype=cupy.int32)
            vals = cupy.zeros(slots if numeric else 1, dtype=self.dtype)
            fn = _kernel(f"mgpu_spgemm_global<{self.t}, {'true' if numeric else 'false'}>")
            fn((_grid(total, 256 * 4),), (256,),  # 4 products a thread at a time
               self.operands + (r.data.ptr, r.size, rcum.data.ptr, toff.data.ptr,
                                keys.data.ptr, vals.data.ptr, row_nnz.data.ptr))
            if numeric:
                self._place(r, toff, keys, vals, slots, row_nnz, out)

    def _dense(self, rows: cupy.ndarray, dense: int, words: int, floor: int,
               row_nnz: cupy.ndarray, out: tuple | None) -> None:
        """:meth:`_global`'s rows with a dense accumulator of ``dense`` bytes each (a bitmap
        of ``words`` words, and values where numeric), in batches that fit: sized on the
        host by the rows' number alone, so that the host waits for nothing here."""
        numeric = out is not None
        what = f"{self.what}: a dense accumulator of {self.n:,} columns for one row"
        budget = int(gpu_available()[0] * _SCRATCH_SHARE)
        rcum = cupy.empty(rows.size + 1, dtype=cupy.int64)  # the rows' products' prefix sums
        _kernel("mgpu_spgemm_row_cum")((1,), (256,), (rows.data.ptr, rows.size,
                                                      self.A.indptr.data.ptr, self.cum.data.ptr,
                                                      rcum.data.ptr))
        for b0, b1 in _batches(np.full(rows.size, dense, dtype=np.int64), budget, what):
            r, nb = rows[b0:b1], b1 - b0
            bitmap = cupy.zeros(nb * words, dtype=cupy.uint32)
            vals = cupy.zeros(nb * self.n if numeric else 1, dtype=self.dtype)
            expr = f"mgpu_spgemm_dense<{self.t}, {'true' if numeric else 'false'}>"
            _opt_in(expr, 4 * words)
            _kernel(expr)(
                # spans of 256 × 4 × 8 products a block; a row here has more than floor
                (_grid(nb * (floor + 1), _DENSE_SPAN),), (256,),
                self.operands + (r.data.ptr, nb, rcum.data.ptr + 8 * b0, self.n, words,
                                 bitmap.data.ptr, vals.data.ptr), shared_mem=4 * words)
            if not numeric:
                _kernel("mgpu_spgemm_dense_count")((_grid(nb, 1),), (256,), (
                    r.data.ptr, nb, bitmap.data.ptr, words, row_nnz.data.ptr))
                continue
            c_off, c_base, c_idx, c_val = out
            expr = f"mgpu_spgemm_dense_place<{self.t}>"
            _opt_in(expr, 8 * words)
            _kernel(expr)((_grid(nb, 1),), (256,), (
                r.data.ptr, nb, bitmap.data.ptr, self.n, words, vals.data.ptr,
                c_off.data.ptr, c_base, c_idx.data.ptr, c_val.data.ptr, self.zeros.data.ptr),
                shared_mem=8 * words)

    def _place(self, r: cupy.ndarray, toff: cupy.ndarray, keys: cupy.ndarray,
               vals: cupy.ndarray, slots: int, row_nnz: cupy.ndarray, out: tuple) -> None:
        """The filled global tables of rows ``r`` to their places in C, in column order: by
        a bitmap of C's columns in shared memory where the device holds one, else in slot
        order and then sorted."""
        c_off, c_base, c_idx, c_val = out
        words = -(-self.n // 32)
        if 8 * words <= min(current_facts().smem_optin, _GLOBAL_BITMAP_BYTES):
            expr = f"mgpu_spgemm_global_rank<{self.t}>"
            _opt_in(expr, 8 * words)
            _kernel(expr)((_grid(r.size, 1),), (256,), (
                r.data.ptr, r.size, toff.data.ptr, keys.data.ptr, vals.data.ptr,
                c_off.data.ptr, c_base, c_idx.data.ptr, c_val.data.ptr, self.zeros.data.ptr,
                words), shared_mem=8 * words)
            return
        fill = cupy.zeros(r.size, dtype=cupy.int32)
        _kernel(f"mgpu_spgemm_global_gather<{self.t}>")((_grid(slots, 256),), (256,), (
            r.data.ptr, r.size, toff.data.ptr, keys.data.ptr, vals.data.ptr, fill.data.ptr,
            c_off.data.ptr, c_base, c_idx.data.ptr, c_val.data.ptr, self.zeros.data.ptr))
        sort_rows(c_idx, c_val, c_off[r] - c_base, row_nnz[r].astype(cupy.int64), self.n)

    def numeric(self, row_nnz: cupy.ndarray, c_off: cupy.ndarray, r0: int, r1: int,
                base: int, nnz: int, binned: tuple[cupy.ndarray, np.ndarray] | None = None
                ) -> tuple[cupy.ndarray, cupy.ndarray, int]:
        """Columns and values of rows r0..r1 of C (c_off: C's row offsets, int64; base =
        c_off[r0], nnz = c_off[r1] - base), each row sorted by column, and how many of the
        values are exactly 0 (not yet left out; 0, without a wait, where the rows hold
        slack: :meth:`close_up` reads the count then). ``binned``: those rows' numeric bins
        (rows, starts), where already made."""
        c_idx = cupy.empty(nnz, dtype=cupy.int32)
        c_val = cupy.empty(nnz, dtype=self.dtype)
        if nnz == 0:
            return c_idx, c_val, 0
        self.zeros.fill(0)
        tables = _tables(cupy.cuda.runtime.getDevice(), True, self.t, self.n)
        rows, starts = binned or self.numeric_bins(row_nnz, c_off, r0, r1)[:2]
        self._shared(tables, rows, starts, (row_nnz.data.ptr, c_off.data.ptr, base,
                                            c_idx.data.ptr, c_val.data.ptr,
                                            self.zeros.data.ptr))
        big = rows[starts[len(tables) + 1]:]
        if big.size:
            self._global(big, lambda: 2 * row_nnz[big].astype(cupy.int64), row_nnz,
                         (c_off, base, c_idx, c_val), tables[-1][1] // 2)
        # with slack, C is closed up anyway (and its zeros left out then): no wait here
        return c_idx, c_val, 0 if self.slack else int(self.zeros.get()[0])


def _close_up(c_off: cupy.ndarray, lens: cupy.ndarray, r0: int, r1: int, base: int,
              idx: cupy.ndarray, val: cupy.ndarray, kept: int | None = None
              ) -> tuple[cupy.ndarray, cupy.ndarray, cupy.ndarray]:
    """Rows r0..r1 of C (lens[row] entries of idx/val from c_off[row] - base on, then
    slack) without their exact zeros, as scipy's SpGEMM leaves them out, and without the
    slack: (row offsets from 0 as int32, idx, val). ``kept``: the entries left, where known
    (else read from the device)."""
    t = c_type(val.dtype)
    grid = (_grid(max(r1 - r0, 1), 8),)
    counts = cupy.empty(r1 - r0, dtype=cupy.int32)
    _kernel(f"mgpu_spgemm_nonzeros<{t}>")(grid, (256,), (r0, r1, c_off.data.ptr, base,
                                                        lens.data.ptr, val.data.ptr,
                                                        counts.data.ptr))
    off = cupy.empty(r1 - r0 + 1, dtype=cupy.int64)
    off32 = cupy.empty(r1 - r0 + 1, dtype=cupy.int32)
    _scan(counts, r1 - r0, off, out32=off32)
    kept = int(off[-1]) if kept is None else kept
    out_idx = cupy.empty(kept, dtype=idx.dtype)
    out_val = cupy.empty(kept, dtype=val.dtype)
    _kernel(f"mgpu_spgemm_compact<{t}>")(grid, (256,), (
        r0, r1, c_off.data.ptr, base, lens.data.ptr, idx.data.ptr, val.data.ptr,
        off.data.ptr, out_idx.data.ptr, out_val.data.ptr))
    return off32, out_idx, out_val


def _masked(A: csp.csr_matrix, B: csp.csr_matrix, M: csp.csr_matrix) -> csp.csr_matrix:
    """C = A @ B at the stored positions of M only (M canonical)."""
    what = (f"masked SpGEMM of A {A.shape[0]}×{A.shape[1]} with {A.nnz:,} nonzeros, B with "
            f"{B.nnz:,} and a mask of {M.nnz:,} entries")
    require_gpu(12 * (A.nnz + 1) + (A.dtype.itemsize + 1) * M.nnz + 16 * M.nnz, what)
    cum = _products(A, B)
    acc = cupy.zeros(M.nnz, dtype=A.dtype)
    hit = cupy.zeros(M.nnz, dtype=cupy.uint8)
    total = int(cum[-1])
    if total and M.nnz:
        a_row = rows_of(A.indptr, A.nnz)
        _kernel(f"mgpu_spgemm_masked<{c_type(A.dtype)}, {SPGEMM_RUN}>")(
            (_grid(total, 256 * SPGEMM_RUN),), (256,),
            (A.indices.data.ptr, A.data.data.ptr, a_row.data.ptr, A.nnz, B.indptr.data.ptr,
             B.indices.data.ptr, B.data.data.ptr, cum.data.ptr, M.indptr.data.ptr,
             M.indices.data.ptr, acc.data.ptr, hit.data.ptr))
    keep = (hit != 0) & (acc != 0)
    counts = cupy.bincount(rows_of(M.indptr, M.nnz)[keep], minlength=M.shape[0])
    return csr_of(indptr_of(counts), M.indices[keep], acc[keep], (A.shape[0], B.shape[1]))


def _counted(A: csp.csr_matrix, B: csp.csr_matrix, few: int) -> tuple:
    """The symbolic pass of A @ B (rows of at most ``few`` products short), C's places and
    the numeric pass's bins: (product, row_nnz, c_off, c_off32, (rows, starts, places))."""
    p = _Product(A, B, few)
    row_nnz = p.symbolic()
    c_off, c_off32 = p.offsets(row_nnz)
    return p, row_nnz, c_off, c_off32, p.numeric_bins(row_nnz, c_off, 0, p.m)


def _fits(p: _Product, nnz: int, entry: int) -> None:
    """Refuse C of ``nnz`` places (:class:`DeviceMemoryError`) where CuPy cannot index it
    or the device cannot hold it."""
    hint = ("Pass to_host=True to have C computed in row blocks and gathered on the "
            "host, or spread A's rows over several GPUs (a dask array of row tiles).")
    if nnz > _INT32_MAX:
        raise DeviceMemoryError(
            f"{p.what} has {nnz:,} nonzeros, more than a CuPy sparse matrix can index "
            f"(2³¹ − 1). {hint}")
    require_gpu_unless_small(nnz * entry, lambda: f"{p.what}: C of {nnz:,} nonzeros", hint)


def spgemm_gpu(A: csp.csr_matrix, B: csp.csr_matrix, mask: csp.csr_matrix | None = None,
               to_host: bool = False) -> Any:
    """A @ B on the current device (A and B cupyx CSR of one float dtype), canonical; with
    ``to_host`` a scipy CSR assembled from row blocks of C that each fit the device.

    One product waits for the device three times: for the symbolic pass's bins, for C's
    size with the numeric pass's bins, and for the count of exact zeros at the end (more
    only where rows go to tables in global memory, or C to the host in blocks)."""
    A, B = int32_indices(A, "A"), int32_indices(B, "B")
    if mask is not None:
        C = _masked(A, B, int32_indices(mask, "mask"))
        return C.get() if to_host else C
    entry = 4 + A.dtype.itemsize
    few = _SHORT_PRODUCTS
    if few is None:  # the rows of the largest shared numeric table
        device = cupy.cuda.runtime.getDevice()
        few = _tables(device, True, c_type(A.dtype), B.shape[1])[-1][1] // 2
    p, row_nnz, c_off, c_off32, (rows, starts, nnz) = _counted(A, B, few)
    if not to_host:
        try:
            _fits(p, nnz, entry)
        except DeviceMemoryError:
            if not p.slack:
                raise
            # C's places with the short rows' bounds do not fit: count those rows too
            p, row_nnz, c_off, c_off32, (rows, starts, nnz) = _counted(A, B, 0)
            _fits(p, nnz, entry)
        idx, val, zeros = p.numeric(row_nnz, c_off, 0, p.m, 0, nnz, (rows, starts))
        if p.slack:
            c_off32, idx, val = p.close_up(c_off, row_nnz, 0, p.m, 0, idx, val)
        elif zeros:
            c_off32, idx, val = _close_up(c_off, row_nnz, 0, p.m, 0, idx, val, nnz - zeros)
        return csr_of(c_off32, idx, val, (p.m, p.n))
    del rows, c_off32
    # row blocks of C, each of at most half of what the device has free
    available, _ = gpu_available()
    budget = max(entry, int(available * _SCRATCH_SHARE))
    cuts = [0]
    off_h = c_off.get()
    while cuts[-1] < p.m:
        r0 = cuts[-1]
        r1 = int(np.searchsorted(off_h, off_h[r0] + budget // entry, side="right")) - 1
        cuts.append(min(p.m, max(r1, r0 + 1)))
    logger.info("%s: C of %s%s nonzeros (%s) in %d row blocks", p.what,
                "at most " if p.slack else "", f"{nnz:,}", format_bytes(nnz * entry),
                len(cuts) - 1)
    counts, idxs, vals = [], [], []
    for r0, r1 in zip(cuts[:-1], cuts[1:]):
        idx, val, zeros = p.numeric(row_nnz, c_off, r0, r1, int(off_h[r0]),
                                    int(off_h[r1] - off_h[r0]))
        if zeros or p.slack:
            off, idx, val = (p.close_up if p.slack else _close_up)(
                c_off, row_nnz, r0, r1, int(off_h[r0]), idx, val)
            counts.append(np.diff(off.get()))
        else:
            counts.append(row_nnz[r0:r1].get())
        idxs.append(idx.get())
        vals.append(val.get())
    counts_h = np.concatenate(counts) if counts else np.zeros(0, dtype=np.int64)
    total = int(counts_h.sum())
    itype = np.int64 if max(total, p.n) > _INT32_MAX else np.int32
    indptr = np.zeros(p.m + 1, dtype=itype)
    np.cumsum(counts_h, out=indptr[1:])
    idx_h = np.concatenate(idxs).astype(itype, copy=False) if idxs else np.zeros(0, itype)
    val_h = np.concatenate(vals) if vals else np.zeros(0, p.dtype)
    C = sp.csr_matrix((val_h, idx_h, indptr), shape=(p.m, p.n))
    C.has_sorted_indices = True
    return C


@spgemm_lookup.register(csp.spmatrix)
def _spgemm_cupy(A: csp.csr_matrix, B: csp.csr_matrix, mask: Any = None,
                 to_host: bool = False) -> Any:
    return spgemm_gpu(A, B, mask, to_host)
