"""GPU exact kNN from the index's postings (an inverted view), for wide corpora, and the rule
that chooses it over the fused kernel.

The fused kernel of :mod:`mgpu.backends.cupy_knn` reads every nonzero of the index once per
query batch, and on a wide corpus (100,000 features) only a few dozen queries' dense block
fits in half the L2, so the index is read many times. A query, though, needs only the
postings of its own features: the index's nonzeros in the columns the query holds, a quarter
of the index or less on a power-law corpus. ``mgpu_knn_postings`` (``kernels/knn.cu``) takes
them from a tiled, inverted copy of the index: rows cut into tiles whose float64 dot products
fit in a block's shared memory (opted in past the default 48 KiB, sized so that two or four
blocks share an SM), and per tile and feature the (row in tile, value) pairs. One block per
(query, tile) adds q·x feature by feature, in feature order, so each dot product is the
fused kernel's sum to the bit (the loads of the next features in flight across each step's
barrier); it finishes every row of its tile and keeps its k best;
``mgpu_select_k`` then picks the k best of the tiles'. The copy is made by two passes over
the index's rows (count each (tile, feature) cell, prefix sums, fill with atomic cursors), no
sort. Only the dot-product ("expanded") metrics run this way: those whose operation is
``KnnOp.DOT`` in :data:`mgpu.backends.knn_codes.KNN_CODES` (euclidean, sqeuclidean, cosine,
inner product, dice, jaccard, russellrao, hellinger), with sparse queries and k within the
fused lists.

The choice (:func:`choose`) is measured, as SDDMM's tuner is: a cost model first (the
postings an index-like query walks against the index's nonzeros; at :data:`MODEL_CUTOFF` or
more the fused kernel is kept without a measurement), then, once per device and shape class
(the queries' mean length among its terms), both kernels timed on a sample of the call's
queries spread over them (a corpus's first rows, the usual benchmark queries, are its
longest documents: a posting walk grows with a query's length, the fused kernel's time does
not), the fused kernel by the call's launch plan, the postings at each tile size of
:data:`TILE_BLOCKS`, and the inverted copy's build timed (a second build, so that no
compilation counts), the rates cached. Each call then takes the kernel of least expected
time for its number of queries,
the build counted where the prepared index has no inverted copy yet (``mgpu.knn`` prepares
its index every call; a prepared tile of distributed kNN keeps it). The copy's bytes are
asked of the device before it is built; it is kept on the prepared index while the postings
kernel is the choice. :func:`last_choice` says what the last call ran and why; :func:`forced`
pins a kernel (the benchmark, the tests).

This module does not import :mod:`mgpu.backends.cupy_knn`, which calls it: the prepared
index and query set are read by their fields (``X``, made by ``csr()`` for a dense index,
``s1``, ``s2``, ``metric``, ``p``;
``n``, ``ptr``, ``idx``, ``val``, ``s1``, ``s2``, ``dense``, ``form``: each query's
nonzeros in feature order, as the fused kernel's dot product takes them).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import cupy
import cupyx.scipy.sparse as csp
import numpy as np

from mgpu.backends.cupy import current_facts
from mgpu.backends.instances import KNN_GROUPS, KNN_SELECT
from mgpu.backends.knn_codes import KnnOp
from mgpu.backends.loader import c_type, get_function
from mgpu.backends.memory import DeviceMemoryError, require_gpu
from mgpu.backends.timing import time_gpu

__all__ = ["KERNELS", "MODEL_CUTOFF", "TILE_BLOCKS", "Postings", "choose", "forced",
           "knn_postings", "last_choice", "sample", "tile_rows", "walk"]

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
_DEFAULT_SMEM = 48 * 1024  # dynamic shared memory a block gets without opting in
_RESERVED_SMEM = 1024  # what the device keeps of each block's shared memory (sm_80 on)
# blocks of the postings kernel an SM holds at once: the tile sizes the tuner weighs (fewer,
# larger tiles take fewer steps a query; more blocks hide more of each step's latency)
TILE_BLOCKS = (2, 4)
_SAMPLE = 512  # queries both kernels are timed on, spread over the call's
_REPEATS = 3
_MAX_BATCH = 1 << 16  # queries a launch (the grid's first dimension) at most
_MAX_TILES = 65535  # the grid's second dimension
_DOT = int(KnnOp.DOT)

_tuned: dict[tuple, dict[str, float]] = {}  # shape class -> rates (or the model's verdict)
_lock = threading.Lock()
_forced: tuple[str, int] | None = None
_opted_in: dict[tuple[str, int], int] = {}  # (kernel, device) -> dynamic shared bytes allowed
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


@functools.lru_cache(maxsize=None)
def _smem_limits(device_id: int) -> tuple[int, int, int]:
    """Shared memory a block may opt in to, an SM's, and what the device keeps per block."""
    attrs = cupy.cuda.Device(device_id).attributes
    per_block = attrs.get("MaxSharedMemoryPerBlockOptin") or attrs["MaxSharedMemoryPerBlock"]
    per_sm = attrs.get("MaxSharedMemoryPerMultiprocessor") or per_block
    return int(per_block), int(per_sm), int(attrs.get("ReservedSharedMemoryPerBlock",
                                                      _RESERVED_SMEM))


def tile_rows(blocks_per_sm: int = TILE_BLOCKS[0]) -> int:
    """Rows per tile where ``blocks_per_sm`` blocks share an SM: their float64 dot products
    in a block's shared memory (opted in past 48 KiB) beside the kernel's own, a multiple of
    32, and addressable by 16 bits."""
    per_block, per_sm, reserved = _smem_limits(cupy.cuda.runtime.getDevice())
    room = min(per_block, per_sm // max(1, blocks_per_sm) - reserved) - _STATIC_SMEM
    r = max(0, room) // 8
    return int(max(32, min(65504, r - r % 32)))


def walk(X: Any) -> float:
    """The postings a query drawn as X's rows walks, over X's nonzeros: Σ_f df_f² / (rows ·
    nnz), df_f the rows holding feature f (the cost model; one wait)."""
    df = cupy.bincount(X.indices, minlength=X.shape[1]).astype(cupy.float64)
    return float((df * df).sum()) / max(1, X.shape[0]) / max(1, X.nnz)


def _build(index: Any, R: int) -> str | None:
    """Build the tiled postings of ``index`` in tiles of ``R`` rows (kept as
    ``index.postings``, replacing a view of another size); the reason why not, or None."""
    X = index.X
    n, F = X.shape
    index.postings = None  # its memory back first
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


def _record(kernel: str, reason: str, timings: dict[str, float] | None = None,
            tile: int | None = None) -> str:
    _last.clear()
    _last.update(kernel=kernel, reason=reason, timings_ms=dict(timings or {}))
    if tile is not None:
        _last["tile_rows"] = tile
    return kernel


def last_choice() -> dict[str, Any]:
    """What the last GPU kNN call of this process ran: ``kernel`` ("fused", "postings", or
    "cublas" for a dense index and dense queries), ``reason``, ``timings_ms`` (the
    milliseconds the rule expected of each kernel for the call's queries, the inverted
    view's build included; empty where no timing decided), and for the postings kernel
    ``tile_rows`` (the index rows of a tile)."""
    return dict(_last)


@contextmanager
def forced(kernel: str | None, blocks_per_sm: int = TILE_BLOCKS[0]) -> Iterator[None]:
    """Run the GPU kNN calls of the block with ``kernel`` ("fused", "postings"; None: the
    measured rule) wherever it can take them, the postings in tiles of
    :func:`tile_rows(blocks_per_sm) <tile_rows>` rows. Process-wide: not for concurrent
    callers."""
    global _forced
    if kernel not in (None, *KERNELS):
        raise ValueError(f"The 'kernel' parameter of forced must be one of {sorted(KERNELS)} "
                         f"or None. Got {kernel!r} instead.")
    if not isinstance(blocks_per_sm, int) or blocks_per_sm < 1:
        raise ValueError(f"The 'blocks_per_sm' parameter of forced must be an int >= 1. Got "
                         f"{blocks_per_sm!r} instead.")
    before, _forced = _forced, (None if kernel is None else (kernel, blocks_per_sm))
    try:
        yield
    finally:
        _forced = before


def _shape_class(index: Any, qs: Any, k: int) -> tuple:
    """What the rates depend on: the device, the index's size, k, the sample's size and the
    queries' mean length (a posting walk grows with it; the fused kernel's does not), in
    steps of √2. No wait: every term is known on the host."""
    n, F = index.shape
    length = max(1.0, qs.idx.size / max(1, qs.n))
    return (current_facts().name, index.dtype.str, _kmax(k), round(math.log2(n)),
            round(math.log2(F)), round(math.log2(max(1, index.X.nnz))),
            round(math.log2(min(qs.n, _SAMPLE))), round(2 * math.log2(length)))


def choose(index: Any, qs: Any, k: int, budget: int, plan: Any,
           fused: Callable[[Any, int, int, Any], Any]) -> str:
    """The kernel for kNN of ``qs`` against ``index``: "postings" (``index.postings`` built)
    or "fused". ``fused(queries, s, e, plan)`` runs the fused kernel on queries s..e of a
    query set in one launch of ``plan`` (the call's
    :class:`~mgpu.backends.knn_batches.KnnBatches`, which the tuner times it by). A shape
    class seen before costs no wait; the first of a class is timed and logged at INFO; see
    :func:`last_choice`."""
    if qs.dense is not None:  # the fused path's dense form: cuBLAS
        _record("cublas", "dense index and queries")
        return "fused"
    why = _unusable(index, qs, k)
    if why is not None:
        return _record("fused", why)
    index.csr()  # a dense index's rows as CSR: made on its first sparse queries, as the fused
    # path would make them
    if cupy.cuda.get_current_stream().is_capturing():  # no waits, no allocations of ours
        return _record("fused", "a CUDA graph is being captured")
    if _forced is not None:
        kernel, blocks = _forced
        why = None if kernel == "fused" else _ensure(index, tile_rows(blocks))
        if why is not None:
            return _record("fused", f"postings forced, but: {why}")
        return _record(kernel, "forced", None,
                       index.postings.tile_rows if kernel == "postings" else None)
    key = _shape_class(index, qs, k)
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
    if "model" in rates:
        return _record("fused", f"model: a query walks {rates['model']:.2f} of the index's "
                                "nonzeros")
    R = int(rates["tile_rows"])
    built = index.postings is not None and index.postings.tile_rows == R
    build = 0.0 if built else rates["build"] * max(1, index.X.nnz)
    timings = {"fused": rates["fused"] * qs.n, "postings": rates["postings"] * qs.n + build}
    choice = min(timings, key=timings.get)  # a tie keeps the fused kernel
    why = None if choice == "fused" else _ensure(index, R)
    if why is not None:
        return _record("fused", why, timings)
    if choice == "fused":
        index.postings = None  # its memory back
    (logger.info if reason == "measured" else logger.debug)(
        "kNN of %d queries: the %s kernel (%s; expected ms: %s)", qs.n, choice, reason,
        ", ".join(f"{name} {v:.3f}" for name, v in timings.items()))
    return _record(choice, reason, timings, R if choice == "postings" else None)


def _ensure(index: Any, R: int) -> str | None:
    """``index.postings`` in tiles of ``R`` rows, built where it is not; why not, or None."""
    if index.postings is not None and index.postings.tile_rows == R:
        return None
    return _build(index, R)


def sample(qs: Any, m: int, n_features: int) -> Any:
    """``m`` queries of ``qs`` spread evenly over it (every ``qs.n // m``-th): the rates of a
    call's own mix of short and long queries, where its first queries may be the longest (a
    corpus's rows as queries, longest first)."""
    if m >= qs.n:
        return qs
    sel = cupy.arange(m, dtype=cupy.int64) * (qs.n // m)
    C = csp.csr_matrix((qs.val, qs.idx, qs.ptr), shape=(qs.n, n_features))[sel]

    def part(x: Any) -> Any:
        return None if x is None else x[sel]

    return dataclasses.replace(qs, n=m, ptr=C.indptr.astype(cupy.int32, copy=False),
                               idx=C.indices.astype(cupy.int32, copy=False), val=C.data,
                               s1=part(qs.s1), s2=part(qs.s2))


def _measure(index: Any, qs: Any, k: int, budget: int, plan: Any,
             fused: Callable[[Any, int, int, Any], Any]) -> dict[str, float] | str:
    """The cost model's verdict ({"model": walk}) where the postings cannot win; otherwise
    milliseconds a query of each kernel on a sample of the call's queries (spread over them,
    each kernel run once untimed first, so that neither compiling nor a cold L2 counts), the
    postings at the best of the tile sizes of :data:`TILE_BLOCKS` ("tile_rows"), and
    milliseconds per index nonzero to build the inverted view (timed on a second build); or
    why the view cannot be built."""
    w = walk(index.X)
    if w >= MODEL_CUTOFF:
        logger.info("kNN kernel for a %s index: fused (a query walks %.2f of its nonzeros)",
                    index.shape, w)
        return {"model": w}
    m = min(qs.n, _SAMPLE)
    part = sample(qs, m, index.shape[1])

    def run_fused() -> None:
        for s in range(0, m, plan.per_launch):
            fused(part, s, min(m, s + plan.per_launch), plan)

    t_f = time_gpu(run_fused, repeats=_REPEATS, warmup=1)
    postings: dict[int, float] = {}
    build = math.inf
    for blocks in TILE_BLOCKS:
        R = tile_rows(blocks)
        if R in postings:
            continue
        if index.postings is None or index.postings.tile_rows != R:
            why = _build(index, R)  # compiles the build's kernels where the first
            if why is not None:
                return why
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        why = _build(index, R)
        stop.record()
        if why is not None:
            return why
        stop.synchronize()
        build = min(build, cupy.cuda.get_elapsed_time(start, stop) / 1e3)
        P = index.postings
        postings[R] = time_gpu(lambda: _batches(index, P, part, 0, m, k, budget, None),
                               repeats=_REPEATS, warmup=1)
    R = min(postings, key=postings.get)
    rates = {"fused": 1e3 * t_f / m, "postings": 1e3 * postings[R] / m,
             "build": 1e3 * build / max(1, index.X.nnz), "tile_rows": R}
    logger.info("kNN kernels timed on a %s index, %d queries: fused %.4f ms a query, postings "
                "%.4f ms a query in tiles of %d rows (%s) and %.2f ms per million nonzeros to "
                "build (a query walks %.3f of the index's nonzeros)", index.shape, m,
                rates["fused"], rates["postings"], R,
                ", ".join(f"{r} rows: {1e3 * t / m:.4f}" for r, t in postings.items()),
                1e6 * rates["build"], w)
    return rates


def batch_size(index: Any, P: Postings, n_queries: int, k: int, budget: int) -> int:
    """Queries a launch: their tiles' candidates and the selection's output within
    ``budget`` bytes."""
    item = index.dtype.itemsize
    per_query = (P.n_tiles + 1) * k * (item + 4)
    return int(max(1, min(n_queries, _MAX_BATCH, budget // max(1, per_query))))


def _opt_in(expression: str, smem: int) -> Any:
    """The postings kernel allowed ``smem`` bytes of dynamic shared memory (past the 48 KiB
    a block gets by default, as the tile needs; once per kernel and device)."""
    fn = get_function("knn.cu", expression, KNN_GROUPS["postings"])
    key = (expression, cupy.cuda.runtime.getDevice())
    if smem > _opted_in.get(key, _DEFAULT_SMEM):
        fn.max_dynamic_shared_size_bytes = smem
        _opted_in[key] = smem
    return fn


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

    fn = _opt_in(f"mgpu_knn_postings<{t}, {kmax}>", P.tile_rows * 8)
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
