"""CPU sparse × sparse product (SpGEMM) and sparse + sparse sum (SpAdd), numba on every core,
registered on :data:`mgpu.backends.spgemm_lookup` and :data:`mgpu.backends.spadd_lookup`.

SpGEMM is Gustavson's row-by-row product: row i of ``A @ B`` is the sum of the rows of B
that row i of A names, scaled by its values, gathered in a dense accumulator (a value array
of length n and a marker array telling which columns the current row has touched). The
rows are cut into chunks of equal *work* (the products a row computes, :func:`row_work`),
not of equal row count: in a power-law matrix a few rows hold most of the products. Each
chunk owns one accumulator, allocated once, and the chunks are handed to numba's threads
one at a time as they finish (chunk size 1), several per thread, so a chunk whose cost the
product count misjudges (cache misses, the sort of a long row) does not hold the others up.

The results are scipy's: products are summed in the order scipy sums them (A's row in
storage order, each B row in storage order, duplicates of either added as they come), in
A's dtype, so they agree to the bit wherever scipy's build, too, rounds each multiply and
add (no fused multiply-add); a sum that is exactly zero is dropped, as scipy's
``csr_matmat`` and ``csr_binop_csr`` drop it. The output is canonical CSR (sorted, no duplicates, no
stored zeros), said so on the matrix so scipy never checks it again.
"""
from __future__ import annotations

import numba
import numpy as np
import scipy.sparse as sp

from mgpu.backends.arrays import csr_well_formed
from mgpu.backends.dispatch import csr_sound_lookup, spadd_lookup, spgemm_lookup
from mgpu.backends.finite import all_finite
from mgpu.backends.jit import njit

__all__ = ["intermediate_products", "output_index_dtype", "row_work", "spadd_csr",
           "spgemm_csr"]

# Chunks per numba thread: enough for threads that finish early to take over the chunks
# of one that meets an expensive row, few enough that each chunk's accumulator (n values
# and a marker, filled once) stays a small part of its work.
_CHUNKS_PER_THREAD = 8
# Least cost of a chunk (products plus rows): below it a chunk's start-up is not worth it.
_MIN_CHUNK_COST = 1 << 15
# A row's columns are put in order by a scan of the summary bitmap (below), n / 4096 words,
# where that is at most this many words per step of a sort of them (count × (log2 count -
# 1)), else by that sort: wide rows are scanned, short rows in a wide matrix sorted.
_WORDS_PER_SORT_STEP = 8

_INT32_MAX = int(np.iinfo(np.int32).max)


def output_index_dtype(nnz: int, shape: tuple[int, int]) -> np.dtype:
    """The index dtype of a CSR result with ``nnz`` stored entries: int32 where every
    index, pointer and dimension fits in it, else int64.

    This is scipy's rule (``get_index_dtype`` with ``maxval``), applied to the result
    alone: the inputs' index dtypes do not widen it. The dimensions count because scipy's
    CSR constructor widens the indices to int64 (a copy) whenever a dimension needs it.

    >>> output_index_dtype(10, (5, 5))
    dtype('int32')
    >>> output_index_dtype(2**31, (5, 5))
    dtype('int64')
    """
    fits = max(int(nnz), *(int(d) for d in shape), 0) <= _INT32_MAX
    return np.dtype(np.int32 if fits else np.int64)


# ----------------------------------------------------------------------------- the work
@njit(parallel=True, nogil=True)
def _row_work(a_indptr, a_indices, b_indptr, out):
    for i in numba.prange(out.shape[0]):
        w = np.int64(0)
        for p in range(np.uint64(a_indptr[i]), np.uint64(a_indptr[i + 1])):
            j = np.uint64(a_indices[p])  # unsigned: no wraparound check (see _symbolic)
            w += np.int64(b_indptr[j + np.uint64(1)]) - np.int64(b_indptr[j])
        out[i] = w


def row_work(A_indptr: np.ndarray, A_indices: np.ndarray, B_indptr: np.ndarray) -> np.ndarray:
    """The products (multiply-adds) each row of ``A @ B`` computes: for row i, the summed
    lengths of the rows of B that A's row i names, a duplicate index counted each time.

    Parameters
    ----------
    A_indptr, A_indices : ndarray of int32 or int64
        A's CSR structure (m + 1 pointers, starting at 0).
    B_indptr : ndarray of int32 or int64
        B's row pointers (k + 1 of them, k = the number of columns of A).

    Returns
    -------
    ndarray of int64 and shape (m,)

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> A = sp.csr_matrix(np.array([[1.0, 1.0], [0.0, 0.0], [0.0, 2.0]]))
    >>> B = sp.csr_matrix(np.array([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0]]))
    >>> row_work(A.indptr, A.indices, B.indptr)
    array([4, 0, 1])
    """
    out = np.empty(max(len(A_indptr) - 1, 0), dtype=np.int64)
    if len(out):
        _row_work(A_indptr, A_indices, B_indptr, out)
    return out


def intermediate_products(A: sp.csr_matrix, B: sp.csr_matrix) -> int:
    """The products (multiply-adds) of ``A @ B`` by Gustavson's method, all rows together:
    the sum of :func:`row_work`, the flop count that sizes a product before it is run.

    >>> import scipy.sparse as sp
    >>> intermediate_products(sp.identity(4, format="csr"), sp.identity(4, format="csr"))
    4
    """
    return int(row_work(A.indptr, A.indices, B.indptr).sum())


def _chunk_starts(cost: np.ndarray, per_chunk_floor: int) -> np.ndarray:
    """Row cuts into chunks of about equal total ``cost`` (one value per row): the first row
    of each chunk, then the row count; no chunk empty. Chunks are
    ``_CHUNKS_PER_THREAD`` per numba thread, fewer where a chunk would then cost less than
    ``per_chunk_floor``."""
    m = len(cost)
    prefix = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(cost, out=prefix[1:])
    total = int(prefix[-1])
    n_chunks = min(_CHUNKS_PER_THREAD * numba.get_num_threads(),
                   total // max(per_chunk_floor, 1), m)
    n_chunks = max(n_chunks, 1 if m else 0)
    targets = np.arange(1, n_chunks, dtype=np.int64) * total // max(n_chunks, 1)
    cuts = np.searchsorted(prefix, targets, side="left")
    return np.unique(np.concatenate(([0], cuts, [m]))).astype(np.int64)


def _tags(m: int) -> np.ndarray:
    """An empty array of the marker dtype for tags up to ``2 m + 2``: int32 (half the
    memory traffic of int64) wherever they fit."""
    return np.empty(0, dtype=np.int32 if 2 * m + 2 <= _INT32_MAX else np.int64)


def _dynamic(kernel, *args) -> None:
    """Run a chunked kernel with its ``prange`` iterations handed out one at a time, and
    restore numba's (thread-local) schedule after."""
    old = numba.set_parallel_chunksize(1)
    try:
        kernel(*args)
    finally:
        numba.set_parallel_chunksize(old)


# ------------------------------------------------------------------------------ SpGEMM
# Unmasked, the product runs in two passes: a symbolic one counts each row's distinct
# columns, which sizes the output exactly (less the sums that cancel to zero), then the
# numeric one fills each row in its slot. A single pass would need room for every product
# (the flop count, often many times the output) or per-chunk buffers grown and copied; the
# symbolic pass costs a fraction of the numeric one (no values, no ordering) and keeps the
# memory at the output's size. Masked, the output of a row is a subset of the mask's row,
# so the mask's own pointers size it and the numeric pass runs alone.
#
# In the unmasked numeric pass the marker of the columns a row has touched is a bitmap (n
# bits: it stays in the first-level cache where n values would not), with a summary bitmap
# (a bit per word of it). The row's columns come out in order from a scan of the summary
# and of the words it points to, about one step per column, where a sort of them would
# take log2(count) steps a column: ordering is the greater part of a wide product's time.
# A row with few columns in a wide matrix is listed and sorted instead (the scan would
# mostly read empty summary words); the symbolic pass's count chooses before the row runs.

# The position of the lowest set bit of a 64-bit word, by de Bruijn's multiplication: the
# lowest bit times the sequence leaves a distinct 6-bit pattern in the top bits.
_DE_BRUIJN = 0x03F79D71B4CB0A89
_LOWEST_BIT = np.zeros(64, dtype=np.int64)
for _b in range(64):
    _LOWEST_BIT[((_DE_BRUIJN << _b) & (2**64 - 1)) >> 58] = _b


@njit(nogil=True, inline="always")
def _lowest_bit(low):
    """The position of ``low``, a uint64 with one bit set."""
    return _LOWEST_BIT[(low * np.uint64(_DE_BRUIJN)) >> np.uint64(58)]


# In the loops over products every array is indexed by an unsigned integer: numba checks a
# signed index for a negative value (Python's wraparound) on every access, which took longer
# than the work itself (a symbolic pass at 1.8 times scipy's time; unsigned, at 0.6 times).
_U6 = np.uint64(6)
_U12 = np.uint64(12)
_U63 = np.uint64(63)


@njit(parallel=True, nogil=True)
def _symbolic(starts, a_indptr, a_indices, b_indptr, b_indices, n, tag_like, counts):
    # Counting needs no order, so the marker is a tag array (``tag_like``'s dtype): a
    # column holds the row's number within the chunk once that row has touched it. A
    # bitmap would be smaller but slower here: consecutive products update one word,
    # each waiting on the last, where tags are independent stores.
    for c in numba.prange(starts.shape[0] - 1):
        r0 = starts[c]
        mark = np.zeros(n, dtype=tag_like.dtype)
        for i in range(r0, starts[c + 1]):
            hit = tag_like.dtype.type(i - r0 + 1)
            cnt = 0
            for p in range(np.uint64(a_indptr[i]), np.uint64(a_indptr[i + 1])):
                j = np.uint64(a_indices[p])
                for q in range(np.uint64(b_indptr[j]), np.uint64(b_indptr[j + 1])):
                    k = np.uint64(b_indices[q])
                    if mark[k] != hit:
                        mark[k] = hit
                        cnt += 1
            counts[i] = cnt


@njit(nogil=True, inline="always")
def _scan_is_cheaper(words, cnt, factor):
    """Whether a scan of ``words`` summary words beats a sort of ``cnt`` columns."""
    steps = 0
    while (np.int64(1) << steps) < cnt:
        steps += 1
    return words <= factor * cnt * (steps - 1)


@njit(parallel=True, nogil=True)
def _numeric(starts, a_indptr, a_indices, a_data, b_indptr, b_indices, b_data, n, slots,
             c_indices, c_data, counts, scan_factor):
    one = np.uint64(1)
    n_summary = (n + 4095) >> 12
    for c in numba.prange(starts.shape[0] - 1):
        acc = np.empty(n, dtype=a_data.dtype)
        bits = np.zeros((n + 63) >> 6, dtype=np.uint64)
        summary = np.zeros(n_summary, dtype=np.uint64)
        w = np.int64(slots[starts[c]])  # the chunk's rows written one after another
        for i in range(starts[c], starts[c + 1]):
            base = np.int64(slots[i])
            cnt = np.int64(slots[i + 1]) - base  # the row's columns, from the symbolic pass
            first = w
            if cnt > 0 and _scan_is_cheaper(n_summary, cnt, scan_factor):
                for p in range(np.uint64(a_indptr[i]), np.uint64(a_indptr[i + 1])):
                    j = np.uint64(a_indices[p])
                    v = a_data[p]
                    for q in range(np.uint64(b_indptr[j]), np.uint64(b_indptr[j + 1])):
                        k = np.uint64(b_indices[q])
                        wk = k >> _U6
                        bit = one << (k & _U63)
                        word = bits[wk]
                        if word & bit != 0:
                            acc[k] += v * b_data[q]
                        else:
                            bits[wk] = word | bit
                            summary[k >> _U12] |= one << (wk & _U63)
                            acc[k] = v * b_data[q]
                # the columns in order, both bitmaps left clear
                for s1 in range(n_summary):
                    word1 = summary[s1]
                    summary[s1] = 0
                    while word1 != 0:
                        low1 = word1 & (~word1 + one)
                        word1 ^= low1
                        w0 = np.uint64((s1 << 6) + _lowest_bit(low1))
                        word0 = bits[w0]
                        bits[w0] = 0
                        while word0 != 0:
                            low0 = word0 & (~word0 + one)
                            word0 ^= low0
                            k = (w0 << _U6) + np.uint64(_lowest_bit(low0))
                            x = acc[k]
                            if x != 0:
                                c_indices[w] = k
                                c_data[w] = x
                                w += 1
            elif cnt > 0:
                # the columns listed in the row's slot as they come, then sorted there; the
                # write position (at or before the slot) never passes the read position
                t = base
                for p in range(np.uint64(a_indptr[i]), np.uint64(a_indptr[i + 1])):
                    j = np.uint64(a_indices[p])
                    v = a_data[p]
                    for q in range(np.uint64(b_indptr[j]), np.uint64(b_indptr[j + 1])):
                        k = np.uint64(b_indices[q])
                        wk = k >> _U6
                        bit = one << (k & _U63)
                        word = bits[wk]
                        if word & bit != 0:
                            acc[k] += v * b_data[q]
                        else:
                            bits[wk] = word | bit
                            acc[k] = v * b_data[q]
                            c_indices[t] = k
                            t += 1
                row = c_indices[base:base + cnt]
                row.sort()
                for s in range(cnt):
                    k = np.uint64(row[s])
                    bits[k >> _U6] = 0
                    x = acc[k]
                    if x != 0:
                        c_indices[w] = k
                        c_data[w] = x
                        w += 1
            counts[i] = w - first


# Masked, the marker of column k holds 2r + 1 once row r of the chunk may touch it (the
# mask has it) and 2r + 2 once it has; the row comes out in the mask's (sorted) order. Rows
# only go up within a chunk, so the marker is filled once per chunk and never cleared.

@njit(parallel=True, nogil=True)
def _numeric_masked(starts, a_indptr, a_indices, a_data, b_indptr, b_indices, b_data, n,
                    m_indptr, m_indices, tag_like, c_indices, c_data, counts):
    for c in numba.prange(starts.shape[0] - 1):
        r0 = starts[c]
        mark = np.zeros(n, dtype=tag_like.dtype)
        acc = np.empty(n, dtype=a_data.dtype)
        w = np.int64(m_indptr[r0])  # the chunk's rows written one after another
        for i in range(r0, starts[c + 1]):
            m0 = m_indptr[i]
            m1 = m_indptr[i + 1]
            counts[i] = 0
            if m0 == m1:
                continue
            allow = tag_like.dtype.type(2 * (i - r0) + 1)
            hit = tag_like.dtype.type(allow + 1)
            for q in range(np.uint64(m0), np.uint64(m1)):
                mark[np.uint64(m_indices[q])] = allow
            for p in range(np.uint64(a_indptr[i]), np.uint64(a_indptr[i + 1])):
                j = np.uint64(a_indices[p])
                v = a_data[p]
                for q in range(np.uint64(b_indptr[j]), np.uint64(b_indptr[j + 1])):
                    k = np.uint64(b_indices[q])
                    t = mark[k]
                    if t == hit:
                        acc[k] += v * b_data[q]
                    elif t == allow:
                        mark[k] = hit
                        acc[k] = v * b_data[q]
            first = w
            for q in range(np.uint64(m0), np.uint64(m1)):
                k = np.uint64(m_indices[q])
                if mark[k] == hit:
                    x = acc[k]
                    if x != 0:
                        c_indices[w] = k
                        c_data[w] = x
                        w += 1
            counts[i] = w - first


@njit(nogil=True)
def _close_up(starts, slots, counts, c_indices, c_data):
    # Each chunk wrote its rows one after another from its first slot, so what is left to
    # close up is the gap after each chunk: its run moves down to where the runs before it
    # end. In chunk order, on one thread: a run may land on the place the run before it came
    # from, and each moves down (or stays), so a forward copy never overwrites what is still
    # to be read.
    w = np.uint64(0)
    for c in range(starts.shape[0] - 1):
        s = np.uint64(slots[starts[c]])
        k = np.uint64(0)
        for i in range(starts[c], starts[c + 1]):
            k += np.uint64(counts[i])
        if s != w:
            for t in range(k):  # unsigned: no wraparound check (see _symbolic)
                c_indices[w + t] = c_indices[s + t]
                c_data[w + t] = c_data[s + t]
        w += k


def _pointers(counts: np.ndarray, dtype: np.dtype) -> np.ndarray:
    ptr = np.zeros(len(counts) + 1, dtype=dtype)
    np.cumsum(counts, out=ptr[1:])
    return ptr


def _canonical_csr(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray,
                   shape: tuple[int, int]) -> sp.csr_matrix:
    C = sp.csr_matrix((data, indices, indptr), shape=shape, copy=False)
    C.has_sorted_indices = True
    C.has_canonical_format = True
    return C


def _empty(shape: tuple[int, int], dtype: np.dtype) -> sp.csr_matrix:
    idx_dtype = output_index_dtype(0, shape)
    return _canonical_csr(np.empty(0, dtype), np.empty(0, idx_dtype),
                          np.zeros(shape[0] + 1, idx_dtype), shape)


def _finish(starts: np.ndarray, slots: np.ndarray, counts: np.ndarray, c_indices: np.ndarray,
            c_data: np.ndarray, shape: tuple[int, int]) -> sp.csr_matrix:
    """The CSR matrix of the rows that each chunk of ``starts`` wrote one after another from
    its first slot (``counts`` entries a row): the arrays as they are where no row left a
    place of its slot empty, else closed up in place and cut to length (no second copy of
    C, whose fresh pages would cost as much as the copy)."""
    nnz = int(counts.sum())
    idx_dtype = output_index_dtype(nnz, shape)
    indptr = _pointers(counts, idx_dtype)
    if nnz < len(c_indices):  # a row kept fewer entries than its slot holds
        if nnz:
            _close_up(starts, slots, counts, c_indices, c_data)
        # the arrays are this call's own: cut in place (realloc), not copied
        c_indices.resize(nnz, refcheck=False)
        c_data.resize(nnz, refcheck=False)
    return _canonical_csr(c_data, c_indices.astype(idx_dtype, copy=False), indptr, shape)


def spgemm_csr(A: sp.csr_matrix, B: sp.csr_matrix,
               mask: sp.csr_matrix | None = None) -> sp.csr_matrix:
    """``A @ B`` by Gustavson's method on every core, or only its entries at the stored
    positions of ``mask``.

    Parameters
    ----------
    A : scipy CSR of shape (m, k)
    B : scipy CSR of shape (k, n)
        Of A's float dtype, finite; indices int32 or int64, possibly unsorted and with
        duplicates (which add up, as in scipy).
    mask : scipy CSR of shape (m, n), optional
        Sorted indices, no duplicates; only its pattern counts.

    Returns
    -------
    scipy.sparse.csr_matrix of shape (m, n)
        Canonical, in A's dtype (float32 sums in float32, as scipy's); where a sum is
        exactly zero no entry is stored, so the pattern is scipy's exactly. With a mask, an
        entry only where the mask has one.

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> A = sp.csr_matrix(np.array([[1.0, 2.0], [0.0, 3.0]]))
    >>> spgemm_csr(A, A).toarray()
    array([[1., 8.],
           [0., 9.]])
    """
    m, n = A.shape[0], B.shape[1]
    shape = (m, n)
    dtype = A.dtype
    work = row_work(A.indptr, A.indices, B.indptr)
    if mask is None:
        cost = work + np.diff(A.indptr).astype(np.int64) + 1
    else:
        mask_len = np.diff(mask.indptr).astype(np.int64)
        cost = np.where(mask_len > 0, work + np.diff(A.indptr) + mask_len, 0) + 1
    if m == 0 or n == 0 or not work.any():
        return _empty(shape, dtype)
    # each chunk fills an accumulator of n, so it should do at least n of work
    starts = _chunk_starts(cost, max(_MIN_CHUNK_COST, n))
    counts = np.empty(m, dtype=np.int64)
    if mask is None:
        _dynamic(_symbolic, starts, A.indptr, A.indices, B.indptr, B.indices, np.int64(n),
                 _tags(m), counts)
        slots = _pointers(counts, np.int64)
    else:
        slots = mask.indptr.astype(np.int64)
    upper = int(slots[-1])
    c_indices = np.empty(upper, dtype=output_index_dtype(upper, shape))
    c_data = np.empty(upper, dtype=dtype)
    if mask is None:
        _dynamic(_numeric, starts, A.indptr, A.indices, A.data, B.indptr, B.indices, B.data,
                 np.int64(n), slots, c_indices, c_data, counts,
                 np.int64(_WORDS_PER_SORT_STEP))
    else:
        _dynamic(_numeric_masked, starts, A.indptr, A.indices, A.data, B.indptr, B.indices,
                 B.data, np.int64(n), mask.indptr, mask.indices, _tags(m), c_indices, c_data,
                 counts)
    return _finish(starts, slots, counts, c_indices, c_data, shape)


@csr_sound_lookup.register((sp.spmatrix, sp.sparray))
def _csr_sound_host(*Xs) -> bool:
    return all(bool(csr_well_formed(X)) and bool(all_finite(X.data)) for X in Xs)


@spgemm_lookup.register((sp.spmatrix, sp.sparray))
def _spgemm_host(A, B, mask=None, to_host: bool = False) -> sp.csr_matrix:
    """A @ B (on mask's pattern) for scipy CSR operands checked by the caller (``to_host``:
    the result is on the host whatever it says)."""
    return spgemm_csr(A.tocsr(), B.tocsr(), None if mask is None else mask.tocsr())


# -------------------------------------------------------------------------------- SpAdd
# One pass: row i of alpha*A + beta*B has at most len(A_i) + len(B_i) entries, so each chunk
# of rows writes from the slot A.indptr[r0] + B.indptr[r0] of its first row on, and the
# chunks' runs are closed up after (_close_up). The bound is at most the two inputs' size together (not a flop count, as
# SpGEMM's would be), and a counting pass would sort every unsorted row twice.
#
# A row of A or B that is sorted without duplicates (the usual case) is merged as it lies,
# each value scaled as it is read; any other is first sorted into a scratch row with its
# duplicates summed (scaled first, then added in storage order by a stable sort, as scipy's
# csr_binop_csr adds them) and merged from there, with a scale of 1.

@njit(nogil=True, inline="always")
def _ordered(indices, p0, p1):
    """Whether ``indices[p0:p1]`` is strictly increasing (``p0``, ``p1`` unsigned)."""
    for p in range(p0 + np.uint64(1), p1):
        if indices[p] <= indices[p - np.uint64(1)]:
            return False
    return True


@njit(nogil=True)
def _sum_sorted(indices, data, p0, p1, scale, cols, vals):
    """Row ``indices[p0:p1]`` in order, duplicates summed, into ``cols``/``vals``; its
    length (``p0``, ``p1`` unsigned)."""
    order = np.argsort(indices[p0:p1], kind="mergesort")
    w = -1
    for t in range(p1 - p0):
        p = p0 + np.uint64(order[t])
        k = indices[p]
        v = scale * data[p]
        if w >= 0 and cols[w] == k:
            vals[w] += v
        else:
            w += 1
            cols[w] = k
            vals[w] = v
    return w + 1


@njit(parallel=True, nogil=True)
def _spadd(starts, a_indptr, a_indices, a_data, alpha, b_indptr, b_indices, b_data, beta,
           one, c_indices, c_data, counts):
    for c in numba.prange(starts.shape[0] - 1):
        r0 = starts[c]
        r1 = starts[c + 1]
        la = 0
        lb = 0
        for i in range(r0, r1):
            la = max(la, np.int64(a_indptr[i + 1]) - np.int64(a_indptr[i]))
            lb = max(lb, np.int64(b_indptr[i + 1]) - np.int64(b_indptr[i]))
        a_cols = np.empty(la, dtype=a_indices.dtype)
        a_vals = np.empty(la, dtype=a_data.dtype)
        b_cols = np.empty(lb, dtype=b_indices.dtype)
        b_vals = np.empty(lb, dtype=b_data.dtype)
        w = np.int64(a_indptr[r0]) + np.int64(b_indptr[r0])  # the chunk's rows in a run
        for i in range(r0, r1):
            # unsigned positions: no wraparound check on each read (see _symbolic)
            pa = np.uint64(a_indptr[i])
            pb = np.uint64(b_indptr[i])
            ea = np.uint64(a_indptr[i + 1])
            eb = np.uint64(b_indptr[i + 1])
            if _ordered(a_indices, pa, ea):
                ac, av, sa = a_indices, a_data, alpha
            else:
                ea = np.uint64(_sum_sorted(a_indices, a_data, pa, ea, alpha, a_cols, a_vals))
                ac, av, sa, pa = a_cols, a_vals, one, np.uint64(0)
            if _ordered(b_indices, pb, eb):
                bc, bv, sb = b_indices, b_data, beta
            else:
                eb = np.uint64(_sum_sorted(b_indices, b_data, pb, eb, beta, b_cols, b_vals))
                bc, bv, sb, pb = b_cols, b_vals, one, np.uint64(0)
            first = w
            while pa < ea and pb < eb:
                ka = ac[pa]
                kb = bc[pb]
                if ka < kb:
                    k = np.int64(ka)
                    x = sa * av[pa]
                    pa += np.uint64(1)
                elif kb < ka:
                    k = np.int64(kb)
                    x = sb * bv[pb]
                    pb += np.uint64(1)
                else:
                    k = np.int64(ka)
                    x = sa * av[pa] + sb * bv[pb]
                    pa += np.uint64(1)
                    pb += np.uint64(1)
                if x != 0:
                    c_indices[w] = k
                    c_data[w] = x
                    w += 1
            for p in range(pa, ea):  # what is left of one row, the other done
                x = sa * av[p]
                if x != 0:
                    c_indices[w] = ac[p]
                    c_data[w] = x
                    w += 1
            for p in range(pb, eb):
                x = sb * bv[p]
                if x != 0:
                    c_indices[w] = bc[p]
                    c_data[w] = x
                    w += 1
            counts[i] = w - first


def spadd_csr(A: sp.csr_matrix, B: sp.csr_matrix, alpha: float = 1.0,
              beta: float = 1.0) -> sp.csr_matrix:
    """``alpha * A + beta * B`` on every core, as canonical CSR.

    Parameters
    ----------
    A, B : scipy CSR of shape (m, n)
        One float dtype, finite; indices int32 or int64, possibly unsorted and with
        duplicates.
    alpha, beta : float
        Applied in that dtype (each stored value scaled, then summed), as scipy's
        ``alpha * A + beta * B``.

    Returns
    -------
    scipy.sparse.csr_matrix of shape (m, n)
        Canonical, in A's dtype; sums that are exactly zero are not stored.

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> A = sp.csr_matrix(np.array([[1.0, 2.0], [0.0, 3.0]]))
    >>> C = spadd_csr(A, sp.identity(2, format="csr"), 2.0, -2.0)
    >>> C.toarray(), C.nnz
    (array([[0., 4.],
           [0., 4.]]), 2)
    """
    m, n = A.shape
    shape = (m, n)
    dtype = A.dtype
    a_ptr = A.indptr.astype(np.int64)
    b_ptr = B.indptr.astype(np.int64)
    slots = a_ptr + b_ptr
    upper = int(slots[-1])
    if m == 0 or n == 0 or upper == 0:
        return _empty(shape, dtype)
    starts = _chunk_starts(np.diff(slots) + 1, _MIN_CHUNK_COST)
    counts = np.empty(m, dtype=np.int64)
    c_indices = np.empty(upper, dtype=output_index_dtype(upper, shape))
    c_data = np.empty(upper, dtype=dtype)
    with np.errstate(over="ignore"):  # a factor past float32's range is inf, as in scipy
        alpha, beta = dtype.type(alpha), dtype.type(beta)
    _dynamic(_spadd, starts, A.indptr, A.indices, A.data, alpha, B.indptr, B.indices,
             B.data, beta, dtype.type(1), c_indices, c_data, counts)
    return _finish(starts, slots, counts, c_indices, c_data, shape)


@spadd_lookup.register((sp.spmatrix, sp.sparray))
def _spadd_host(A, B, alpha: float = 1.0, beta: float = 1.0) -> sp.csr_matrix:
    """alpha * A + beta * B for scipy CSR operands checked by the caller."""
    return spadd_csr(A.tocsr(), B.tocsr(), alpha, beta)
