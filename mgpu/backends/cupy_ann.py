"""The proximity graph of :class:`mgpu.models.GraphIndex` on the GPU: the kernels of
``kernels/ann.cu`` (GANNS's search, one block a query; GGraphCon's batched construction),
the same algorithms as :mod:`mgpu.backends.numpy_ann`, step for step (its docstring states
them).

Rows are kept in the input's float dtype (float32 or float64; other dtypes become float64):
a CuPy array, or a canonical cupyx CSR matrix (sorted columns, no duplicates), rows scaled
to unit length for cosine. The graph is int32, ``(n, degree)``, -1 past each vertex's
links.

A batch of the construction is one search launch (the batch's rows search the graph of the
rows before it, then score the batch's rows before them) and the links made back: the new
links (target, distance, source) sorted by CuPy, then one thread per target merging them
into its list (``mgpu_ann_link``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cupy
import cupyx.scipy.sparse as csp
import dask.config
import numpy as np

from mgpu.backends.dispatch import (ann_build_lookup, ann_half_lookup, ann_prepare_lookup,
                                    ann_search_lookup)
from mgpu.backends.instances import INSTANCES
from mgpu.backends.loader import c_type, get_function
from mgpu.backends.memory import require_gpu
from mgpu.backends.numpy_ann import HALF_DENSE, HALF_RANGE, METRICS

_FILE = "ann.cu"
_SHARED = 48 * 1024  # a block's shared memory: no opt-in past the default
_MAX_ROWS = 2**31 - 1  # ids are int32
_MERGES = {"rank": 1, "bitonic": 0}  # mgpu.ann.merge -> the kernel's flag
_NULL = np.uint64(0)  # a pointer the dense form has no use for


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


@ann_prepare_lookup.register((cupy.ndarray, csp.spmatrix))
def prepare(X: Any, metric: str, sparse: bool | None = None) -> Any:
    """X (checked: a C-ordered array or canonical CSR on the GPU) as the kernels take it,
    in the form asked (``sparse``; None: X's own): float32 stays float32, other dtypes
    become float64; rows scaled to unit length for cosine (rows of zeros kept)."""
    if X.shape[0] > _MAX_ROWS:
        raise ValueError(f"A graph index on the GPU takes at most {_MAX_ROWS:,} rows (int32 "
                         f"ids). Got {X.shape[0]:,}: shard the rows over several indexes.")
    dtype = np.float32 if X.dtype == np.float32 else np.float64
    sparse = csp.issparse(X) if sparse is None else sparse
    if sparse:
        C = csp.csr_matrix(X, dtype=dtype, copy=True)
        C.sum_duplicates()
        if metric == "cosine":
            C = csp.csr_matrix(csp.diags(_inverse_norms(_sq_norms(C))) @ C)
            C.sum_duplicates()
        return C
    D = X.toarray() if csp.issparse(X) else X
    D = cupy.ascontiguousarray(D, dtype=dtype)
    if metric == "cosine":
        D = D * _inverse_norms(cupy.einsum("ij,ij->i", D, D))[:, None]
    return cupy.ascontiguousarray(D)


@ann_half_lookup.register((cupy.ndarray, csp.spmatrix))
def half(data: Any) -> cupy.ndarray:
    """Dense rows (:func:`prepare`'s array) kept in half precision (float16: half the
    memory, and half the bytes a search reads of each row); searched with float32 queries
    and sums. Refused where a value is past float16's largest (65504)."""
    if csp.issparse(data):
        raise ValueError(HALF_DENSE)
    out = data.astype(cupy.float16)
    if not bool(cupy.isfinite(out).all()):
        raise ValueError(HALF_RANGE)
    return out


def _sq_norms(C: csp.csr_matrix) -> cupy.ndarray:
    return cupy.asarray(C.multiply(C).sum(axis=1), dtype=C.dtype).ravel()


def _inverse_norms(sq: cupy.ndarray) -> cupy.ndarray:
    norms = cupy.sqrt(sq)
    return 1.0 / cupy.where(norms > 0, norms, 1.0).astype(sq.dtype)


class _Rows:
    """The pointers and sizes a search launch takes of a set of rows."""

    def __init__(self, data: Any):
        self.sparse = csp.issparse(data)
        self.dtype = data.dtype
        self.n = data.shape[0]
        if self.sparse:
            self.values, self.indptr, self.indices = data.data, data.indptr, data.indices
            self.sq = _sq_norms(data)
            self.dim = data.shape[1]
            lengths = cupy.diff(data.indptr)
            self.most = int(lengths.max()) if self.n else 0  # the longest row
            self.mean = data.nnz / max(self.n, 1)
        else:
            self.values, self.indptr, self.indices, self.sq = data, _NULL, _NULL, _NULL
            self.dim = data.shape[1]
            self.most = self.dim
        # half rows (GraphIndex's half=True): stored float16, scored in float32
        self.half = data.dtype == np.float16
        self.stored = np.dtype(data.dtype).itemsize
        if self.half:
            self.dtype = np.dtype(np.float32)


def _block_threads() -> int:
    """``mgpu.ann.block-threads``, checked. The settings are read where the search is
    launched: by the caller on one device; in a sharded index's tasks, within the client's
    settings, which the tasks carry (:mod:`mgpu.distributed.ann`)."""
    value = dask.config.get("mgpu.ann.block-threads")
    if not isinstance(value, int) or isinstance(value, bool) or value % 32 or not \
            32 <= value <= 1024:
        raise ValueError("The setting mgpu.ann.block-threads must be a multiple of 32 from 32 "
                         f"to 1024 (threads of a CUDA block). Got {value!r} instead.")
    return value


def _merge() -> int:
    """1: T merged into N by rank; 0: by GANNS's bitonic sort and merge
    (``mgpu.ann.merge``, checked)."""
    value = dask.config.get("mgpu.ann.merge")
    if value not in _MERGES:
        raise ValueError(f"The setting mgpu.ann.merge must be one of {set(_MERGES)}. Got "
                         f"{value!r} instead.")
    return _MERGES[value]


def _visited_slots(W: int, room: int) -> int:
    """The slots of a search's table of vertices met (``mgpu.ann.visited-slots``, checked):
    a power of two, at least twice T's length (a step's new vertices always find a free
    slot), as many as the shared memory left (``room`` bytes) holds; 0, GANNS's lazy check
    alone, where asked or where it holds too few."""
    value = dask.config.get("mgpu.ann.visited-slots")
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError("The setting mgpu.ann.visited-slots must be an integer, 0 or more "
                         f"(0: no table). Got {value!r} instead.")
    H = _pow2(max(value, 2 * W)) if value else 0
    while H and 4 * H > room:
        H //= 2
    return H if H >= 2 * W else 0


def _group(rows: _Rows) -> int:
    """The lanes that score a neighbour together, 4 to 32: about two nonzeros a lane
    (sparse, on the rows' mean), or four loads (dense: of 16-byte vectors where the rows
    are made of whole ones, else of single values)."""
    if rows.sparse:
        return min(32, max(4, _pow2(int(np.ceil(rows.mean / 2)))))
    vector = 16 // rows.stored
    loads = rows.dim // vector if rows.dim % vector == 0 else rows.dim
    return min(32, max(4, _pow2(int(np.ceil(loads / 4)))))


def _search(rows: _Rows, queries: _Rows, q0: int, nq: int, graph: cupy.ndarray,
            degree: cupy.ndarray, limit: int, pred_lo: int, metric: str, l_n: int, e: int,
            k_out: int, diverse: bool = False) -> tuple[cupy.ndarray, cupy.ndarray]:
    """One launch of ``mgpu_ann_search`` over queries q0 .. q0 + nq - 1: (ids int32, dist),
    each (nq, k_out)."""
    width = graph.shape[1]
    W = _pow2(max(width, 4))  # at least 4: the staged query starts 16-byte aligned
    L = _pow2(max(l_n, k_out, W))
    item = np.dtype(rows.dtype).itemsize
    fixed = 2 * (L + W) * (item + 4) + 2 * L + 16
    if fixed > _SHARED:
        raise ValueError(f"A search keeps {L} candidates and {W} neighbours in a block's "
                         f"shared memory, more than its {_SHARED // 1024} KiB: use fewer "
                         "candidates or a smaller degree.")
    per = item + (4 if rows.sparse else 0)
    qcap = queries.most if fixed + queries.most * per <= _SHARED else 0
    H = _visited_slots(W, _SHARED - fixed - qcap * per)
    ids = cupy.empty((nq, k_out), dtype=np.int32)
    dist = cupy.empty((nq, k_out), dtype=rows.dtype)
    if nq == 0:
        return ids, dist
    fn = get_function(_FILE, f"mgpu_ann_search<{c_type(rows.dtype)}, "
                      f"{'true' if rows.sparse else 'false'}"
                      f"{', unsigned short' if rows.half else ''}>", INSTANCES[_FILE])
    i32 = np.int32
    threads = _block_threads()
    fn((nq,), (threads,), (
        rows.values, rows.indptr, rows.indices, rows.sq, i32(rows.dim),
        queries.values, queries.indptr, queries.indices, queries.sq, i32(q0), i32(nq),
        graph, degree, i32(width), i32(0), i32(limit), i32(pred_lo),
        i32(METRICS.index(metric)), i32(l_n), i32(e), i32(L), i32(W), i32(qcap),
        i32(_group(rows)), i32(H), i32(_merge()), i32(diverse), i32(k_out), ids, dist),
       shared_mem=fixed + qcap * per + 4 * H)
    return ids, dist


def _link_back(graph: cupy.ndarray, link_dist: cupy.ndarray, degree: cupy.ndarray,
               own: cupy.ndarray, s: int, c_ids: cupy.ndarray, c_dist: cupy.ndarray) -> None:
    """Each link made by the batch from row s on, added back in the other direction."""
    made = c_ids >= 0
    targets = c_ids[made]
    if targets.size == 0:
        return
    sources = cupy.broadcast_to(cupy.arange(s, s + c_ids.shape[0], dtype=np.int32)[:, None],
                                c_ids.shape)[made]
    dists = c_dist[made]
    order = cupy.lexsort(cupy.stack([sources.astype(np.float64), dists.astype(np.float64),
                                     targets.astype(np.float64)]))
    targets, sources, dists = targets[order], sources[order], dists[order]
    starts = cupy.flatnonzero(cupy.concatenate([cupy.ones(1, dtype=bool),
                                                targets[1:] != targets[:-1]]))
    m = int(starts.size)
    seg = cupy.concatenate([starts, cupy.asarray([targets.size])]).astype(np.int32)
    fn = get_function(_FILE, f"mgpu_ann_link<{c_type(link_dist.dtype)}>", INSTANCES[_FILE])
    fn((-(-m // 256),), (256,), (graph, link_dist, degree, own, np.int32(graph.shape[1]),
                                 cupy.ascontiguousarray(targets[starts]), seg,
                                 cupy.ascontiguousarray(sources),
                                 cupy.ascontiguousarray(dists), np.int32(m)))


@ann_build_lookup.register((cupy.ndarray, csp.spmatrix))
def build_graph(data: Any, metric: str, d_min: int, d_max: int, l_n: int, e: int,
                batch: int, progress: Callable[[int, int], None] | None = None,
                diverse: bool = False) -> tuple[cupy.ndarray, cupy.ndarray]:
    """The graph of the rows of ``data`` (:func:`prepare`'s): (graph, degree), int32,
    graph of shape (n, d_max) with -1 past each vertex's degree. ``progress(done, n)``,
    where given, is called after each batch is queued; ``diverse``: a point links only to
    candidates nearer to it than to the candidates it linked to before them."""
    rows = _Rows(data)
    if rows.half:  # the graph is built on the full rows, then they may be halved
        raise ValueError("The proximity graph is built on float32 or float64 rows; halve "
                         "them (mgpu.backends.ann_half_lookup) once it is built.")
    n = rows.n
    item = np.dtype(rows.dtype).itemsize
    require_gpu(n * d_max * (4 + item) + 8 * n + 2 * batch * d_min * (8 + item),
                f"the proximity graph of {n:,} rows of degree {d_max}",
                "Use a smaller degree, or shard the rows over several indexes.")
    graph = cupy.full((n, d_max), -1, dtype=np.int32)
    link_dist = cupy.full((n, d_max), np.inf, dtype=rows.dtype)
    degree = cupy.zeros(n, dtype=np.int32)
    own = cupy.zeros(n, dtype=np.int32)
    for s in range(0, n, batch):
        t = min(n, s + batch)
        c_ids, c_dist = _search(rows, rows, s, t - s, graph, degree, s, s, metric, l_n, e,
                                d_min, diverse)
        graph[s:t, :d_min] = c_ids
        link_dist[s:t, :d_min] = c_dist
        degree[s:t] = own[s:t] = (c_ids >= 0).sum(axis=1, dtype=np.int32)
        _link_back(graph, link_dist, degree, own, s, c_ids, c_dist)
        if progress is not None:
            progress(t, n)
    return graph, degree


@ann_search_lookup.register((cupy.ndarray, csp.spmatrix))
def search_graph(data: Any, graph: cupy.ndarray, degree: cupy.ndarray, queries: Any, k: int,
                 metric: str, l_n: int, e: int) -> tuple[cupy.ndarray, cupy.ndarray]:
    """The k nearest rows of ``data`` to each query (in :func:`prepare`'s form, the same as
    ``data``'s) found in ``graph`` from vertex 0: (distances, indices int64), each
    (n_queries, k), nearest first; -1 and inf past the vertices a search reached."""
    # the kernel reads the rows and the queries as one type (float32 queries: half rows)
    want = np.float32 if data.dtype == np.float16 else data.dtype
    if queries.dtype != want:
        queries = queries.astype(want)
    rows, qs = _Rows(data), _Rows(queries)
    if _search_kind() == "heaps":
        ids, dist = _search_heaps(data, graph, degree, queries, metric, l_n, k)
    else:
        ids, dist = _search(rows, qs, 0, qs.n, graph, degree, rows.n, -1, metric, l_n, e, k)
    return dist, ids.astype(np.int64)


def _search_kind() -> str:
    """``mgpu.ann.search``, checked: ganns (the default) or heaps (the naive baseline)."""
    value = dask.config.get("mgpu.ann.search")
    if value not in ("ganns", "heaps"):
        raise ValueError("The setting mgpu.ann.search must be one of {'ganns', 'heaps'}. Got "
                         f"{value!r} instead.")
    return value


_HEAP_SCRATCH = 1 << 30  # bytes of heaps and tables a launch of the naive search takes


def _search_heaps(data: Any, graph: cupy.ndarray, degree: cupy.ndarray, queries: Any,
                  metric: str, ef: int, k: int) -> tuple[cupy.ndarray, cupy.ndarray]:
    """The naive baseline (``mgpu.ann.search = "heaps"``, ``mgpu_ann_search_heap``): one
    thread a query, binary heaps and a table of the vertices met in global memory, in
    launches of as many queries as ``_HEAP_SCRATCH`` bytes of them hold."""
    if csp.issparse(data) or data.dtype == np.float16:
        raise ValueError("The setting mgpu.ann.search = 'heaps' (the naive baseline) searches "
                         "dense rows of float32 or float64 only: set it back to 'ganns' for "
                         "sparse or half rows.")
    ef = max(ef, k)
    cap = _pow2(4 * ef * graph.shape[1])
    cand_cap = cap - cap // 4  # a candidate a vertex met: the heap cannot fill first
    item = data.dtype.itemsize
    per = (cand_cap + ef) * (4 + item) + 4 * cap
    step = max(1, _HEAP_SCRATCH // per)
    nq = queries.shape[0]
    ids = cupy.empty((nq, k), dtype=np.int32)
    dist = cupy.empty((nq, k), dtype=data.dtype)
    fn = get_function(_FILE, f"mgpu_ann_search_heap<{c_type(data.dtype)}>", INSTANCES[_FILE])
    i32 = np.int32
    for lo in range(0, nq, step):
        n = min(step, nq - lo)
        heap_id = cupy.empty((n, cand_cap + ef), dtype=np.int32)
        heap_dist = cupy.empty((n, cand_cap + ef), dtype=data.dtype)
        table = cupy.full((n, cap), -1, dtype=np.int32)
        Q = cupy.ascontiguousarray(queries[lo:lo + n])
        fn(((n + 127) // 128,), (128,), (
            data, i32(data.shape[1]), Q, i32(n), graph, degree, i32(graph.shape[1]),
            i32(METRICS.index(metric)), i32(ef), i32(cand_cap), i32(cap), heap_id, heap_dist,
            table, i32(k), ids[lo:lo + n], dist[lo:lo + n]))
    return ids, dist
