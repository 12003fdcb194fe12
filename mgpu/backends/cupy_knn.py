"""GPU pairwise distances and exact kNN: CuPy input, the kernels of ``kernels/knn.cu``.

The index (CSR, or dense turned CSR) is prepared once: values transformed as its metric
needs (pattern, square root, logarithm, rows normalised), rows ordered longest first for
the kernel's row counter, per-row statistics in float64. Queries come in batches held dense
(features × queries), as many as keep that block in half the L2 and within the working
memory. Each batch runs one fused kernel (dot/union pass, element-wise finish, per-lane top-k
lists) and one selection over the k candidates each warp left.

Dense index and queries with an expanded metric go through cuBLAS (``cupy.matmul``) instead:
dot products per batch, finished in place, then the same selection; for correlation, of
the rows centred first (a cosine of centred rows).

The union metrics and correlation of sparse (or mixed) input walk the union of each pair's
nonzeros in the fused kernel, with the batch's queries as CSR (see ``kernels/knn.cu``): no
sum of a query's own terms is subtracted (which cancelled), and the union metrics are
symmetric to the last bit.

Arithmetic is in float64 (accumulators, statistics, the finish); keys and results are in
the input's dtype (float32 or float64).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cupy
import cupyx.scipy.sparse as csp
import numpy as np
from dask.utils import format_bytes

from mgpu.backends import cupy_knn_postings as postings
from mgpu.backends.cupy import current_facts, row_reduce_csr_kernel
from mgpu.backends.dispatch import (
    distances_lookup,
    knn_input_lookup,
    knn_lookup,
    knn_prepare_lookup,
    knn_prepared_lookup,
)
from mgpu.backends.instances import KNN_GROUPS
from mgpu.backends.knn_codes import KNN_CODES, KnnOp
from mgpu.backends.loader import c_type, get_function
from mgpu.backends.memory import DeviceMemoryError, require_gpu
from mgpu.backends.numpy import ROW_SUM

logger = logging.getLogger(__name__)

_THREADS = 256
_BLOCKS_PER_SM = 4
_FUSED_KMAX = (16, 128)  # list lengths the fused kernel is built with
_LANES_PER_WARP = 32
_TILE_K = 1 << 30  # a k that no fused list holds: the key-tile form

OP_DOT, OP_LINF = int(KnnOp.DOT), int(KnnOp.LINF)  # the operations with a path of their own
OP_CORRELATION = int(KnnOp.CORRELATION)
# the operations that walk the union of the two rows with the queries as CSR (knn.cu)
UNION_WALK = frozenset(int(op) for op in (KnnOp.L1, KnnOp.LP, KnnOp.CANBERRA, KnnOp.JS,
                                          KnnOp.CORRELATION))
# L1's sums are exact below this when every value is an integer (knn.cu's OP_L1_COUNTS)
_EXACT_SUM = float(2**52)

Stats = Callable[[csp.csr_matrix, float], tuple[Any, Any]]


def _row_sum(X: csp.csr_matrix, fn: Callable[[Any], Any]) -> cupy.ndarray:
    """Σ fn(value) over each row's stored values, in float64."""
    Y = csp.csr_matrix((fn(X.data.astype(cupy.float64)), X.indices, X.indptr), shape=X.shape)
    return row_reduce_csr_kernel(Y, ROW_SUM)


def _nnz(X: csp.csr_matrix) -> cupy.ndarray:
    return cupy.diff(X.indptr).astype(cupy.float64)


def _none(X: csp.csr_matrix, p: float) -> tuple[None, None]:
    return None, None


def _sq(X, p):
    return _row_sum(X, cupy.square), None


def _norm(X, p):
    return cupy.sqrt(_row_sum(X, cupy.square)), None


def _centred(X, p):
    """Row means and centred norms over every feature, decided exactly for constant rows
    (mean the value itself, norm 0): the ``mgpu_centred_stats`` kernel, one thread a row."""
    mean = cupy.zeros(X.shape[0], dtype=cupy.float64)
    norm = cupy.zeros(X.shape[0], dtype=cupy.float64)
    if X.shape[0] and X.shape[1]:
        t = c_type(X.dtype)
        fn = _kernel(f"op{OP_CORRELATION}-{t}", f"mgpu_centred_stats<{t}>")
        fn((-(-X.shape[0] // _THREADS),), (_THREADS,),
           (X.indptr, X.data, np.int32(X.shape[0]), np.float64(X.shape[1]), mean, norm))
    return mean, norm


def _count(X, p):
    return _nnz(X), None


def _xlogx(X, p):
    return _row_sum(X, lambda v: v * cupy.log(v)), _nnz(X)


def _abs_sum(X, p):
    return _row_sum(X, cupy.abs), None


def _counts(X: csp.csr_matrix) -> bool:
    """Whether every value of X is an integer and every row's Σ|x| is below 2^52: the L1
    sums of two such rows are then exact (the dense-block form of knn.cu gives the walk's
    bits)."""
    if X.nnz == 0:
        return True
    v = X.data
    return bool((v == cupy.trunc(v)).all()) and float(_row_sum(X, cupy.abs).max()) < _EXACT_SUM


def _pattern(v):
    return cupy.ones_like(v)


@dataclass(frozen=True)
class Form:
    """How the GPU computes one metric of :data:`mgpu.ops.distances.SEMIRINGS`."""

    op: int  # accumulated operation
    fin: int  # element-wise finish
    x_values: Callable[[Any], Any] | None = None  # transform of the index's values
    q_values: Callable[[Any], Any] | None = None  # of the queries' values
    x_stats: Stats = _none  # per-row statistics of the (normalised) raw index rows
    q_stats: Stats = _none
    normalise: bool = False  # rows scaled to sum 1 first (Jensen-Shannon)


def _form(metric: str, *args: Any, **kwargs: Any) -> Form:
    """The Form of ``metric`` with its codes from :data:`mgpu.backends.knn_codes.KNN_CODES`."""
    op, fin = KNN_CODES[metric]
    return Form(int(op), int(fin), *args, **kwargs)


FORMS: dict[str, Form] = {
    "euclidean": _form("euclidean", x_stats=_sq, q_stats=_sq),
    "sqeuclidean": _form("sqeuclidean", x_stats=_sq, q_stats=_sq),
    "cosine": _form("cosine", x_stats=_norm, q_stats=_norm),
    "correlation": _form("correlation", x_stats=_centred, q_stats=_centred),
    "inner_product": _form("inner_product"),
    "dice": _form("dice", _pattern, _pattern, _count, _count),
    "jaccard": _form("jaccard", _pattern, _pattern, _count, _count),
    "russellrao": _form("russellrao", _pattern, _pattern),
    "hellinger": _form("hellinger", cupy.sqrt, cupy.sqrt),
    "kl_divergence": _form("kl_divergence", x_values=cupy.log, q_stats=_xlogx),
    "manhattan": _form("manhattan"),
    "minkowski": _form("minkowski"),
    "canberra": _form("canberra"),
    "hamming": _form("hamming", q_stats=_count),
    "jensenshannon": _form("jensenshannon", normalise=True),
    "chebyshev": _form("chebyshev"),
}
# manhattan between rows of counts (both sides checked by _counts)
_L1_COUNTS = Form(int(KnnOp.L1_COUNTS), FORMS["manhattan"].fin, q_stats=_abs_sum)


# ------------------------------------------------------------------------------ input


def device_input(X: Any) -> Any:
    """X (a real 2-D array or sparse matrix, host or device, its kind and shape checked by
    :func:`mgpu.ops.distances.check_knn_input`) on the device as the kernels take it:
    float32/float64 (other reals become float64), CSR with summed duplicates, sorted indices
    and no stored zeros, or a C-ordered dense array."""
    if isinstance(X, np.ndarray) or type(X).__module__.startswith("scipy"):
        X = csp.csr_matrix(X) if hasattr(X, "tocsr") else cupy.asarray(X)
    dtype = X.dtype if X.dtype.name in ("float32", "float64") else np.dtype(np.float64)
    if csp.issparse(X):
        X = csp.csr_matrix(X, dtype=dtype, copy=True)
        X.sum_duplicates()
        X = _without_zeros(X)
        X.sort_indices()
        return X
    return cupy.ascontiguousarray(X, dtype=dtype)


def _without_zeros(X: csp.csr_matrix) -> csp.csr_matrix:
    """X without stored zeros. (cupyx's eliminate_zeros goes through cuSPARSE's compress,
    which on the CUDA 13 stack also loses negative values.)"""
    keep = X.data != 0
    if bool(keep.all()):
        return X
    rows = cupy.searchsorted(X.indptr, cupy.arange(X.nnz), side="right") - 1
    counts = cupy.bincount(rows[keep], minlength=X.shape[0])
    indptr = cupy.concatenate([cupy.zeros(1, X.indptr.dtype), cupy.cumsum(counts)]).astype(
        X.indptr.dtype)
    return csp.csr_matrix((X.data[keep], X.indices[keep], indptr), shape=X.shape)


def _as_csr(X: Any) -> csp.csr_matrix:
    if csp.issparse(X):
        return X
    C = csp.csr_matrix(X)  # drops the zeros of a dense array
    # ...but leaves the indices of larger arrays unsorted, and the union walk and the
    # merge kernels take each row in feature order
    C.sort_indices()
    return C


def _normalised(X: csp.csr_matrix) -> csp.csr_matrix:
    # a row's sum depends on the row alone (one warp per row), so a query equal to an index
    # row is scaled exactly as that row is, whatever matrix each sits in
    sums = row_reduce_csr_kernel(X, ROW_SUM).astype(cupy.float64)
    scale = 1.0 / sums
    rows = cupy.searchsorted(X.indptr, cupy.arange(X.nnz), side="right") - 1
    data = (X.data.astype(cupy.float64) * scale[rows]).astype(X.dtype)
    return csp.csr_matrix((data, X.indices, X.indptr), shape=X.shape)


def _transformed(X: csp.csr_matrix, fn: Callable[[Any], Any] | None) -> csp.csr_matrix:
    if fn is None:
        return X
    data = fn(X.data.astype(cupy.float64)).astype(X.dtype)
    return csp.csr_matrix((data, X.indices, X.indptr), shape=X.shape)


# ------------------------------------------------------------------------------ index


@dataclass
class GpuIndex:
    """An index prepared for one metric on the current device (checked input only)."""

    metric: str
    p: float
    X: csp.csr_matrix  # values transformed for the kernel
    order: cupy.ndarray  # rows, longest first (int32)
    s1: cupy.ndarray | None
    s2: cupy.ndarray | None
    dense: cupy.ndarray | None  # transformed dense rows, kept for the cuBLAS path
    counts: bool = False  # manhattan: integer values, sums exact (_counts)
    postings: Any = None  # the inverted view (cupy_knn_postings), made when first weighed

    @property
    def shape(self) -> tuple[int, int]:
        return self.X.shape

    @property
    def dtype(self) -> np.dtype:
        return self.X.dtype


def _csr_bytes(X: Any) -> int:
    """Device bytes of X in CSR form, at most (a dense X counted as if no entry were zero)."""
    nnz = int(X.nnz) if isinstance(X, csp.spmatrix) else int(X.size)
    return nnz * (np.dtype(X.dtype).itemsize + 4) + (X.shape[0] + 1) * 4


def prepare_index(X: Any, metric: str, p: float) -> GpuIndex:
    """The index of checked input ``X`` (:func:`device_input`) made ready for ``metric``.

    Raises :class:`DeviceMemoryError` first when the device cannot hold its copies (the
    index transformed, and normalised for the cosine family, with row statistics)."""
    form = FORMS[metric]
    require_gpu(2 * _csr_bytes(X) + X.shape[0] * (4 + 2 * np.dtype(X.dtype).itemsize),
                f"A kNN index of {X.shape[0]:,}×{X.shape[1]:,} ({metric})",
                "Split it into row tiles over several GPUs (mgpu.from_scipy(..., axis=0)).")
    C = _as_csr(X)
    if C.nnz >= 2**31:
        raise ValueError(f"The index has {C.nnz} nonzeros; one GPU tile takes fewer than 2^31. "
                         "Split it over workers (mgpu.from_scipy(..., axis=0)).")
    if form.normalise:
        C = _normalised(C)
    s1, s2 = form.x_stats(C, p)
    Xt = _transformed(C, form.x_values)
    order = cupy.argsort(-cupy.diff(Xt.indptr), kind="stable").astype(cupy.int32)
    return GpuIndex(metric, p, Xt, order, s1, s2, _dense_rows(X, form, s1),
                    metric == "manhattan" and _counts(C))


def _dense_rows(X: Any, form: Form, s1: Any) -> cupy.ndarray | None:
    """Dense rows for the cuBLAS path (a dense X and a dot-product metric without a value
    transform), centred by their means ``s1`` for correlation; None for the fused kernel."""
    if not isinstance(X, cupy.ndarray):
        return None
    if form.op == OP_CORRELATION:
        return X - s1.astype(X.dtype)[:, None]  # a constant row: exactly 0
    return X if form.op == OP_DOT and form.x_values is None else None


# ----------------------------------------------------------------------------- batches


def _kernel(group: str, expression: str):
    return get_function("knn.cu", expression, KNN_GROUPS[group])


def _warps(n_rows: int) -> tuple[int, int]:
    sms = current_facts().sms
    blocks = max(1, min(sms * _BLOCKS_PER_SM, -(-n_rows // (_THREADS // 32))))
    return blocks, blocks * (_THREADS // 32)


def query_bytes(index: GpuIndex, k: int, dense: bool = False) -> int:
    """Device bytes one query of a batch takes: its dense column and its candidates (or its
    row of keys); ``dense`` for the cuBLAS path, a row of distances and ids."""
    n_rows, n_features = index.shape
    item = index.dtype.itemsize
    if dense:
        return n_rows * (item + 8)
    _, n_warps = _warps(n_rows)
    return n_features * item + (
        n_warps * k * (item + 4) if _fused_kmax(k) else n_rows * (item + 8))


def batch_size(index: GpuIndex, n_queries: int, k: int, budget: int) -> int:
    """Queries per kernel launch: the dense query block in half the L2 and, with the
    candidates (or the key tile) of the launch, within ``budget`` bytes."""
    n_features = index.shape[1]
    item = index.dtype.itemsize
    l2 = current_facts().l2_bytes
    lanes = 32 if _fused_kmax(k) == 128 else 4 * _LANES_PER_WARP
    per_query = query_bytes(index, k)
    fit_l2 = (l2 // 2) // max(1, n_features * item)
    nb = int(max(1, min(lanes, n_queries, fit_l2, budget // max(1, per_query))))
    return nb - nb % 32 if nb > 32 else nb  # whole warps of queries


def _fused_kmax(k: int) -> int:
    """The list length of the fused kernel for k, or 0 for the key-tile form."""
    return next((m for m in _FUSED_KMAX if k <= m), 0)


@dataclass
class QuerySet:
    """Checked queries made ready once for a prepared index: values in the kernel's form and
    per-row statistics (sparse), or the dense rows for the cuBLAS path."""

    C: csp.csr_matrix | None
    host_ptr: np.ndarray | None  # C.indptr on the host, to cut batches without syncing
    s1: cupy.ndarray | None
    s2: cupy.ndarray | None
    dense: cupy.ndarray | None
    form: Form  # the index's, or manhattan's exact form between counts

    @property
    def n(self) -> int:
        return (self.dense if self.dense is not None else self.C).shape[0]


def prepare_queries(index: GpuIndex, Q: Any) -> QuerySet:
    form = FORMS[index.metric]
    C = _as_csr(Q).astype(index.dtype)
    if index.counts and _counts(C):
        form = _L1_COUNTS
    if form.normalise:
        C = _normalised(C)
    s1, s2 = form.q_stats(C, index.p)
    if index.dense is not None and isinstance(Q, cupy.ndarray):
        return QuerySet(None, None, s1, s2, _dense_rows(Q.astype(index.dtype, copy=False),
                                                        form, s1), form)
    C = _transformed(C, form.q_values)
    if form.op in UNION_WALK:
        C.sort_indices()  # the union walk takes each query's nonzeros in feature order
    return QuerySet(C, C.indptr.get(), s1, s2, None, form)


def _query_block(index: GpuIndex, qs: QuerySet, s: int, e: int, form: Form
                 ) -> tuple[Any, Any, Any, Any]:
    """Queries s..e as the kernel reads them: dense (features × queries; None for the union
    walk, which reads the CSR), their statistics, and their nonzeros as CSR relative to the
    batch, in feature order for the union walk, by decreasing |value| for L∞."""
    a, b = int(qs.host_ptr[s]), int(qs.host_ptr[e])
    ptr = (qs.C.indptr[s:e + 1] - a).astype(cupy.int32)
    ind, val = qs.C.indices[a:b], qs.C.data[a:b]
    qd = None
    lq = (None, None, None)
    if form.op in UNION_WALK:
        lq = (ptr, cupy.ascontiguousarray(ind, dtype=cupy.int32), cupy.ascontiguousarray(val))
    else:
        qd = cupy.zeros((index.shape[1], e - s), dtype=index.dtype)
        rows = cupy.searchsorted(ptr, cupy.arange(b - a), side="right") - 1
        qd[ind, rows] = val
        if form.op == OP_LINF:
            # per row: |value| descending (a stable sort of (row, -|value|) pairs)
            mag = cupy.abs(val)
            by = cupy.lexsort(cupy.stack([-mag, rows.astype(mag.dtype)]))
            lq = (ptr, ind[by].astype(cupy.int32), mag[by])

    def part(x):
        return None if x is None else x[s:e]

    return qd, part(qs.s1), part(qs.s2), lq


def _launch_fused(index: GpuIndex, form: Form, nb: int, qd: Any, s1: Any, s2: Any, lq: Any,
                  kmax: int, k: int, out_key: cupy.ndarray, out_id: Any, ld_out: int) -> None:
    X = index.X
    n_rows, n_features = X.shape
    t = c_type(X.dtype)
    lanes = 1 if kmax == 128 else 4
    blocks, _ = _warps(n_rows)
    fn = _kernel(f"op{form.op}-{t}", f"mgpu_knn_csr<{t}, int, {form.op}, {lanes}, {kmax}>")
    counter = cupy.zeros(1, dtype=cupy.int32)
    null = np.uintp(0)

    def ptr(a):
        return null if a is None else a

    fn((blocks,), (_THREADS,), (
        X.indptr, X.indices, X.data, index.order, np.int32(n_rows),
        ptr(qd), np.int32(nb),
        ptr(index.s1), ptr(index.s2), ptr(s1), ptr(s2),
        ptr(lq[0]), ptr(lq[1]), ptr(lq[2]),
        np.int32(form.fin), np.float64(n_features), np.float64(index.p), np.int32(k),
        counter, out_key, ptr(out_id), np.int64(ld_out)))


def _select(keys: cupy.ndarray, ids: cupy.ndarray | None, k: int) -> tuple[cupy.ndarray, cupy.ndarray]:
    """The k best of each row of ``keys`` (ties to the lower id)."""
    rows, m = keys.shape
    kmax = _fused_kmax(k)
    if kmax == 0:  # beyond the lists: a stable sort keeps the lower id first among ties
        order = cupy.argsort(keys, axis=1)[:, :k]
        sel_ids = order if ids is None else cupy.take_along_axis(ids, order, axis=1)
        return cupy.take_along_axis(keys, order, axis=1), sel_ids.astype(cupy.int32)
    out_key = cupy.empty((rows, k), dtype=keys.dtype)
    out_id = cupy.empty((rows, k), dtype=cupy.int32)
    if rows:
        fn = _kernel("select", f"mgpu_select_k<{c_type(keys.dtype)}, {kmax}>")
        fn((rows,), (_THREADS,), (keys, np.uintp(0) if ids is None else ids, np.int64(m),
                                  np.int32(k), out_key, out_id))
    return out_key, out_id


def _dense_dot_keys(index: GpuIndex, form: Form, qs: QuerySet, s: int, e: int,
                    out: cupy.ndarray) -> None:
    """Keys of dense queries s..e against a dense index: cuBLAS, then the finish in place."""
    cupy.matmul(qs.dense[s:e], index.dense.T, out=out)
    nb, n_rows = out.shape
    n = nb * n_rows
    if n:
        null = np.uintp(0)

        def ptr(x):
            return null if x is None else x

        fin, xs, qs_ = form.fin, (index.s1, index.s2), (qs.s1, qs.s2)
        if form.op == OP_CORRELATION:  # the rows are centred: a cosine with centred norms
            fin, xs, qs_ = int(KNN_CODES["cosine"][1]), (index.s2, None), (qs.s2, None)
        fn = _kernel("select", f"mgpu_finish_tile<{c_type(out.dtype)}>")
        fn((-(-n // _THREADS),), (_THREADS,), (
            out, np.int32(nb), np.int32(n_rows), np.int64(out.strides[0] // out.itemsize),
            ptr(xs[0]), ptr(xs[1]),
            ptr(None if qs_[0] is None else qs_[0][s:e]),
            ptr(None if qs_[1] is None else qs_[1][s:e]),
            np.int32(fin), np.float64(index.shape[1]), np.float64(index.p)))


def batch_keys(index: GpuIndex, qs: QuerySet, s: int, e: int, out: cupy.ndarray) -> None:
    """Every key of queries s..e against the index, into ``out`` (e - s × index rows)."""
    form = qs.form
    if qs.dense is not None:
        _dense_dot_keys(index, form, qs, s, e, out)
        return
    qd, s1, s2, lq = _query_block(index, qs, s, e, form)
    _launch_fused(index, form, e - s, qd, s1, s2, lq, 0, 0, out, None,
                  out.strides[0] // out.itemsize)


def batch_knn(index: GpuIndex, qs: QuerySet, s: int, e: int, k: int
              ) -> tuple[cupy.ndarray, cupy.ndarray]:
    """Keys and int32 ids of the k best index rows for queries s..e."""
    form = qs.form
    n_rows = index.shape[0]
    kmax = _fused_kmax(k)
    if kmax == 0 or qs.dense is not None:
        keys = cupy.empty((e - s, n_rows), dtype=index.dtype)
        batch_keys(index, qs, s, e, keys)
        return _select(keys, None, k)
    qd, s1, s2, lq = _query_block(index, qs, s, e, form)
    _, n_warps = _warps(n_rows)
    cand_key = cupy.empty((e - s, n_warps * k), dtype=index.dtype)
    cand_id = cupy.empty((e - s, n_warps * k), dtype=cupy.int32)
    _launch_fused(index, form, e - s, qd, s1, s2, lq, kmax, k, cand_key, cand_id, 0)
    return _select(cand_key, cand_id, k)


def knn_prepared(index: GpuIndex, queries: Any, k: int, similarity: bool, budget: int
                 ) -> tuple[cupy.ndarray, cupy.ndarray]:
    """kNN of checked queries against a prepared index; distances in the index's dtype.

    The batches' working memory is ``budget`` or what the device has left beside the
    queries and the results, whichever is smaller (one query a batch at least);
    :class:`DeviceMemoryError` when the device cannot hold one query."""
    nq = queries.shape[0]
    item = index.dtype.itemsize
    held = 2 * _csr_bytes(queries) + nq * (2 * item + k * (item + 8))  # queries' copies, results
    what = (f"kNN of {nq:,} queries (k={k}) against a {index.shape[0]:,}×{index.shape[1]:,} "
            "index")
    hint = "Pass fewer queries a call, or split the index over several GPUs."
    available = require_gpu(held, what, hint)
    dense = index.dense is not None and isinstance(queries, cupy.ndarray)
    one = query_bytes(index, k, dense)
    if available is not None:  # None: a CUDA graph is being captured, the device not asked
        room = available - held
        if one > room:
            raise DeviceMemoryError(f"{what} needs {format_bytes(one)} of GPU working memory "
                                    f"for one query beside its inputs and results; "
                                    f"{format_bytes(max(room, 0))} are available. {hint}")
        budget = min(budget, room)  # a batch is one query at least, whatever the budget
    qs = prepare_queries(index, queries)
    step = batch_size(index, nq, k, budget)
    if qs.dense is not None:
        step = int(max(1, min(nq, budget // max(1, one))))
    # wide corpora: the postings of the queries' features only (a measured choice)
    if postings.choose(index, qs, k, budget, lambda s, e: batch_knn(index, qs, s, e, k),
                       step) == "postings":
        return postings.knn_postings(index, qs, k, similarity, budget)
    dist = cupy.empty((nq, k), dtype=index.dtype)
    ids = cupy.empty((nq, k), dtype=cupy.int64)
    for s in range(0, nq, step):
        e = min(nq, s + step)
        d, i = batch_knn(index, qs, s, e, k)
        dist[s:e] = -d if similarity else d
        ids[s:e] = i
    return dist, ids


def _budget(working_memory: Any) -> int:
    from mgpu import config

    return config.get_bytes("knn.working-memory", working_memory)


def _as_dtype(Q: Any, dtype: Any) -> Any:
    return Q if Q.dtype == dtype else Q.astype(dtype)


@knn_input_lookup.register((cupy.ndarray, csp.spmatrix))
def _input(on: Any, X: Any) -> Any:
    return device_input(X)


@knn_prepare_lookup.register((cupy.ndarray, csp.spmatrix))
def prepare(X: Any, ring: Any, p: float) -> GpuIndex:
    """A checked index tile prepared where it lives (distributed kNN)."""
    return prepare_index(X, ring.name, p)


@knn_prepared_lookup.register(GpuIndex)
def _knn_prepared(index: GpuIndex, queries: Any, k: int, ring: Any, p: float,
                  working_memory: Any = None) -> tuple[cupy.ndarray, cupy.ndarray]:
    """kNN of checked host queries (a batch of distributed kNN) against a prepared tile."""
    Q = device_input(queries).astype(index.dtype, copy=False)
    return knn_prepared(index, Q, min(k, index.shape[0]), ring.similarity,
                        _budget(working_memory))


@knn_lookup.register((cupy.ndarray, csp.spmatrix))
def knn(index: Any, queries: Any, k: int, ring: Any, p: float, working_memory: Any = None
        ) -> tuple[cupy.ndarray, cupy.ndarray]:
    """:func:`mgpu.knn` for a checked CuPy index and queries: prepares, runs the batches."""
    prepared = prepare_index(index, ring.name, p)
    return knn_prepared(prepared, _as_dtype(queries, index.dtype), k, ring.similarity,
                        _budget(working_memory))


@distances_lookup.register((cupy.ndarray, csp.spmatrix))
def pairwise_distances(X: Any, Y: Any, ring: Any, p: float) -> cupy.ndarray:
    """:func:`mgpu.pairwise_distances` for checked CuPy input: rows of X against rows of Y
    (X itself when Y was None)."""
    # X's rows play the queries (held dense), Y's rows the index (walked by nonzeros)
    index, Q = Y, _as_dtype(X, Y.dtype)
    prepared = prepare_index(index, ring.name, p)
    require_gpu(Q.shape[0] * index.shape[0] * np.dtype(index.dtype).itemsize + 2 * _csr_bytes(Q),
                f"A {Q.shape[0]:,}×{index.shape[0]:,} distance matrix",
                "mgpu.knn keeps k neighbours a row instead of every distance.")
    out = cupy.empty((Q.shape[0], index.shape[0]), dtype=index.dtype)
    # the key-tile form writes into out itself: only the query block counts against the budget
    step = batch_size(prepared, Q.shape[0], _TILE_K, _budget(None) + out.nbytes)
    qs = prepare_queries(prepared, Q)
    for s in range(0, Q.shape[0], step):
        e = min(Q.shape[0], s + step)
        batch_keys(prepared, qs, s, e, out[s:e])
    return -out if ring.similarity else out


def naive_union(index: csp.csr_matrix, queries: csp.csr_matrix, op: int, p: float) -> cupy.ndarray:
    """Union distances (before the finish) by the one-thread-per-pair peer kernel."""
    nq, n = queries.shape[0], index.shape[0]
    out = cupy.empty((nq, n), dtype=index.dtype)
    if nq * n:
        t = c_type(index.dtype)
        fn = get_function("knn.cu", f"mgpu_union_naive<{t}, {op}>", KNN_GROUPS["naive"])
        fn((-(-nq * n // _THREADS),), (_THREADS,), (
            queries.indptr, queries.indices, queries.data, np.int32(nq),
            index.indptr, index.indices, index.data, np.int32(n), np.float64(p), out))
    return out
