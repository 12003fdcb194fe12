"""GPU exact kNN from the index's postings (an inverted view), for wide corpora, and the rule
that chooses it over the fused kernel.

The fused kernel of :mod:`mgpu.backends.cupy_knn` reads every nonzero of the index once per
query batch, and on a wide corpus (100,000 features) only a few dozen queries' dense block
fits in half the L2, so the index is read many times. A query, though, needs only the
postings of its own features: the index's nonzeros in the columns the query holds, a quarter
of the index or less on a power-law corpus. ``mgpu_knn_postings`` (``kernels/knn.cu``) takes
them from a tiled, inverted copy of the index: rows cut into tiles whose float64 dot products
fit in a block's shared memory, and per tile and feature the (row in tile, value) pairs. One
block per (query, tile) adds q·x feature by feature, in feature order, so each dot product is
the fused kernel's sum to the bit; it finishes every row of its tile and keeps its k best;
``mgpu_select_k`` then picks the k best of the tiles'. The copy is made by two passes over
the index's rows (count each (tile, feature) cell, prefix sums, fill with atomic cursors), no
sort. Only the dot-product ("expanded") metrics run this way: those whose operation is
``KnnOp.DOT`` in :data:`mgpu.backends.knn_codes.KNN_CODES` (euclidean, sqeuclidean, cosine,
inner product, dice, jaccard, russellrao, hellinger), with sparse queries and k within the
fused lists.

The choice (:func:`choose`) is measured, as SDDMM's tuner is: a cost model first (the
postings an index-like query walks against the index's nonzeros; at :data:`MODEL_CUTOFF` or
more the fused kernel is kept without a measurement), then, once per device and shape class,
both kernels timed on the first queries and the inverted copy's build timed, the rates
cached. Each call then takes the kernel of least expected time for its number of queries,
the build counted where the prepared index has no inverted copy yet (``mgpu.knn`` prepares
its index every call; a prepared tile of distributed kNN keeps it). The copy's bytes are
asked of the device before it is built; it is kept on the prepared index while the postings
kernel is the choice. :func:`last_choice` says what the last call ran and why; :func:`forced`
pins a kernel (the benchmark, the tests).

This module does not import :mod:`mgpu.backends.cupy_knn`, which calls it: the prepared
index and query set are read by their fields (``X``, ``s1``, ``s2``, ``metric``, ``p``;
``n``, ``ptr``, ``idx``, ``val``, ``s1``, ``s2``, ``dense``, ``form``: each query's
nonzeros in feature order, as the fused kernel's dot product takes them).
"""
from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import cupy
import numpy as np

from mgpu.backends.cupy import current_facts
from mgpu.backends.instances import KNN_GROUPS, KNN_SELECT
from mgpu.backends.knn_codes import KnnOp
from mgpu.backends.loader import c_type, get_function
from mgpu.backends.memory import DeviceMemoryError, require_gpu
from mgpu.backends.timing import time_gpu

__all__ = ["KERNELS", "MODEL_CUTOFF", "Postings", "choose", "forced", "knn_postings",
           "last_choice", "tile_rows", "walk"]

logger = logging.getLogger(__name__)

KERNELS: dict[str, str] = {
    "fused": "every index nonzero once per query batch, the batch's queries dense in L2",
    "postings": "per query, the postings of its features only, from a tiled inverted copy",
}
# the postings timed only where an index-like query walks fewer than this share of the
# index's nonzeros (each posting costs a random shared-memory update, each fused nonzero a
# broadcast and a read from L2)
MODEL_CUTOFF = 0.5
_THREADS = 256
_STATIC_SMEM = 4352  # the kernel's own shared memory (a chunk of features, the arg-min)
_SAMPLE = 512  # queries both kernels are timed on
_MAX_BATCH = 1 << 16  # queries a launch (the grid's first dimension) at most
_MAX_TILES = 65535  # the grid's second dimension
_DOT = int(KnnOp.DOT)

_tuned: dict[tuple, dict[str, float]] = {}  # shape class -> rates (or the model's verdict)
_lock = threading.Lock()
_forced: str | None = None
_last: dict[str, Any] = {}


@dataclass
class Postings:
    """The tiled postings of a prepared index, as the kernel reads them."""

    tile_rows: int
    n_tiles: int
    ptr: cupy.ndarray  # int32, n_tiles * n_features + 1: a (tile, feature)'s first posting
    rows: cupy.ndarray  # uint16, the row within its tile
    vals: cupy.ndarray  # the index's (transformed) values

    @property
    def nbytes(self) -> int:
        """Device bytes the view holds."""
        return int(self.ptr.nbytes + self.rows.nbytes + self.vals.nbytes)


def tile_rows() -> int:
    """Rows per tile: their float64 dot products in a block's shared memory beside the
    kernel's own, a multiple of 32, and addressable by 16 bits."""
    r = (current_facts().smem_bytes - _STATIC_SMEM) // 8
    return int(max(32, min(65504, r - r % 32)))


def walk(X: Any) -> float:
    """The postings a query drawn as X's rows walks, over X's nonzeros: Σ_f df_f² / (rows ·
    nnz), df_f the rows holding feature f (the cost model; one wait)."""
    df = cupy.bincount(X.indices, minlength=X.shape[1]).astype(cupy.float64)
    return float((df * df).sum()) / max(1, X.shape[0]) / max(1, X.nnz)


def _build(index: Any) -> str | None:
    """Build the tiled postings of ``index`` (kept as ``index.postings``); the reason why
    not, or None."""
    X = index.X
    n, F = X.shape
    R = tile_rows()
    T = -(-n // R)
    table = T * F + 1
    if T > _MAX_TILES or table >= 2**31:
        return f"{T:,} tiles × {F:,} features: the tile table takes 2^31 entries or more"
    keep = X.nnz * (2 + X.dtype.itemsize) + table * 4
    scratch = table * 12  # the counts (int32), their prefix sums (int64)
    try:
        require_gpu(keep + scratch, f"The inverted view of a {n:,}×{F:,} kNN index")
    except DeviceMemoryError as exc:
        return str(exc)
    group = KNN_GROUPS["postings"]
    grid = (-(-n // _THREADS),)
    indptr = X.indptr.astype(cupy.int32, copy=False)
    indices = X.indices.astype(cupy.int32, copy=False)
    counts = cupy.zeros(table, dtype=cupy.int32)
    get_function("knn.cu", "mgpu_postings_count", group)(grid, (_THREADS,), (
        indptr, indices, np.int32(n), np.int32(F), np.int32(R), counts))
    ptr = cupy.empty(table, dtype=cupy.int32)
    ptr[0] = 0
    ptr[1:] = cupy.cumsum(counts[:-1], dtype=cupy.int64)
    cursor = counts  # reused: each cell's next free slot
    cursor[:] = ptr
    rows = cupy.empty(X.nnz, dtype=cupy.uint16)
    vals = cupy.empty(X.nnz, dtype=X.dtype)
    get_function("knn.cu", f"mgpu_postings_fill<{c_type(X.dtype)}>", group)(grid, (_THREADS,), (
        indptr, indices, X.data, np.int32(n), np.int32(F), np.int32(R), cursor, rows, vals))
    index.postings = Postings(R, T, ptr, rows, vals)
    return None


def _kmax(k: int) -> int:
    return next((m for m in KNN_SELECT if k <= m), 0)


def _unusable(index: Any, qs: Any, k: int) -> str | None:
    """Why the postings kernel cannot take this call, or None."""
    if qs.form.op != _DOT:
        return f"{index.metric} is not a dot-product metric"
    if not _kmax(k):
        return f"k={k} is beyond the lists ({KNN_SELECT[-1]})"
    if 0 in index.shape or qs.n == 0:
        return "an empty index or no queries"
    return None


def _record(kernel: str, reason: str, timings: dict[str, float] | None = None) -> str:
    _last.clear()
    _last.update(kernel=kernel, reason=reason, timings_ms=dict(timings or {}))
    return kernel


def last_choice() -> dict[str, Any]:
    """What the last GPU kNN call of this process ran: ``kernel`` ("fused", "postings", or
    "cublas" for a dense index and dense queries), ``reason``, and ``timings_ms`` (the
    milliseconds the rule expected of each kernel for the call's queries, the inverted
    view's build included; empty where no timing decided)."""
    return dict(_last)


@contextmanager
def forced(kernel: str | None) -> Iterator[None]:
    """Run the GPU kNN calls of the block with ``kernel`` ("fused", "postings"; None: the
    measured rule) wherever it can take them. Process-wide: not for concurrent callers."""
    global _forced
    if kernel not in (None, *KERNELS):
        raise ValueError(f"The 'kernel' parameter of forced must be one of {sorted(KERNELS)} "
                         f"or None. Got {kernel!r} instead.")
    before, _forced = _forced, kernel
    try:
        yield
    finally:
        _forced = before


def _shape_class(index: Any, k: int, nq: int) -> tuple:
    n, F = index.shape
    return (current_facts().name, index.dtype.str, _kmax(k), round(math.log2(n)),
            round(math.log2(F)), round(math.log2(max(1, index.X.nnz))),
            round(math.log2(min(nq, _SAMPLE))))


def choose(index: Any, qs: Any, k: int, budget: int, plan: Any,
           fused: Callable[[int, int, Any], Any]) -> str:
    """The kernel for kNN of ``qs`` against ``index``: "postings" (``index.postings`` built)
    or "fused". ``fused(s, e, plan)`` runs the fused kernel on queries s..e in one launch of
    ``plan`` (the call's :class:`~mgpu.backends.knn_batches.KnnBatches`, which the tuner
    times it by). A shape class seen before costs no wait; the first of a class is timed and
    logged at INFO; see :func:`last_choice`."""
    if qs.dense is not None:  # the fused path's dense form: cuBLAS
        _record("cublas", "dense index and queries")
        return "fused"
    why = _unusable(index, qs, k)
    if why is not None:
        return _record("fused", why)
    if cupy.cuda.get_current_stream().is_capturing():  # no waits, no allocations of ours
        return _record("fused", "a CUDA graph is being captured")
    built = index.postings is not None
    if _forced is not None:
        why = None if _forced == "fused" or built else _build(index)
        if why is not None:
            return _record("fused", f"postings forced, but: {why}")
        return _record(_forced, "forced")
    key = _shape_class(index, k, qs.n)
    with _lock:
        rates = _tuned.get(key)
    reason = "tuned for its shape class"
    if rates is None:
        rates = _measure(index, qs, k, budget, plan, fused)
        if isinstance(rates, str):
            return _record("fused", rates)
        with _lock:
            _tuned[key] = rates
        reason = "measured"
        built = index.postings is not None
    if "model" in rates:
        return _record("fused", f"model: a query walks {rates['model']:.2f} of the index's "
                                "nonzeros")
    build = 0.0 if built else rates["build"] * max(1, index.X.nnz)
    timings = {"fused": rates["fused"] * qs.n, "postings": rates["postings"] * qs.n + build}
    choice = min(timings, key=timings.get)
    why = None if choice == "fused" or built else _build(index)
    if why is not None:
        return _record("fused", why, timings)
    if choice == "fused":
        index.postings = None  # its memory back
    (logger.info if reason == "measured" else logger.debug)(
        "kNN of %d queries: the %s kernel (%s; expected ms: %s)", qs.n, choice, reason,
        ", ".join(f"{name} {v:.3f}" for name, v in timings.items()))
    return _record(choice, reason, timings)


def _measure(index: Any, qs: Any, k: int, budget: int, plan: Any,
             fused: Callable[[int, int, Any], Any]) -> dict[str, float] | str:
    """The cost model's verdict ({"model": walk}) where the postings cannot win; otherwise
    milliseconds a query of each kernel on the first queries and to build the inverted view
    per index nonzero; or why the view cannot be built."""
    w = walk(index.X)
    if w >= MODEL_CUTOFF:
        logger.info("kNN kernel for a %s index: fused (a query walks %.2f of its nonzeros)",
                    index.shape, w)
        return {"model": w}
    build = 0.0
    if index.postings is None:
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        why = _build(index)
        if why is not None:
            return why
        stop.record()
        stop.synchronize()
        build = cupy.cuda.get_elapsed_time(start, stop) / max(1, index.X.nnz)
    P = index.postings
    m = min(qs.n, _SAMPLE)

    def run_fused() -> None:
        for s in range(0, m, plan.per_launch):
            fused(s, min(m, s + plan.per_launch), plan)

    t_f = time_gpu(run_fused, repeats=2, warmup=1)
    t_p = time_gpu(lambda: _batches(index, P, qs, 0, m, k, budget, None), repeats=2, warmup=1)
    rates = {"fused": 1e3 * t_f / m, "postings": 1e3 * t_p / m, "build": build}
    logger.info("kNN kernels timed on a %s index: fused %.4f ms a query, postings %.4f ms a "
                "query and %.2f ms per million nonzeros to build (a query walks %.3f of the "
                "index's nonzeros)", index.shape, rates["fused"], rates["postings"],
                1e6 * build, w)
    return rates


def batch_size(index: Any, P: Postings, n_queries: int, k: int, budget: int) -> int:
    """Queries a launch: their tiles' candidates and the selection's output within
    ``budget`` bytes."""
    item = index.dtype.itemsize
    per_query = (P.n_tiles + 1) * k * (item + 4)
    return int(max(1, min(n_queries, _MAX_BATCH, budget // max(1, per_query))))


def _launch(index: Any, P: Postings, qs: Any, s: int, e: int, k: int
            ) -> tuple[cupy.ndarray, cupy.ndarray]:
    """Keys and int32 ids of the k best rows of queries s..e (sorted, ties to the lower id)."""
    X = index.X
    n, F = X.shape
    nb = e - s
    t = c_type(X.dtype)
    kmax = _kmax(k)
    m = P.n_tiles * k
    cand_key = cupy.empty((nb, m), dtype=X.dtype)
    cand_id = cupy.empty((nb, m), dtype=cupy.int32)
    null = np.uintp(0)

    def ptr(x: Any) -> Any:
        return null if x is None else x

    def part(x: Any) -> Any:
        return null if x is None else x[s:e]

    fn = get_function("knn.cu", f"mgpu_knn_postings<{t}, {kmax}>", KNN_GROUPS["postings"])
    fn((nb, P.n_tiles), (_THREADS,), (
        P.ptr, P.rows, P.vals, np.int32(n), np.int32(F), np.int32(P.tile_rows),
        qs.ptr[s:e + 1], qs.idx, qs.val, ptr(index.s1), ptr(index.s2), part(qs.s1), part(qs.s2),
        np.int32(qs.form.fin), np.float64(F), np.float64(index.p), np.int32(k),
        cand_key, cand_id), shared_mem=P.tile_rows * 8)
    if P.n_tiles == 1:  # the one tile's k best are the answer
        return cand_key, cand_id
    out_key = cupy.empty((nb, k), dtype=X.dtype)
    out_id = cupy.empty((nb, k), dtype=cupy.int32)
    sel = get_function("knn.cu", f"mgpu_select_k<{t}, {kmax}>", KNN_GROUPS["select"])
    sel((nb,), (_THREADS,), (cand_key, cand_id, np.int64(m), np.int32(k), out_key, out_id))
    return out_key, out_id


def _batches(index: Any, P: Postings, qs: Any, s0: int, e0: int, k: int, budget: int,
             out: tuple[cupy.ndarray, cupy.ndarray, bool] | None) -> None:
    """Queries s0..e0 in launches within ``budget``; into ``out`` (distances, ids, negate)."""
    step = batch_size(index, P, e0 - s0, k, budget)
    for s in range(s0, e0, step):
        e = min(e0, s + step)
        d, i = _launch(index, P, qs, s, e, k)
        if out is not None:
            dist, ids, negate = out
            dist[s:e] = -d if negate else d
            ids[s:e] = i


def knn_postings(index: Any, qs: Any, k: int, similarity: bool, budget: int
                 ) -> tuple[cupy.ndarray, cupy.ndarray]:
    """kNN of a prepared query set by the postings kernel (after :func:`choose` returned
    "postings"): distances in the index's dtype, int64 ids, as the fused path returns them."""
    dist = cupy.empty((qs.n, k), dtype=index.dtype)
    ids = cupy.empty((qs.n, k), dtype=cupy.int64)
    _batches(index, index.postings, qs, 0, qs.n, k, budget, (dist, ids, similarity))
    return dist, ids
