"""GPU SpGEMM and SpAdd (``kernels/spgemm.cu`` and CuPy), registered on
:data:`mgpu.backends.spgemm_lookup` and :data:`mgpu.backends.spadd_lookup`.

The product runs in two passes over the intermediate products (see the kernel file): a
symbolic pass counts each row's output, then the numeric pass fills it. Between them the
exact size of C is known, so C is refused with the numbers (:class:`DeviceMemoryError`)
before the numeric pass when it does not fit the device, or, with ``to_host``, computed in
row blocks that do and copied to the host one by one. The scratch of both passes (hash
tables in global memory for the longest rows) is sized to what the device has left and
used in batches: a product whose output fits is never refused for scratch space.

The sum runs as a merge of the two matrices' entries ordered by (row, column): each entry's
place in the merged list is its own index plus the number of the other matrix's entries
before it (a binary search each), the parallel merge of merge path; equal keys end up side by
side and are added.
"""
from __future__ import annotations

import functools
import logging
from typing import Any

import cupy
import cupyx.scipy.sparse as csp
import numpy as np
import scipy.sparse as sp
from dask.utils import format_bytes

from mgpu.backends.cupy import current_facts
from mgpu.backends.dispatch import spadd_lookup, spgemm_lookup
from mgpu.backends.instances import (INSTANCES, SPGEMM_NUMERIC, SPGEMM_RATIO, SPGEMM_RUN,
                                     SPGEMM_SYMBOLIC, spgemm_dynamic, spgemm_shared)
from mgpu.backends.loader import c_type, get_function
from mgpu.backends.memory import (DeviceMemoryError, gpu_available, require_gpu,
                                  require_gpu_unless_small)

__all__ = ["GpuProducts", "spgemm_gpu"]

logger = logging.getLogger(__name__)

_FILE = "spgemm.cu"
_EMPTY = 0x7FFFFFFF
_INT32_MAX = np.iinfo(np.int32).max
# Share of the device's free memory the batched scratch (global tables) may take at once.
_SCRATCH_SHARE = 0.5


def _kernel(expr: str) -> Any:
    return get_function(_FILE, expr, INSTANCES[_FILE])


# The numeric pass places the columns of a row of a dynamic-memory table by a bitmap of C's
# columns (and its running counts) beside the table, not by a sort, where the two take at
# most this much shared memory (8 bytes per 32 columns: B of up to 262,144 columns)
_BITMAP_BYTES = 64 * 1024
# ... and the rows of the tables in global memory by such a bitmap alone (a block a row), where
# it takes at most this much (and the device allows it): B of up to 929,792 columns
_GLOBAL_BITMAP_BYTES = 227 * 1024


@functools.lru_cache(maxsize=None)
def _tables(device: int, numeric: bool, t: str, n: int = 0
            ) -> tuple[tuple[int, int, str, int, int], ...]:
    """The shared-memory tables this device can hold, smallest first: (threads per row,
    slots, kernel, dynamic shared memory in bytes or 0, bitmap words or 0). ``n``: the
    columns of C (numeric pass)."""
    limit = int(cupy.cuda.Device(device).attributes["MaxSharedMemoryPerBlockOptin"])
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
        out.append((group, table, spgemm_shared(t, group, table, numeric), dyn, words))
    return tuple(out)


def _launch_shared(expr: str, dyn: int, words: int, rows: cupy.ndarray, group: int,
                   args: tuple) -> None:
    fn = _kernel(expr)
    block = max(256, group)
    grid = (_grid(rows.size, block // group),)
    args = args + (np.int32(words),)
    if dyn:
        if fn.max_dynamic_shared_size_bytes < dyn:
            fn.max_dynamic_shared_size_bytes = dyn
        fn(grid, (block,), args, shared_mem=dyn)
    else:
        fn(grid, (block,), args)


def _grid(items: int, per_block: int) -> int:
    """Blocks for ``items`` work items of ``per_block`` each: enough to fill the device a few
    times over, grid-stride loops doing the rest."""
    return int(max(1, min(-(-items // per_block), current_facts().sms * 32)))


class GpuProducts:
    """The intermediate products of A @ B on the device: ``cum``, their prefix sums over A's
    nonzeros (nnz(A) + 1 values, int64)."""

    def __init__(self, A: csp.csr_matrix, B: csp.csr_matrix) -> None:
        self.cum = cupy.empty(A.nnz + 1, dtype=cupy.int64)
        _kernel("mgpu_spgemm_products")((_grid(max(A.nnz, 1), 256),), (256,),
                                        (A.indices, np.int64(A.nnz), B.indptr, self.cum))
        if A.nnz:
            cupy.cumsum(self.cum[1:], out=self.cum[1:])

    def of_rows(self, indptr: cupy.ndarray, rows: cupy.ndarray) -> cupy.ndarray:
        """The products of each of ``rows`` (int64)."""
        return self.cum[indptr[rows + 1]] - self.cum[indptr[rows]]


_EDGES: dict[tuple, cupy.ndarray] = {}


def _edges(edges: tuple[int, ...]) -> cupy.ndarray:
    key = (edges, cupy.cuda.runtime.getDevice())
    arr = _EDGES.get(key)
    if arr is None:
        arr = _EDGES[key] = cupy.asarray(edges, dtype=cupy.int64)
    return arr


def _bins(A: csp.csr_matrix, cum: cupy.ndarray, r0: int, r1: int, edges: tuple[int, ...], *,
          n: int = 0, sizes: cupy.ndarray | None = None) -> tuple[cupy.ndarray, np.ndarray]:
    """Rows r0..r1 listed by bin (bin b >= 1 holds sizes in (edges[b-2], edges[b-1]], the
    last bin sizes past edges[-1]; empty rows are not listed), and where each bin starts in
    that list (bin b at starts[b] .. starts[b + 1]): two launches and one wait. The size
    of a row is min(its products, n) without ``sizes`` (the symbolic pass), else
    ``sizes[row]``; at least its products / SPGEMM_RATIO either way."""
    products = sizes is None
    ratio = SPGEMM_RATIO[0 if products else 1]
    args = (np.int32(r0), np.int32(r1), A.indptr, cum, A.indptr if products else sizes,
            np.int64(n), np.int64(ratio), _edges(edges), np.int32(len(edges)))
    flag = "true" if products else "false"
    counts = cupy.zeros(len(edges) + 2, dtype=cupy.int32)
    grid = _grid(max(r1 - r0, 1), 256)
    _kernel(f"mgpu_spgemm_bin_count<{flag}>")((grid,), (256,), args + (counts,))
    counts_h = counts.get()
    starts = np.zeros(len(edges) + 3, dtype=np.int64)
    starts[2:] = np.cumsum(counts_h[1:])  # bin 0 (empty rows) takes no place
    rows = cupy.empty(int(starts[-1]), dtype=cupy.int32)
    if rows.size:
        cursor = cupy.asarray(starts[:-1].astype(np.int32))
        _kernel(f"mgpu_spgemm_bin_fill<{flag}>")((grid,), (256,), args + (cursor, rows))
    return rows, starts


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

    def __init__(self, A: csp.csr_matrix, B: csp.csr_matrix) -> None:
        self.A, self.B = A, B
        self.m, self.n = A.shape[0], B.shape[1]
        self.dtype = A.dtype
        self.t = c_type(A.dtype)
        self.what = (f"SpGEMM of A {A.shape[0]}×{A.shape[1]} with {A.nnz:,} nonzeros and B "
                     f"{B.shape[0]}×{B.shape[1]} with {B.nnz:,}")
        # cum, the bins' rows, row_nnz and C's row offsets
        require_gpu_unless_small(8 * (A.nnz + 1) + 24 * (self.m + 1), self.what)
        self.prod = GpuProducts(A, B)
        self.zeros = cupy.zeros(1, dtype=cupy.uint64)

    def _args(self) -> tuple:
        A, B = self.A, self.B
        return (A.indptr, A.indices, A.data, B.indptr, B.indices, B.data, self.prod.cum)

    def symbolic(self) -> cupy.ndarray:
        """Each row's count of distinct columns (int32, m values)."""
        row_nnz = cupy.zeros(self.m, dtype=cupy.int32)
        tables = _tables(cupy.cuda.runtime.getDevice(), False, self.t)
        edges = tuple(table for _, table, _, _, _ in tables)
        rows, starts = _bins(self.A, self.prod.cum, 0, self.m, edges, n=self.n)
        for b, (group, _, expr, dyn, words) in enumerate(tables, start=1):
            r = rows[starts[b]:starts[b + 1]]
            if r.size:
                _launch_shared(expr, dyn, words, r, group, self._args() + (
                    r, np.int32(r.size), row_nnz, self.prod.cum, np.int64(0), row_nnz,
                    self.A.data, self.zeros))
        big = rows[starts[len(edges) + 1]:]
        if big.size:
            bound = cupy.minimum(self.prod.of_rows(self.A.indptr, big), self.n)
            self._global(big, 2 * bound, row_nnz, None)
        return row_nnz

    def _global(self, rows: cupy.ndarray, want: cupy.ndarray, row_nnz: cupy.ndarray,
                out: tuple | None) -> None:
        """The rows past the shared-memory tables, with tables of at least ``want`` slots
        each in global memory, in batches that fit. Symbolic (``out`` None): counts into
        row_nnz. Numeric (``out`` = (c_off, c_base, c_idx, c_val)): fills C's rows, then
        places them in column order."""
        numeric = out is not None
        slot = 4 + (self.dtype.itemsize if numeric else 0)
        # the few long rows' sizes are worked out on the host: one copy down, one up a batch
        want_h, flops_h = cupy.stack([want.astype(cupy.int64),
                                      self.prod.of_rows(self.A.indptr, rows)]).get()
        sizes_h = np.left_shift(1, np.ceil(np.log2(np.maximum(want_h, 2))).astype(np.int64))
        available, _ = gpu_available()
        budget = int(available * _SCRATCH_SHARE)
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
               self._args() + (r, np.int32(r.size), rcum, toff, keys, vals, row_nnz))
            if numeric:
                self._place(r, toff, keys, vals, slots, row_nnz, out)

    def _place(self, r: cupy.ndarray, toff: cupy.ndarray, keys: cupy.ndarray,
               vals: cupy.ndarray, slots: int, row_nnz: cupy.ndarray, out: tuple) -> None:
        """The filled global tables of rows ``r`` to their places in C, in column order: by
        a bitmap of C's columns in shared memory where the device holds one, else in slot
        order and then sorted."""
        c_off, c_base, c_idx, c_val = out
        words = -(-self.n // 32)
        dev = cupy.cuda.runtime.getDevice()
        limit = int(cupy.cuda.Device(dev).attributes["MaxSharedMemoryPerBlockOptin"])
        if 8 * words <= min(limit, _GLOBAL_BITMAP_BYTES):
            fn = _kernel(f"mgpu_spgemm_global_rank<{self.t}>")
            if fn.max_dynamic_shared_size_bytes < 8 * words:
                fn.max_dynamic_shared_size_bytes = 8 * words
            fn((_grid(r.size, 1),), (256,), (r, np.int32(r.size), toff, keys, vals, c_off,
                                              np.int64(c_base), c_idx, c_val, self.zeros,
                                              np.int32(words)), shared_mem=8 * words)
            return
        fill = cupy.zeros(r.size, dtype=cupy.int32)
        gather = _kernel(f"mgpu_spgemm_global_gather<{self.t}>")
        gather((_grid(slots, 256),), (256,),
               (r, np.int32(r.size), toff, keys, vals, fill, c_off, np.int64(c_base), c_idx,
                c_val, self.zeros))
        _sort_rows(c_idx, c_val, c_off[r] - c_base, row_nnz[r].astype(cupy.int64), self.n)

    def numeric(self, row_nnz: cupy.ndarray, c_off: cupy.ndarray, r0: int, r1: int,
                base: int, nnz: int) -> tuple[cupy.ndarray, cupy.ndarray, int]:
        """Columns and values of rows r0..r1 of C (c_off: C's row offsets, int64; base =
        c_off[r0], nnz = c_off[r1] - base), each row sorted by column, and how many of the
        values are exactly 0 (not yet left out)."""
        c_idx = cupy.empty(nnz, dtype=cupy.int32)
        c_val = cupy.empty(nnz, dtype=self.dtype)
        if nnz == 0:
            return c_idx, c_val, 0
        self.zeros.fill(0)
        tables = _tables(cupy.cuda.runtime.getDevice(), True, self.t, self.n)
        edges = tuple(table // 2 for _, table, _, _, _ in tables)
        rows, starts = _bins(self.A, self.prod.cum, r0, r1, edges, sizes=row_nnz)
        for b, (group, _, expr, dyn, words) in enumerate(tables, start=1):
            r = rows[starts[b]:starts[b + 1]]
            if r.size:
                _launch_shared(expr, dyn, words, r, group, self._args() + (
                    r, np.int32(r.size), row_nnz, c_off, np.int64(base), c_idx, c_val,
                    self.zeros))
        big = rows[starts[len(edges) + 1]:]
        if big.size:
            self._global(big, 2 * row_nnz[big].astype(cupy.int64), row_nnz,
                         (c_off, base, c_idx, c_val))
        return c_idx, c_val, int(self.zeros.get()[0])


def _sort_rows(c_idx: cupy.ndarray, c_val: cupy.ndarray, starts: cupy.ndarray,
               lens: cupy.ndarray, n: int) -> None:
    """Sort by column, in place, the runs c_idx[starts[i] : starts[i] + lens[i]] (and c_val
    alike): one radix sort of (run, column) keys, 32-bit where they fit."""
    ends = cupy.cumsum(lens)
    total = int(ends[-1])
    t = cupy.arange(total, dtype=cupy.int64)
    seg = cupy.searchsorted(ends, t, side="right")
    pos = starts[seg] + t - (ends[seg] - lens[seg])
    shift = max(1, int(n - 1).bit_length())
    if (lens.size << shift) <= _INT32_MAX:
        key = (seg.astype(cupy.int32) << shift) | c_idx[pos]
    else:
        key = (seg << shift) | c_idx[pos].astype(cupy.int64)
    order = cupy.argsort(key)
    c_idx[pos] = c_idx[pos][order]
    c_val[pos] = c_val[pos][order]


def _rows_of(indptr: cupy.ndarray, nnz: int) -> cupy.ndarray:
    """The row of each of ``nnz`` entries of a CSR with row pointers ``indptr``."""
    return (cupy.searchsorted(indptr, cupy.arange(nnz, dtype=indptr.dtype), side="right")
            - 1).astype(cupy.int32)


def _drop_zeros(c_off: cupy.ndarray, r0: int, r1: int, base: int, idx: cupy.ndarray,
                val: cupy.ndarray) -> tuple[cupy.ndarray, cupy.ndarray, cupy.ndarray]:
    """Rows r0..r1 of C (entries idx/val at c_off[row] - base) without their exact zeros, as
    scipy's SpGEMM leaves them out: (row offsets from 0, idx, val)."""
    t = c_type(val.dtype)
    grid = (_grid(max(r1 - r0, 1), 8),)
    counts = cupy.empty(r1 - r0, dtype=cupy.int64)
    _kernel(f"mgpu_spgemm_nonzeros<{t}>")(grid, (256,), (np.int32(r0), np.int32(r1), c_off,
                                                        np.int64(base), val, counts))
    off = _indptr(counts)
    kept = int(off[-1])
    out_idx = cupy.empty(kept, dtype=idx.dtype)
    out_val = cupy.empty(kept, dtype=val.dtype)
    _kernel(f"mgpu_spgemm_compact<{t}>")(grid, (256,), (np.int32(r0), np.int32(r1), c_off,
                                                       np.int64(base), idx, val, off, out_idx,
                                                       out_val))
    return off, out_idx, out_val


def _csr(indptr: cupy.ndarray, idx: cupy.ndarray, val: cupy.ndarray, shape: tuple[int, int]
         ) -> csp.csr_matrix:
    """A canonical cupyx CSR of these arrays (indptr of any integer type, m + 1 values)."""
    C = csp.csr_matrix((val, idx, indptr.astype(cupy.int32, copy=False)), shape=shape,
                       copy=False)
    C.has_canonical_format = True
    return C


def _indptr(counts: cupy.ndarray) -> cupy.ndarray:
    indptr = cupy.zeros(counts.size + 1, dtype=cupy.int64)
    indptr[1:] = cupy.cumsum(counts)
    return indptr


def _masked(A: csp.csr_matrix, B: csp.csr_matrix, M: csp.csr_matrix) -> csp.csr_matrix:
    """C = A @ B at the stored positions of M only (M canonical)."""
    what = (f"masked SpGEMM of A {A.shape[0]}×{A.shape[1]} with {A.nnz:,} nonzeros, B with "
            f"{B.nnz:,} and a mask of {M.nnz:,} entries")
    require_gpu(12 * (A.nnz + 1) + (A.dtype.itemsize + 1) * M.nnz + 16 * M.nnz, what)
    prod = GpuProducts(A, B)
    acc = cupy.zeros(M.nnz, dtype=A.dtype)
    hit = cupy.zeros(M.nnz, dtype=cupy.uint8)
    total = int(prod.cum[-1])
    if total and M.nnz:
        fn = _kernel(f"mgpu_spgemm_masked<{c_type(A.dtype)}, {SPGEMM_RUN}>")
        fn((_grid(total, 256 * SPGEMM_RUN),), (256,),
           (A.indices, A.data, _rows_of(A.indptr, A.nnz), np.int64(A.nnz), B.indptr,
            B.indices, B.data, prod.cum, M.indptr, M.indices, acc, hit))
    keep = (hit != 0) & (acc != 0)
    counts = cupy.bincount(_rows_of(M.indptr, M.nnz)[keep], minlength=M.shape[0])
    return _csr(_indptr(counts), M.indices[keep], acc[keep], (A.shape[0], B.shape[1]))


def spgemm_gpu(A: csp.csr_matrix, B: csp.csr_matrix, mask: csp.csr_matrix | None = None,
               to_host: bool = False) -> Any:
    """A @ B on the current device (A and B cupyx CSR of one float dtype, int32 indices),
    canonical; with ``to_host`` a scipy CSR assembled from row blocks of C that each fit
    the device."""
    if mask is not None:
        C = _masked(A, B, mask)
        return C.get() if to_host else C
    p = _Product(A, B)
    row_nnz = p.symbolic()
    c_off = cupy.zeros(p.m + 1, dtype=cupy.int64)
    c_off[1:] = cupy.cumsum(row_nnz)
    nnz = int(c_off[-1])
    entry = 4 + p.dtype.itemsize
    if not to_host:
        hint = ("Pass to_host=True to have C computed in row blocks and gathered on the "
                "host, or spread A's rows over several GPUs (a dask array of row tiles).")
        if nnz > _INT32_MAX:
            raise DeviceMemoryError(
                f"{p.what} has {nnz:,} nonzeros, more than a CuPy sparse matrix can index "
                f"(2³¹ − 1). {hint}")
        require_gpu_unless_small(nnz * entry + 4 * (p.m + 1),
                                 lambda: f"{p.what}: C of {nnz:,} nonzeros", hint)
        idx, val, zeros = p.numeric(row_nnz, c_off, 0, p.m, 0, nnz)
        if zeros:
            c_off, idx, val = _drop_zeros(c_off, 0, p.m, 0, idx, val)
        return _csr(c_off, idx, val, (p.m, p.n))
    # row blocks of C, each of at most half of what the device has free
    available, _ = gpu_available()
    budget = max(entry, int(available * _SCRATCH_SHARE))
    cuts = [0]
    off_h = c_off.get()
    while cuts[-1] < p.m:
        r0 = cuts[-1]
        r1 = int(np.searchsorted(off_h, off_h[r0] + budget // entry, side="right")) - 1
        cuts.append(min(p.m, max(r1, r0 + 1)))
    logger.info("%s: C of %s nonzeros (%s) in %d row blocks", p.what, f"{nnz:,}",
                format_bytes(nnz * entry), len(cuts) - 1)
    counts, idxs, vals = [], [], []
    for r0, r1 in zip(cuts[:-1], cuts[1:]):
        idx, val, zeros = p.numeric(row_nnz, c_off, r0, r1, int(off_h[r0]),
                                    int(off_h[r1] - off_h[r0]))
        if zeros:
            off, idx, val = _drop_zeros(c_off, r0, r1, int(off_h[r0]), idx, val)
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


def _canonical(X: csp.csr_matrix) -> csp.csr_matrix:
    """X with sorted columns and no duplicates (a copy where X is not so already)."""
    if X.has_canonical_format:
        return X
    X = X.copy()
    X.sum_duplicates()
    return X


@spgemm_lookup.register(csp.spmatrix)
def _spgemm_cupy(A: csp.csr_matrix, B: csp.csr_matrix, mask: Any = None,
                 to_host: bool = False) -> Any:
    return spgemm_gpu(A, B, mask, to_host)


@spadd_lookup.register(csp.spmatrix)
def _spadd_cupy(A: csp.csr_matrix, B: csp.csr_matrix, alpha: float, beta: float
                ) -> csp.csr_matrix:
    """alpha·A + beta·B of canonical A and B by a parallel merge of their (row, column)
    keys; exact zeros left out (as scipy's sum)."""
    A, B = _canonical(A), _canonical(B)
    m, n = A.shape
    dt = A.dtype
    what = (f"SpAdd of two {m}×{n} matrices with {A.nnz:,} and {B.nnz:,} nonzeros")
    total = A.nnz + B.nnz
    require_gpu(total * (8 * 4 + 2 * dt.itemsize) + 16 * (m + 1), what)
    if total == 0:
        return csp.csr_matrix((m, n), dtype=dt)
    ka = _rows_of(A.indptr, A.nnz).astype(cupy.int64) * n + A.indices
    kb = _rows_of(B.indptr, B.nnz).astype(cupy.int64) * n + B.indices
    keys = cupy.empty(total, dtype=cupy.int64)
    vals = cupy.empty(total, dtype=dt)
    pa = cupy.arange(A.nnz, dtype=cupy.int64) + cupy.searchsorted(kb, ka, side="left")
    pb = cupy.arange(B.nnz, dtype=cupy.int64) + cupy.searchsorted(ka, kb, side="right")
    keys[pa] = ka
    keys[pb] = kb
    vals[pa] = A.data * dt.type(alpha)
    vals[pb] = B.data * dt.type(beta)
    del ka, kb, pa, pb
    head = cupy.ones(total, dtype=cupy.bool_)
    head[1:] = keys[1:] != keys[:-1]
    # each key appears at most twice (once from each canonical matrix): a head's sum is its
    # value plus that of the next entry when the next is not a head
    nxt = cupy.zeros(total, dtype=dt)
    nxt[:-1] = cupy.where(head[1:], dt.type(0), vals[1:])
    sums = (vals + nxt)[head]
    keys = keys[head]
    keep = sums != 0
    keys, sums = keys[keep], sums[keep]
    rows = keys // n
    counts = cupy.bincount(rows, minlength=m)
    return _csr(_indptr(counts), (keys - rows * n).astype(cupy.int32), sums, (m, n))
