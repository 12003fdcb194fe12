"""GPU pairwise distances and exact kNN: CuPy input, the kernels of ``kernels/knn.cu``.

The index (CSR, or dense turned CSR) is prepared once: values transformed as its metric
needs (pattern, square root, logarithm, rows normalised), rows ordered longest first for
the kernel's row counter, per-row statistics in float64. The queries are prepared once too
(CSR with int32 offsets, statistics); a launch takes views of them. A launch holds as many
groups of queries as the working memory allows (all of them on a small index), each group's
block held dense (features × queries) within half the L2 (:mod:`mgpu.backends.knn_batches`).
Each launch runs one fused kernel (dot/union pass, element-wise finish, per-lane top-k lists,
or every key where the index is small) and one selection.

Dense index and queries with an expanded metric go through cuBLAS (``cupy.matmul``) instead:
dot products of as many queries as the working memory holds, finished in place, then the
same selection; for correlation, of the rows centred first (a cosine of centred rows).

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
from mgpu.backends.cupy_knn_input import as_csr as _as_csr
from mgpu.backends.cupy_knn_input import device_input
from mgpu.backends.cupy_knn_input import normalised as _normalised
from mgpu.backends.cupy_knn_input import transformed as _transformed
from mgpu.backends.instances import KNN_GROUPS
from mgpu.backends.knn_batches import (
    THREADS,
    WARPS_PER_BLOCK,
    KnnBatches,
    fused_kmax,
    lane_slots,
    plan_dense,
    plan_fused,
)
from mgpu.backends.knn_codes import KNN_CODES, KnnOp
from mgpu.backends.loader import c_type, get_function
from mgpu.backends.memory import DeviceMemoryError, require_gpu
from mgpu.backends.numpy import ROW_SUM

logger = logging.getLogger(__name__)

_THREADS = THREADS

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


# ------------------------------------------------------------------------------ index


@dataclass
class GpuIndex:
    """An index prepared for one metric on the current device (checked input only)."""

    metric: str
    p: float
    X: csp.csr_matrix | None  # values transformed for the kernel (None: made on first use)
    order: cupy.ndarray | None  # rows, longest first (int32)
    s1: cupy.ndarray | None
    s2: cupy.ndarray | None
    dense: cupy.ndarray | None  # transformed dense rows, kept for the cuBLAS path
    counts: bool = False  # manhattan: integer values, sums exact (_counts)
    postings: Any = None  # the inverted view (cupy_knn_postings), made when first weighed

    @property
    def shape(self) -> tuple[int, int]:
        return (self.X if self.X is not None else self.dense).shape

    @property
    def dtype(self) -> np.dtype:
        return (self.X if self.X is not None else self.dense).dtype

    def csr(self) -> tuple[csp.csr_matrix, cupy.ndarray]:
        """The rows as the fused kernel reads them and their order; an index of dense rows
        that cuBLAS takes as they are makes them when sparse queries first come."""
        if self.order is None:  # set last: a thread that sees it sees X
            X = _checked_nnz(_as_csr(self.dense))
            order = _longest_first(X)
            self.X = X
            self.order = order
        return self.X, self.order


def _checked_nnz(C: csp.csr_matrix) -> csp.csr_matrix:
    if C.nnz >= 2**31:
        raise ValueError(f"The index has {C.nnz} nonzeros; one GPU tile takes fewer than 2^31. "
                         "Split it over workers (mgpu.from_scipy(..., axis=0)).")
    return C


def _longest_first(C: csp.csr_matrix) -> cupy.ndarray:
    return cupy.argsort(-cupy.diff(C.indptr), kind="stable").astype(cupy.int32)


# the row statistics that dense rows give without a CSR copy (sums of squares, norms)
_DENSE_STATS = (_none, _sq, _norm)


def _dense_stats(X: cupy.ndarray, stats: Stats) -> tuple[Any, None]:
    if stats is _none:
        return None, None
    sq = cupy.square(X, dtype=cupy.float64).sum(axis=1)
    return (sq if stats is _sq else cupy.sqrt(sq)), None


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
    if isinstance(X, cupy.ndarray) and _cublas(form) and form.x_stats in _DENSE_STATS:
        # dense rows for cuBLAS as they are: no CSR copy unless sparse queries come
        return GpuIndex(metric, p, None, None, *_dense_stats(X, form.x_stats), X)
    C = _checked_nnz(_as_csr(X))
    if form.normalise:
        C = _normalised(C)
    s1, s2 = form.x_stats(C, p)
    Xt = _transformed(C, form.x_values)
    return GpuIndex(metric, p, Xt, _longest_first(Xt), s1, s2, _dense_rows(X, form, s1),
                    metric == "manhattan" and _counts(C))


def _dense_rows(X: Any, form: Form, s1: Any) -> cupy.ndarray | None:
    """Dense rows for the cuBLAS path (a dense X and a dot-product metric without a value
    transform), centred by their means ``s1`` for correlation; None for the fused kernel."""
    if not isinstance(X, cupy.ndarray) or not _cublas(form):
        return None
    if form.op == OP_CORRELATION:
        return X - s1.astype(X.dtype)[:, None]  # a constant row: exactly 0
    return X


# ----------------------------------------------------------------------------- batches


def _kernel(group: str, expression: str):
    return get_function("knn.cu", expression, KNN_GROUPS[group])


def _plan(shape: tuple[int, int], n_queries: int, k: int, dtype: Any, dense: bool,
          budget: int) -> KnnBatches:
    item = np.dtype(dtype).itemsize
    if dense:
        return plan_dense(shape[0], n_queries, k, item, budget=budget)
    facts = current_facts()
    return plan_fused(shape[0], shape[1], n_queries, k, item, sms=facts.sms,
                      l2_bytes=facts.l2_bytes, budget=budget)


def _cublas(form: Form) -> bool:
    """Whether dense rows of this form go through cuBLAS (a dot product of the values as
    given, or correlation's of the rows centred)."""
    return form.op == OP_CORRELATION or (form.op == OP_DOT and form.x_values is None)


def knn_batches(index: Any, queries: Any, k: int, metric: str,
                working_memory: Any = None) -> KnnBatches:
    """The launches :func:`mgpu.knn` makes for this CuPy index and queries (what a benchmark
    reports beside its timings); the call itself may take fewer queries a launch where the
    device has less memory free than the working memory."""
    dense = all(isinstance(a, cupy.ndarray) for a in (index, queries)) and _cublas(FORMS[metric])
    return _plan(index.shape, queries.shape[0], k, index.dtype, dense, _budget(working_memory))


@dataclass
class QuerySet:
    """Checked queries made ready once for a prepared index: their CSR with int32 offsets
    (values in the kernel's form, each row in feature order; for L-infinity also each row's
    features and |values| by decreasing |value|) and per-row statistics, or the dense rows
    for the cuBLAS path. A launch takes views of these: nothing is cut, copied or read back
    per launch."""

    n: int
    ptr: cupy.ndarray | None
    idx: cupy.ndarray | None
    val: cupy.ndarray | None
    by_mag: tuple[cupy.ndarray, cupy.ndarray] | None
    s1: cupy.ndarray | None
    s2: cupy.ndarray | None
    dense: cupy.ndarray | None
    form: Form  # the index's, or manhattan's exact form between counts


def prepare_queries(index: GpuIndex, Q: Any) -> QuerySet:
    form = FORMS[index.metric]
    if index.dense is not None and isinstance(Q, cupy.ndarray) and form.q_stats in _DENSE_STATS:
        Qd = Q.astype(index.dtype, copy=False)  # cuBLAS takes them as they are
        return QuerySet(Q.shape[0], None, None, None, None, *_dense_stats(Qd, form.q_stats),
                        Qd, form)
    C = _as_csr(Q)
    C = C if C.dtype == index.dtype else C.astype(index.dtype)
    if index.counts and _counts(C):
        form = _L1_COUNTS
    if form.normalise:
        C = _normalised(C)
    s1, s2 = form.q_stats(C, index.p)
    if index.dense is not None and isinstance(Q, cupy.ndarray):
        return QuerySet(Q.shape[0], None, None, None, None, s1, s2,
                        _dense_rows(Q.astype(index.dtype, copy=False), form, s1), form)
    C = _transformed(C, form.q_values)
    if form.op in UNION_WALK:
        C.sort_indices()  # the union walk takes each query's nonzeros in feature order
    if C.nnz >= 2**31:
        raise ValueError(f"The queries have {C.nnz} nonzeros; one call takes fewer than 2^31. "
                         "Pass fewer queries a call.")
    ptr = C.indptr.astype(cupy.int32, copy=False)
    idx = C.indices.astype(cupy.int32, copy=False)
    by_mag = None
    if form.op == OP_LINF:
        # per row: |value| descending (a stable sort of (row, -|value|) pairs, in float64,
        # which holds every row number exactly)
        rows = cupy.searchsorted(ptr, cupy.arange(C.nnz, dtype=cupy.int32), side="right") - 1
        mag = cupy.abs(C.data)
        by = cupy.lexsort(cupy.stack([-mag.astype(cupy.float64), rows.astype(cupy.float64)]))
        by_mag = (idx[by], mag[by])
    return QuerySet(C.shape[0], ptr, idx, C.data, by_mag, s1, s2, None, form)


def _query_block(index: GpuIndex, qs: QuerySet, s: int, e: int, form: Form
                 ) -> tuple[Any, Any, Any, Any]:
    """Queries s..e as the kernel reads them: dense (features × queries; None for the union
    walk, which reads the CSR), their statistics, and their nonzeros as CSR (offsets into
    the whole set's arrays), in feature order for the union walk, by decreasing |value| for
    L∞. Views and, for the dense block, one fill and one scatter kernel."""
    nb = e - s
    ptr = qs.ptr[s:e + 1]
    qd = None
    lq = (None, None, None)
    if form.op in UNION_WALK:
        lq = (ptr, qs.idx, qs.val)
    else:
        qd = cupy.zeros((index.shape[1], nb), dtype=index.dtype)
        if nb and qs.val.size:
            fn = _kernel("select", f"mgpu_query_block<{c_type(index.dtype)}>")
            fn((-(-nb * 32 // _THREADS),), (_THREADS,), (ptr, qs.idx, qs.val, np.int32(nb), qd))
        if form.op == OP_LINF:
            lq = (ptr, *qs.by_mag)

    def part(x):
        return None if x is None else x[s:e]

    return qd, part(qs.s1), part(qs.s2), lq


def _launch_fused(index: GpuIndex, form: Form, plan: KnnBatches, nb: int, qd: Any, s1: Any,
                  s2: Any, lq: Any, k: int, out_key: cupy.ndarray, out_id: Any,
                  ld_out: int) -> None:
    """One launch of the fused kernel over queries 0..nb of the block: ``plan.blocks`` ×
    (its groups of ``plan.width``), a row counter per group."""
    X, order = index.csr()
    n_rows, n_features = X.shape
    t = c_type(X.dtype)
    groups = -(-nb // plan.width)
    if not groups:
        return
    fn = _kernel(f"op{form.op}-{t}", f"mgpu_knn_csr<{t}, int, {form.op}, "
                                     f"{lane_slots(plan.kmax)}, {plan.kmax}>")
    counter = cupy.zeros(groups, dtype=cupy.int32)
    null = np.uintp(0)

    def ptr(a):
        return null if a is None else a

    fn((plan.blocks, groups), (_THREADS,), (
        X.indptr, X.indices, X.data, order, np.int32(n_rows),
        ptr(qd), np.int32(nb), np.int32(plan.width),
        ptr(index.s1), ptr(index.s2), ptr(s1), ptr(s2),
        ptr(lq[0]), ptr(lq[1]), ptr(lq[2]),
        np.int32(form.fin), np.float64(n_features), np.float64(index.p), np.int32(k),
        counter, out_key, ptr(out_id), np.int64(ld_out)))


def _select(keys: cupy.ndarray, ids: cupy.ndarray | None, k: int) -> tuple[cupy.ndarray, cupy.ndarray]:
    """The k best of each row of ``keys`` (ties to the lower id)."""
    rows, m = keys.shape
    kmax = fused_kmax(k)
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


def batch_keys(index: GpuIndex, qs: QuerySet, s: int, e: int, out: cupy.ndarray,
               plan: KnnBatches) -> None:
    """Every key of queries s..e against the index, into ``out`` (e - s × index rows)."""
    form = qs.form
    if qs.dense is not None:
        _dense_dot_keys(index, form, qs, s, e, out)
        return
    qd, s1, s2, lq = _query_block(index, qs, s, e, form)
    _launch_fused(index, form, plan, e - s, qd, s1, s2, lq, 0, out, None,
                  out.strides[0] // out.itemsize)


def batch_knn(index: GpuIndex, qs: QuerySet, s: int, e: int, k: int, plan: KnnBatches
              ) -> tuple[cupy.ndarray, cupy.ndarray]:
    """Keys and int32 ids of the k best index rows for queries s..e: one launch of the
    fused kernel (or one cuBLAS product) and one selection."""
    if plan.tile or qs.dense is not None:
        keys = cupy.empty((e - s, index.shape[0]), dtype=index.dtype)
        batch_keys(index, qs, s, e, keys, plan)
        return _select(keys, None, k)
    qd, s1, s2, lq = _query_block(index, qs, s, e, qs.form)
    m = plan.blocks * WARPS_PER_BLOCK * k
    cand_key = cupy.empty((e - s, m), dtype=index.dtype)
    cand_id = cupy.empty((e - s, m), dtype=cupy.int32)
    _launch_fused(index, qs.form, plan, e - s, qd, s1, s2, lq, k, cand_key, cand_id, 0)
    return _select(cand_key, cand_id, k)


def knn_prepared(index: GpuIndex, queries: Any, k: int, similarity: bool, budget: int
                 ) -> tuple[cupy.ndarray, cupy.ndarray]:
    """kNN of checked queries against a prepared index; distances in the index's dtype.

    The launches' working memory is ``budget`` or what the device has left beside the
    queries and the results, whichever is smaller (one query a launch at least; the whole
    query set in one launch where it fits, :mod:`mgpu.backends.knn_batches`);
    :class:`DeviceMemoryError` when the device cannot hold one query."""
    nq = queries.shape[0]
    item = index.dtype.itemsize
    held = 2 * _csr_bytes(queries) + nq * (2 * item + k * (item + 8))  # queries' copies, results
    what = (f"kNN of {nq:,} queries (k={k}) against a {index.shape[0]:,}×{index.shape[1]:,} "
            "index")
    hint = "Pass fewer queries a call, or split the index over several GPUs."
    available = require_gpu(held, what, hint)
    dense = index.dense is not None and isinstance(queries, cupy.ndarray)
    if available is not None:  # None: a CUDA graph is being captured, the device not asked
        budget = min(budget, available - held)  # a launch is one query at least, whatever
    plan = _plan(index.shape, nq, k, index.dtype, dense, budget)
    if available is not None and plan.query_bytes > available - held:
        raise DeviceMemoryError(f"{what} needs {format_bytes(plan.query_bytes)} of GPU working "
                                f"memory for one query beside its inputs and results; "
                                f"{format_bytes(max(available - held, 0))} are available. "
                                f"{hint}")
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("%s: %s", what, plan.describe())
    qs = prepare_queries(index, queries)
    # wide corpora: the postings of the queries' features only (a measured choice)
    if postings.choose(index, qs, k, budget, plan,
                       lambda q, s, e, p: batch_knn(index, q, s, e, k, p)) == "postings":
        return postings.knn_postings(index, qs, k, similarity, budget)
    if plan.launches == 1:  # the results are the selection's own arrays
        d, i = batch_knn(index, qs, 0, nq, k, plan)
        return (-d if similarity else d), i.astype(cupy.int64)
    dist = cupy.empty((nq, k), dtype=index.dtype)
    ids = cupy.empty((nq, k), dtype=cupy.int64)
    for s in range(0, nq, plan.per_launch):
        e = min(nq, s + plan.per_launch)
        d, i = batch_knn(index, qs, s, e, k, plan)
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
    facts = current_facts()
    plan = plan_fused(*index.shape, Q.shape[0], 1, np.dtype(index.dtype).itemsize,
                      sms=facts.sms, l2_bytes=facts.l2_bytes, budget=_budget(None),
                      keys_out=True)
    qs = prepare_queries(prepared, Q)
    for s in range(0, Q.shape[0], plan.per_launch):
        e = min(Q.shape[0], s + plan.per_launch)
        batch_keys(prepared, qs, s, e, out[s:e], plan)
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
