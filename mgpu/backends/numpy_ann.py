"""Graph-based approximate nearest neighbours on the CPU (numba, all cores): the search of
GANNS and the batched construction of GGraphCon (Yu, PhD thesis ch. 4), the reference that
mgpu's GPU graph kernels are checked against, and the path for small data.

The graph is held as fixed-width arrays: ``graph[v, :degree[v]]`` are v's neighbours (the
links v made when it was inserted, nearest first, then the nearest of those made to it,
nearest first), -1 after them.

**Search** (one query): two fixed-length arrays instead of priority queues. N holds the
``l_n`` best vertices met so far (id, distance, *explored* flag), sorted by distance; T holds
the neighbours of the vertex being explored, each scored as met. A step explores the first
unexplored vertex among the first ``e`` entries of N (the exploration limit), sorts T and
merges it into N, keeping the best ``l_n``. **Lazy check**: a neighbour's distance is computed
without first asking whether it was visited (on a GPU a distance is cheap and a shared
visited set is not); a vertex met again has the same distance, so the merge, which orders by
(distance, id), finds the two copies side by side and keeps N's (with its flag). The search
ends when the first ``e`` entries of N are all explored.

**Construction**: the points are inserted in batches of ``batch``, in order. Each point of
a batch searches the graph of the points before the batch (all of them at once), takes the
``d_min`` nearest of what it found together with the points of its own batch before it
(scored directly), and links to them; each of those links is added back in the other
direction. Within a batch a point links to its predecessors only, as NSW's one-by-one
insertion does: a batch's first points, which have few, link far, and those long links
are what a search needs to cross from one cluster of the data to another. A vertex keeps
the links it made (its long ones, where it came early) and, after them, the nearest of
the links made to it, ``d_max`` in all: a link made to a full vertex is dropped where it
would be the farthest of those made to it. (Linked to the whole batch, each point of a
batch of clustered data links only within its cluster; keeping only the nearest links of
each vertex, the later points' short links push out the early points' long ones: either
way the graph falls apart into the clusters: on 30 clusters in 16 dimensions (3,000 rows),
a search from vertex 0 found 2–77% of the true 10 nearest at batches of 1,024–3,000, where
these rules find 90–99% at batches of 64–3,000.)

With ``diverse`` (HNSW's heuristic, Malkov and Yashunin, 2018), a point links only to
candidates nearer to it than to every candidate it linked to before them (taken in order
of distance, up to ``d_min``): where several candidates lie in one direction, the nearest
stands for them, and the links that remain reach in other directions; the links made back
are kept as above.

Distances: ``sqeuclidean``; ``cosine`` (on rows scaled to unit length beforehand; a row of
zeros is at distance 1 from every row, as in scikit-learn); ``inner_product`` (the negative
dot product, so that nearer is larger).

The rows are dense (a 2-D array) or sparse: a tuple (indptr, indices, values, squared
norms) of a canonical CSR matrix (:func:`prepare` makes either), queries in the same form.
The kernels are written once over both: :func:`_row` gives a row as a query and
:func:`_distance` scores a row against one (numba compiles each form's version; a sparse
pair's dot product merges their sorted columns, and the squared euclidean distance is
expanded from it and the norms, as mgpu's sparse kNN does).
"""
from __future__ import annotations

from typing import Any

import numba
import numpy as np
import scipy.sparse as sp
from numba import types
from numba.extending import overload

from mgpu.backends.dispatch import (ann_build_lookup, ann_half_lookup, ann_prepare_lookup,
                                    ann_search_lookup)
from mgpu.backends.jit import njit

__all__ = ["METRICS", "build_graph", "half", "prepare", "rows_of", "search_graph"]

METRICS = ("sqeuclidean", "cosine", "inner_product")  # codes 0, 1, 2 in the kernels


def _row(rows: Any, p: int) -> Any:
    """Row p of ``rows`` as a query: a 1-D array (dense), or (indices, values, squared
    norm) (sparse). Compiled by the overload below."""
    raise NotImplementedError


def _distance(rows: Any, u: int, q: Any, metric: int) -> float:
    """The distance of row u of ``rows`` to the query q (:func:`_row`'s form). Compiled by
    the overload below."""
    raise NotImplementedError


def _count(rows: Any) -> int:
    """How many rows ``rows`` holds. Compiled by the overload below."""
    raise NotImplementedError


@overload(_row)
def _row_forms(rows, p):  # no annotations: numba compares these parameters with the forms'
    if isinstance(rows, types.Array):
        return lambda rows, p: rows[p]

    def sparse(rows, p):
        indptr, indices, values, sq = rows
        a, b = indptr[p], indptr[p + 1]
        return indices[a:b], values[a:b], sq[p]

    return sparse


@overload(_count)
def _count_forms(rows):
    if isinstance(rows, types.Array):
        return lambda rows: rows.shape[0]
    return lambda rows: rows[0].shape[0] - 1


@overload(_distance)
def _distance_forms(rows, u, q, metric):
    if isinstance(rows, types.Array):
        def dense(rows, u, q, metric):
            x = rows[u]
            s = 0.0
            if metric == 0:
                for j in range(x.shape[0]):
                    d = x[j] - q[j]
                    s += d * d
                return s
            for j in range(x.shape[0]):
                s += x[j] * q[j]
            return 1.0 - s if metric == 1 else -s

        return dense

    def sparse(rows, u, q, metric):
        indptr, indices, values, sq = rows
        q_idx, q_val, q_sq = q
        a, b = indptr[u], indptr[u + 1]
        i = 0
        dot = 0.0
        while a < b and i < q_idx.shape[0]:  # both rows' columns sorted: one merge
            if indices[a] == q_idx[i]:
                dot += values[a] * q_val[i]
                a += 1
                i += 1
            elif indices[a] < q_idx[i]:
                a += 1
            else:
                i += 1
        if metric == 0:
            return max(sq[u] + q_sq - 2.0 * dot, 0.0)
        return 1.0 - dot if metric == 1 else -dot

    return sparse


@njit(nogil=True, inline="always")
def _before(d1: float, i1: int, d2: float, i2: int) -> bool:
    """(d1, i1) orders before (d2, i2): by distance, ties by the lower id."""
    return d1 < d2 or (d1 == d2 and i1 < i2)


@njit(nogil=True)
def _sort_run(ids: np.ndarray, dist: np.ndarray, count: int) -> None:
    """Sort the first ``count`` (id, distance) pairs by (distance, id): an insertion sort (a
    run is one vertex's neighbours, a few dozen)."""
    for i in range(1, count):
        vi, vd = ids[i], dist[i]
        j = i - 1
        while j >= 0 and _before(vd, vi, dist[j], ids[j]):
            ids[j + 1] = ids[j]
            dist[j + 1] = dist[j]
            j -= 1
        ids[j + 1] = vi
        dist[j + 1] = vd


@njit(nogil=True)
def _merge(n_ids: np.ndarray, n_dist: np.ndarray, n_done: np.ndarray, count: int,
           t_ids: np.ndarray, t_dist: np.ndarray, nt: int, m_ids: np.ndarray,
           m_dist: np.ndarray, m_done: np.ndarray) -> int:
    """Merge the sorted T (nt entries) into the sorted N (count entries), keeping the best
    len(n_ids) and dropping a T entry equal to an N entry (the same vertex met again: same
    id, same distance, adjacent in the merge); m_*: scratch of N's length. Returns N's new
    count."""
    cap = n_ids.shape[0]
    i = j = out = 0
    while out < cap and (i < count or j < nt):
        if j >= nt or (i < count and not _before(t_dist[j], t_ids[j], n_dist[i], n_ids[i])):
            if j < nt and t_ids[j] == n_ids[i] and t_dist[j] == n_dist[i]:
                j += 1  # the same vertex: N's copy keeps its flag
            m_ids[out] = n_ids[i]
            m_dist[out] = n_dist[i]
            m_done[out] = n_done[i]
            i += 1
        else:
            m_ids[out] = t_ids[j]
            m_dist[out] = t_dist[j]
            m_done[out] = False
            j += 1
        out += 1
    n_ids[:out] = m_ids[:out]
    n_dist[:out] = m_dist[:out]
    n_done[:out] = m_done[:out]
    return out


@njit(nogil=True)
def _search_one(data: Any, graph: np.ndarray, degree: np.ndarray, q: Any, entry: int,
                limit: int, metric: int, e: int, n_ids: np.ndarray, n_dist: np.ndarray) -> int:
    """Search the graph of vertices 0 .. limit - 1 for q from ``entry``: N (n_ids, n_dist,
    of length l_n) filled nearest first; returns how many entries it holds."""
    l_n = n_ids.shape[0]
    n_done = np.zeros(l_n, dtype=np.bool_)
    m_ids = np.empty(l_n, dtype=n_ids.dtype)
    m_dist = np.empty(l_n, dtype=n_dist.dtype)
    m_done = np.empty(l_n, dtype=np.bool_)
    width = graph.shape[1]
    t_ids = np.empty(width, dtype=n_ids.dtype)
    t_dist = np.empty(width, dtype=n_dist.dtype)
    n_ids[0] = entry
    n_dist[0] = _distance(data, entry, q, metric)
    count = 1
    while True:
        pick = -1
        for i in range(min(e, count)):
            if not n_done[i]:
                pick = i
                break
        if pick < 0:
            return count
        n_done[pick] = True
        v = n_ids[pick]
        nt = 0
        for j in range(degree[v]):
            u = graph[v, j]
            if u < limit:  # lazy: scored whether or not it was met before
                t_ids[nt] = u
                t_dist[nt] = _distance(data, u, q, metric)
                nt += 1
        _sort_run(t_ids, t_dist, nt)
        count = _merge(n_ids, n_dist, n_done, count, t_ids, t_dist, nt, m_ids, m_dist, m_done)


@njit(parallel=True, nogil=True)
def _search(data: Any, graph: np.ndarray, degree: np.ndarray, queries: Any, entry: int,
            metric: int, l_n: int, e: int) -> tuple[np.ndarray, np.ndarray]:
    nq = _count(queries)
    ids = np.full((nq, l_n), -1, dtype=np.int64)
    dist = np.full((nq, l_n), np.inf, dtype=np.float64)
    for i in numba.prange(nq):
        _search_one(data, graph, degree, _row(queries, i), entry, _count(data), metric, e,
                    ids[i], dist[i])
    return ids, dist


@njit(nogil=True)
def _link(graph: np.ndarray, link_dist: np.ndarray, degree: np.ndarray, own: np.ndarray,
          v: int, u: int, d: float) -> None:
    """Add the link made to v by u (at distance d) to v's list, after v's own ``own[v]``
    links: those kept nearest first, at most graph.shape[1] in all; not where u is there
    already or would be the farthest of a full list."""
    k = degree[v]
    for j in range(k):
        if graph[v, j] == u:
            return
    width = graph.shape[1]
    first = own[v]
    if k == width:
        if first == width or not _before(d, u, link_dist[v, k - 1], graph[v, k - 1]):
            return
        k -= 1  # the farthest link made to v gives way
    j = k - 1
    while j >= first and _before(d, u, link_dist[v, j], graph[v, j]):
        graph[v, j + 1] = graph[v, j]
        link_dist[v, j + 1] = link_dist[v, j]
        j -= 1
    graph[v, j + 1] = u
    link_dist[v, j + 1] = d
    degree[v] = k + 1


@njit(parallel=True, nogil=True)
def _candidates(data: Any, graph: np.ndarray, degree: np.ndarray, s: int, t: int,
                metric: int, d_min: int, l_n: int, e: int, diverse: bool
                ) -> tuple[np.ndarray, np.ndarray]:
    """For each point p of the batch s .. t - 1: its d_min nearest among the graph's search
    results (vertices 0 .. s - 1) and the batch's points before p, in order of (distance,
    id); with ``diverse``, of the nearest max(l_n, d_min) of them, only those nearer to p
    than to every one taken before them."""
    nb = t - s
    c_ids = np.full((nb, d_min), -1, dtype=np.int64)
    c_dist = np.full((nb, d_min), np.inf, dtype=np.float64)
    for i in numba.prange(nb):
        p = s + i
        q = _row(data, p)
        ids = np.full(l_n + nb, -1, dtype=np.int64)
        dist = np.full(l_n + nb, np.inf, dtype=np.float64)
        found = 0
        if s > 0:
            found = _search_one(data, graph, degree, q, 0, s, metric, e, ids[:l_n],
                                dist[:l_n])
        for u in range(s, p):  # the batch's points before p, as NSW inserts one by one
            ids[found] = u
            dist[found] = _distance(data, u, q, metric)
            found += 1
        by_id = np.argsort(ids[:found], kind="mergesort")  # ties of distance: by id
        order = by_id[np.argsort(dist[:found][by_id], kind="mergesort")]
        kept = 0
        for j in range(min(found, max(l_n, d_min))):  # the nearest max(l_n, d_min)
            c, dc = ids[order[j]], dist[order[j]]
            if diverse:
                row = _row(data, c)
                covered = False
                for m in range(kept):
                    if _distance(data, c_ids[i, m], row, metric) < dc:
                        covered = True
                        break
                if covered:
                    continue
            c_ids[i, kept] = c
            c_dist[i, kept] = dc
            kept += 1
            if kept == d_min:
                break
    return c_ids, c_dist


@njit(nogil=True)
def _link_batch(graph: np.ndarray, link_dist: np.ndarray, degree: np.ndarray,
                own: np.ndarray, s: int, c_ids: np.ndarray, c_dist: np.ndarray) -> None:
    """Each point of the batch from s on, in order: its own links to its candidates (its
    list is empty then: only points inserted after it link to it), then each link back."""
    for i in range(c_ids.shape[0]):
        p = s + i
        k = 0
        while k < c_ids.shape[1] and c_ids[i, k] >= 0:
            graph[p, k] = c_ids[i, k]
            link_dist[p, k] = c_dist[i, k]
            k += 1
        degree[p] = own[p] = k
        for j in range(k):
            _link(graph, link_dist, degree, own, c_ids[i, j], p, c_dist[i, j])


@ann_prepare_lookup.register((np.ndarray, sp.spmatrix, sp.sparray))
def prepare(X: Any, metric: str, sparse: bool | None = None) -> Any:
    """X as the kernels take it, in the form asked (``sparse``; None: X's own): a float64
    C-contiguous array, or the tuple (indptr, indices, values, squared norms) of a
    canonical CSR (int64 row pointers, int32 columns, float64 values); rows scaled to unit
    length for cosine (rows of zeros kept)."""
    sparse = sp.issparse(X) if sparse is None else sparse
    if sparse:
        C = sp.csr_matrix(X, dtype=np.float64, copy=True)
        C.sum_duplicates()  # sorted columns, no duplicates: what the merge needs
        sq = np.asarray(C.multiply(C).sum(axis=1), dtype=np.float64).ravel()
        if metric == "cosine":
            norms = np.sqrt(sq)
            C = sp.csr_matrix(sp.diags(1.0 / np.where(norms > 0, norms, 1.0)) @ C)
            C.sum_duplicates()
            sq = np.asarray(C.multiply(C).sum(axis=1), dtype=np.float64).ravel()
        return (C.indptr.astype(np.int64), C.indices.astype(np.int32),
                np.ascontiguousarray(C.data, dtype=np.float64), sq)
    data = np.ascontiguousarray(X.toarray() if sp.issparse(X) else X, dtype=np.float64)
    if metric == "cosine":
        norms = np.sqrt(np.einsum("ij,ij->i", data, data))
        data = data / np.where(norms > 0, norms, 1.0)[:, None]
    return data


def rows_of(data: Any) -> int:
    """How many rows :func:`prepare`'s form holds."""
    return data.shape[0] if isinstance(data, np.ndarray) else data[0].shape[0] - 1


@ann_build_lookup.register((np.ndarray, tuple))
def build_graph(data: Any, metric: str, d_min: int, d_max: int, l_n: int, e: int,
                batch: int, progress: Any = None, diverse: bool = False
                ) -> tuple[np.ndarray, np.ndarray]:
    """The graph of the rows of ``data`` (:func:`prepare`'s): (graph, degree), graph of shape
    (n, d_max) with -1 past each vertex's degree. ``progress(done, n)``, where given, is
    called after each batch; ``diverse``: a point links only to candidates nearer to it
    than to the candidates it linked to before them."""
    n = rows_of(data)
    code = METRICS.index(metric)
    graph = np.full((n, d_max), -1, dtype=np.int64)
    link_dist = np.full((n, d_max), np.inf, dtype=np.float64)
    degree = np.zeros(n, dtype=np.int64)
    own = np.zeros(n, dtype=np.int64)
    for s in range(0, n, batch):
        t = min(n, s + batch)
        c_ids, c_dist = _candidates(data, graph, degree, s, t, code, d_min, l_n, e,
                                    bool(diverse))
        _link_batch(graph, link_dist, degree, own, s, c_ids, c_dist)
        if progress is not None:
            progress(t, n)
    return graph, degree


# the refusals of GraphIndex's half=True (here and in mgpu.backends.cupy_ann)
HALF_DENSE = ("GraphIndex's half=True keeps dense rows in half precision; these rows are "
              "sparse. Use half=False for sparse rows.")
HALF_RANGE = ("GraphIndex's half=True cannot keep these rows in half precision: a value "
              "(after cosine's scaling to unit length) lies beyond float16's largest, "
              "65504. Scale the rows down, or use half=False.")


@ann_half_lookup.register((np.ndarray, tuple))
def half(data: Any) -> np.ndarray:
    """Dense rows (:func:`prepare`'s array) rounded to half precision, kept as float64: the
    values a GPU's half rows hold, searched as any float64 rows (no memory saved on the
    CPU; the GPU and the CPU then search the same values). Refused where a value is past
    float16's largest (65504)."""
    if isinstance(data, tuple):
        raise ValueError(HALF_DENSE)
    with np.errstate(over="ignore"):
        out = data.astype(np.float16)
    if not np.isfinite(out).all():
        raise ValueError(HALF_RANGE)
    return out.astype(np.float64)


@ann_search_lookup.register((np.ndarray, tuple))
def search_graph(data: Any, graph: np.ndarray, degree: np.ndarray, queries: Any, k: int,
                 metric: str, l_n: int, e: int) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest rows of ``data`` to each query (``queries`` in :func:`prepare`'s form,
    the same as ``data``'s) found in ``graph`` from vertex 0:
    (distances, indices), each (n_queries, k), nearest first; a query that reached fewer
    than k vertices gets -1 and inf past them."""
    ids, dist = _search(data, graph, degree, queries, 0, METRICS.index(metric), l_n, e)
    return dist[:, :k], ids[:, :k]
