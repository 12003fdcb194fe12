"""CPU backend: numpy, scipy and numba."""
from __future__ import annotations

import numba
import numpy as np
import scipy.sparse as sp

from mgpu.backends.dispatch import (
    jaccard_lookup,
    namm_lookup,
    row_norms_lookup,
    sddmm_lookup,
    sddmm_plan_lookup,
)
from mgpu.backends.jit import njit
from mgpu.backends.knn_codes import KnnOp
from mgpu.backends.sddmm_plan import SDDMMPlan, pattern_key

# Reductions of a row, shared with the GPU kernel's OP template argument (kernels/rows.cu).
ROW_SUM, ROW_ABS_SUM, ROW_SQ_SUM, ROW_ABS_MAX = 0, 1, 2, 3


def narrow(r, dtype):
    """A float64 result in the output dtype. A value past float32's range becomes inf, as
    the float32 kernels (SDDMM's) give it, without numpy's overflow warning: the warning
    names no operation, and under ``-W error`` it turns a valid input into a crash."""
    with np.errstate(over="ignore"):
        return r.astype(dtype, copy=False)


@njit(parallel=True, nogil=True)
def _csr_row_reduce(indptr, data, op, out):
    n = out.shape[0]
    for i in numba.prange(n):
        acc = 0.0
        for p in range(indptr[i], indptr[i + 1]):
            v = np.float64(data[p])
            if op == 0:
                acc += v
            elif op == 1:
                acc += abs(v)
            elif op == 2:
                acc += v * v
            else:
                av = abs(v)
                # NaN must win, as it does in numpy's reductions.
                if av > acc or av != av:
                    acc = av
        out[i] = acc


def dense_row_reduce(X, op: int, xp=np):
    """Per-row reduction of a dense matrix on numpy or cupy (``xp``), in float64."""
    X64 = X.astype(xp.float64, copy=False)
    if op == ROW_SUM:
        r = X64.sum(axis=1)
    elif op == ROW_ABS_SUM:
        r = xp.abs(X64).sum(axis=1)
    elif op == ROW_SQ_SUM:
        r = (X64 * X64).sum(axis=1)
    elif X.shape[1] == 0:
        r = xp.zeros(X.shape[0], dtype=xp.float64)
    else:
        r = xp.abs(X64).max(axis=1)
    return narrow(r, X.dtype)


def row_reduce_csr(X: sp.csr_matrix, op: int) -> np.ndarray:
    """Per-row reduction of a canonical float CSR matrix, accumulated in float64."""
    out = np.empty(X.shape[0], dtype=np.float64)
    _csr_row_reduce(X.indptr, X.data, op, out)
    return narrow(out, X.dtype)


@row_norms_lookup.register((sp.spmatrix, sp.sparray))
def _row_reduce_sparse(X, op: int):
    return row_reduce_csr(X, op)


@row_norms_lookup.register(np.ndarray)
def _row_reduce_dense(X, op: int):
    return dense_row_reduce(X, op)


# Nonzeros per parallel work item of the CPU SDDMM: rows are found by binary search on
# indptr (merge-path style), so one very long row never lands on one thread alone.
_SDDMM_CHUNK = 2048


# reassoc/contract let LLVM vectorise the dot products (a reordered float64 sum, still far
# inside float32 output precision); no flag that changes NaN/inf handling is set.
@njit(parallel=True, nogil=True, fastmath={"reassoc", "contract"})
def _sddmm_csr(indptr, indices, data, A, B, hadamard, out):
    nnz = indices.shape[0]
    K = A.shape[1]
    n_chunks = (nnz + _SDDMM_CHUNK - 1) // _SDDMM_CHUNK
    for c in numba.prange(n_chunks):
        p0 = c * _SDDMM_CHUNK
        p1 = min(nnz, p0 + _SDDMM_CHUNK)
        i = np.searchsorted(indptr, p0, side="right") - 1
        for p in range(p0, p1):
            while indptr[i + 1] <= p:
                i += 1
            j = indices[p]
            acc = 0.0
            for k in range(K):
                acc += np.float64(A[i, k]) * np.float64(B[j, k])
            if hadamard:
                acc *= np.float64(data[p])
            out[p] = acc


def sddmm_csr(S: sp.csr_matrix, A: np.ndarray, B: np.ndarray, hadamard: bool) -> sp.csr_matrix:
    """P = S ∘ (A Bᵀ) (or the plain sampled product) on S's pattern, accumulated in float64.

    ``A`` and ``B`` are C-contiguous and of one float dtype, which is the output's.
    """
    out = np.empty(S.nnz, dtype=A.dtype)
    _sddmm_csr(S.indptr, S.indices, S.data, A, B, hadamard, out)
    return sp.csr_matrix((out, S.indices.copy(), S.indptr.copy()), shape=S.shape)


@sddmm_lookup.register((sp.spmatrix, sp.sparray))
def _sddmm_sparse(S, A, B, hadamard: bool, plan=None):
    return sddmm_csr(S, A, B, hadamard)


@sddmm_plan_lookup.register((sp.spmatrix, sp.sparray))
def _plan_sddmm(S, K: int, dtype: np.dtype, scheme: str | None = None) -> SDDMMPlan:
    """The CPU plan: one kernel, nothing tuned or tiled; S's pattern for the plan's check."""
    if scheme is not None:
        raise ValueError("The 'scheme' parameter of sddmm_plan applies to GPU input only.")
    return SDDMMPlan(scheme="cpu", device="cpu", shape=tuple(S.shape), nnz=int(S.nnz),
                     K=int(K), dtype=dtype.name, Tj=S.shape[1], Tk=int(K), ti=0, lanes=1,
                     vector=1, n_panels=1, l2_bytes=0, smem_bytes=0, pattern=pattern_key(S))


# ------------------------------------------------------------------ union (NAMM) distances
# The union operations of kernels/knn.cu's KnnOp (mgpu.backends.knn_codes), as plain ints:
# numba folds module-level ints into the compiled code as constants.
_L1, _LINF, _LP = int(KnnOp.L1), int(KnnOp.LINF), int(KnnOp.LP)
_CANBERRA, _HAMMING, _JS = int(KnnOp.CANBERRA), int(KnnOp.HAMMING), int(KnnOp.JS)


@numba.njit(inline="always")
def _namm_term(x, y, op, p):
    d = abs(x - y)
    if op == _L1 or op == _LINF:
        return d
    if op == _LP:
        return d ** p
    if op == _CANBERRA:
        s = abs(x) + abs(y)
        return d / s if s > 0 else 0.0
    if op == _HAMMING:
        return 1.0 if x != y else 0.0
    # Jensen-Shannon on normalised rows: x ln(2x/(x+y)) + y ln(2y/(x+y)), 0 ln 0 = 0
    m = x + y
    t = 0.0
    if x > 0:
        t += x * np.log(2.0 * x / m)
    if y > 0:
        t += y * np.log(2.0 * y / m)
    return t


# The union metrics are sums (L∞: a max) of a term t(x, y) over the union of two rows'
# nonzeros, t symmetric and t(0, 0) = 0. Both kernels below take three partial sums, each in
# increasing feature order: over the features both rows hold, over those only x holds, and
# over those only y holds, and combine them as both + (x-only + y-only). Nothing is
# subtracted, so a large shared entry cannot swallow a small unshared one (as it did in a sum
# of t(x, 0) over x's row with the terms at y's features swapped out); and since t is
# symmetric and the last addition commutes, d(x, y) == d(y, x) to the last bit. Both kernels
# give the same bits (the merge is for feature spaces too wide to scatter a row).


def _namm_kernels(op: int):
    """The union kernels of one operation (``op`` a compile-time constant in them, so the
    term is chosen once, not at every nonzero): scattered rows, and the merge."""

    @numba.njit(inline="always")
    def add(acc, t):
        return max(acc, t) if op == _LINF else acc + t

    @numba.njit(inline="always")
    def finish(both, xonly, yonly, n_features, p):
        acc = add(both, add(xonly, yonly))
        if op == _LP:
            return acc ** (1.0 / p)
        if op == _HAMMING:
            return acc / n_features if n_features > 0 else 0.0
        if op == _JS:
            return np.sqrt(max(acc, 0.0) / 2.0)
        return acc

    @numba.njit(parallel=True, nogil=True)
    def scattered(xp, xi, xd, yp, yi, yd, n_features, p, out):
        # x's row scattered dense: a pair costs a walk of y's row (which stamps the features
        # it holds) and one of x's row (which skips the stamped ones). A term goes to one
        # partial sum and an exact 0 to the other (selects, not branches: the branch on
        # whether x holds a feature mispredicts); t(w, y) is t(0, y) where x is 0.
        for a in numba.prange(out.shape[0]):
            w = np.zeros(n_features)
            held = np.zeros(n_features, dtype=np.bool_)
            stamp = np.zeros(n_features, dtype=np.int64)
            i0, i1 = xp[a], xp[a + 1]
            alone = np.empty(i1 - i0)  # t(x, 0) of x's nonzeros
            for i in range(i0, i1):
                w[xi[i]] = xd[i]
                held[xi[i]] = True
                alone[i - i0] = _namm_term(xd[i], 0.0, op, p)
            for b in range(out.shape[1]):
                both = 0.0
                yonly = 0.0
                for j in range(yp[b], yp[b + 1]):
                    f = yi[j]
                    stamp[f] = b + 1
                    t = _namm_term(w[f], yd[j], op, p)
                    h = held[f]
                    both = add(both, t if h else 0.0)
                    yonly = add(yonly, 0.0 if h else t)
                xonly = 0.0
                for i in range(i0, i1):
                    xonly = add(xonly, alone[i - i0] if stamp[xi[i]] != b + 1 else 0.0)
                out[a, b] = finish(both, xonly, yonly, n_features, p)

    @numba.njit(parallel=True, nogil=True)
    def merged(xp, xi, xd, yp, yi, yd, n_features, p, out):
        for a in numba.prange(out.shape[0]):
            for b in range(out.shape[1]):
                i, i1 = xp[a], xp[a + 1]
                j, j1 = yp[b], yp[b + 1]
                both = 0.0
                xonly = 0.0
                yonly = 0.0
                while i < i1 or j < j1:
                    if j >= j1 or (i < i1 and xi[i] < yi[j]):
                        xonly = add(xonly, _namm_term(xd[i], 0.0, op, p))
                        i += 1
                    elif i >= i1 or yi[j] < xi[i]:
                        yonly = add(yonly, _namm_term(0.0, yd[j], op, p))
                        j += 1
                    else:
                        both = add(both, _namm_term(xd[i], yd[j], op, p))
                        i += 1
                        j += 1
                out[a, b] = finish(both, xonly, yonly, n_features, p)

    return scattered, merged


_NAMM_KERNELS = {op: _namm_kernels(op) for op in (_L1, _LINF, _LP, _CANBERRA, _HAMMING, _JS)}
_SCATTER_MAX = 1 << 22  # features up to which a row of x is scattered dense (68 MiB a thread)


@namm_lookup.register((sp.spmatrix, sp.sparray))
def _namm_sparse(X, Y, op: int, p: float) -> np.ndarray:
    """Union distances between the rows of two float64 CSR matrices with sorted indices and
    no stored zeros (a stored zero would move a term between the partial sums)."""
    out = np.empty((X.shape[0], Y.shape[0]), dtype=np.float64)
    scattered, merged = _NAMM_KERNELS[op]
    kernel = scattered if X.shape[1] <= _SCATTER_MAX else merged
    kernel(X.indptr, X.indices, X.data, Y.indptr, Y.indices, Y.data, X.shape[1], float(p), out)
    return out


# ------------------------------------------------- sparse X · sparse Yᵀ into a dense block


@numba.njit(parallel=True, nogil=True)
def _csr_dot_csc(xp, xi, xd, ycp, yri, yd, out):
    # Y in CSC is an inverted index (feature -> the rows of Y that hold it): each row of X
    # walks the postings of its features and accumulates straight into its output row.
    for q in numba.prange(out.shape[0]):
        row = out[q]
        for a in range(xp[q], xp[q + 1]):
            t = xi[a]
            v = xd[a]
            for b in range(ycp[t], ycp[t + 1]):
                row[yri[b]] += v * yd[b]


def csr_dot_dense(X: sp.csr_matrix, Y: sp.spmatrix) -> np.ndarray:
    """X·Yᵀ as a dense float64 array for sparse X and Y, in parallel over X's rows.

    Work is Σ over X's nonzeros of their features' counts in Y (what a sparse-sparse product
    does), written into the dense result without an intermediate sparse matrix.
    """
    X = sp.csr_matrix(X, dtype=np.float64)
    Yc = sp.csc_matrix(Y, dtype=np.float64)
    out = np.zeros((X.shape[0], Yc.shape[0]), dtype=np.float64)
    _csr_dot_csc(X.indptr, X.indices, X.data, Yc.indptr, Yc.indices, Yc.data, out)
    return out


# ------------------------------------------------------------------ correlation (sparse)
# Pearson's correlation of sparse rows without Σxy - n·mx·my (which cancels completely for
# rows with a large offset). With P the stored features of a row, B = Px ∩ Py, and the row's
# centred values u = x - mx, w = y - my, the centred product over every feature is
#   cov = Σ_B u·w - my·(Rx - Σ_B u) - mx·(Ry - Σ_B w) + (n - |Px| - |Py| + |B|)·mx·my,
# Rx = Σ_Px u (the row's own sum, in feature order). Each term is bounded by the centred
# norms (a row with an implicit zero has |mx| <= |u|/sqrt(n - |Px|)), except where a row
# stores every feature: then its mean may be far larger than its spread, but B is the other
# row's whole pattern and Rx - Σ_B u is two equal sums in the same order, exactly 0. The
# sums over B come from one pass over the postings, as the dot product's.


@numba.njit(parallel=True, nogil=True)
def _centred_csr_stats(indptr, data, n, mean, resid, var):
    for r in numba.prange(mean.shape[0]):
        i0, i1 = indptr[r], indptr[r + 1]
        k = i1 - i0
        # constant iff every entry, implicit zeros included, is equal: then the mean is that
        # value exactly and every centred value is exactly 0 (zero variance, decided exactly)
        constant = True
        c = data[i0] if k == n and k > 0 else 0.0
        s = 0.0
        for i in range(i0, i1):
            v = np.float64(data[i])
            s += v
            if v != c:
                constant = False
        m = c if constant else s / n
        u = 0.0
        q = 0.0
        for i in range(i0, i1):
            d = np.float64(data[i]) - m
            u += d
            q += d * d
        mean[r] = m
        resid[r] = u
        var[r] = q + ((n - k) * m) * m


def centred_stats_csr(X: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of a canonical CSR matrix: the mean (a constant row's value exactly), the sum
    of the centred stored values in feature order, and the centred squared norm over every
    feature (exactly 0 for a constant row)."""
    rows, n = X.shape
    mean, resid, var = (np.zeros(rows) for _ in range(3))
    if rows and n:
        _centred_csr_stats(X.indptr, X.data, n, mean, resid, var)
    return mean, resid, var


@numba.njit(parallel=True, nogil=True)
def _correlation_csr(xp, xi, xd, mx, rx, vx, ycp, yri, yd, ynnz, my, ry, vy, n, out):
    ny = out.shape[1]
    for a in numba.prange(out.shape[0]):
        s1 = out[a]
        s1[:] = 0.0
        s2 = np.zeros(ny)
        s3 = np.zeros(ny)
        both = np.zeros(ny)
        for i in range(xp[a], xp[a + 1]):
            f = xi[i]
            u = xd[i] - mx[a]
            for jb in range(ycp[f], ycp[f + 1]):
                b = yri[jb]
                w = yd[jb] - my[b]
                s1[b] += u * w
                s2[b] += u
                s3[b] += w
                both[b] += 1.0
        nx = xp[a + 1] - xp[a]
        sx = np.sqrt(vx[a])
        for b in range(ny):
            den = sx * np.sqrt(vy[b])
            if den > 0:  # else a zero-variance row: distance 1 from every row
                cov = (s1[b] - my[b] * (rx[a] - s2[b]) - mx[a] * (ry[b] - s3[b])
                       + ((n - nx - ynnz[b] + both[b]) * mx[a]) * my[b])
                d = 1.0 - cov / den
                s1[b] = min(max(d, 0.0), 2.0)
            else:
                s1[b] = 1.0


def correlation_csr(X: sp.csr_matrix, Y: sp.csr_matrix) -> np.ndarray:
    """Correlation distances between the rows of two canonical float64 CSR matrices."""
    out = np.empty((X.shape[0], Y.shape[0]), dtype=np.float64)
    if not out.size:
        return out
    n = X.shape[1]
    mx, rx, vx = centred_stats_csr(X)
    my, ry, vy = centred_stats_csr(Y)
    Yc = sp.csc_matrix(Y)
    ynnz = np.diff(Y.indptr).astype(np.float64)
    _correlation_csr(X.indptr, X.indices, X.data, mx, rx, vx, Yc.indptr, Yc.indices, Yc.data,
                     ynnz, my, ry, vy, float(n), out)
    return out


# ------------------------------------------------------------------ Jaccard edge weights

_GALLOP = 16  # a row this many times longer than the other is searched, not merged


@numba.njit(inline="always")
def _lower_bound(indices, lo, hi, v):
    while lo < hi:
        mid = (lo + hi) >> 1
        if indices[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(inline="always")
def _edge_jaccard(indptr, indices, data, i, j, weighted):
    """Jaccard weight of edge (i, j): |N(i) ∩ N(j)| / |N(i) ∪ N(j)|, or for weights the sum
    of the smaller weight over the union divided by the sum of the larger."""
    a, a1 = indptr[i], indptr[i + 1]
    b, b1 = indptr[j], indptr[j + 1]
    if not weighted:
        la, lb = a1 - a, b1 - b
        both = 0
        if la > _GALLOP * lb or lb > _GALLOP * la:
            if la < lb:  # search the short row's features in the long one
                a, a1, b, b1 = b, b1, a, a1
            lo = a
            for q in range(b, b1):
                lo = _lower_bound(indices, lo, a1, indices[q])
                if lo < a1 and indices[lo] == indices[q]:
                    both += 1
        else:
            while a < a1 and b < b1:
                if indices[a] < indices[b]:
                    a += 1
                elif indices[b] < indices[a]:
                    b += 1
                else:
                    both += 1
                    a += 1
                    b += 1
        return both / (la + lb - both)
    small = 0.0
    large = 0.0
    while a < a1 or b < b1:
        if b >= b1 or (a < a1 and indices[a] < indices[b]):
            large += data[a]
            a += 1
        elif a >= a1 or indices[b] < indices[a]:
            large += data[b]
            b += 1
        else:
            small += min(data[a], data[b])
            large += max(data[a], data[b])
            a += 1
            b += 1
    return small / large if large > 0 else 0.0


@njit(parallel=True, nogil=True)
def _jaccard_rows(indptr, indices, data, r0, r1, weighted, out):
    base = indptr[r0]
    for i in numba.prange(r0, r1):
        for p in range(indptr[i], indptr[i + 1]):
            out[p - base] = _edge_jaccard(indptr, indices, data, i, indices[p], weighted)


@jaccard_lookup.register((sp.spmatrix, sp.sparray))
def _jaccard_sparse(G, weighted: bool, r0: int, r1: int) -> np.ndarray:
    """Jaccard weights of the edges of rows r0..r1 of a checked graph (canonical CSR, no
    self-loops, symmetric), in the order of G's nonzeros; float64."""
    out = np.empty(int(G.indptr[r1] - G.indptr[r0]), dtype=np.float64)
    if r1 <= r0:
        return out  # no rows (a graph without nodes): no kernel call
    data = G.data.astype(np.float64, copy=False)
    _jaccard_rows(G.indptr, G.indices, data, r0, r1, weighted, out)
    return out
