"""``mgpu bench ann``: the proximity-graph index (:class:`mgpu.models.GraphIndex`) against
exact neighbours and the CPU graph indexes people use, in one run: recall@k against mgpu's
exact kNN and queries/s, over each index's search parameter, with each index's build time.

With ``gpu``, mgpu's graph index and exact kNN run on the GPU (rows as float32 CuPy arrays
or cupyx CSR; searches timed with CUDA events, builds to the device's last kernel), and
the same graph is also searched by GANNS's other strategies (bitonic merge, a table of the
vertices met), by the naive baseline (:data:`NAIVE`: a CPU search ported as it is, one
thread a query), and with its rows kept in half precision (:data:`HALF`, built again).

Peers, where installed (neither is a dependency of mgpu): hnswlib and Faiss's HNSW
(``IndexHNSWFlat``), on all the machine's CPU cores, built with M = degree // 2 and
efConstruction = the build's candidates, searched with efSearch = each candidates value.
They take dense vectors only: on sparse rows the table says so (no peer exists there).
"""
from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import dask.config
import numpy as np
import scipy.sparse as sp

from mgpu.backends import to_device, to_host
from mgpu.backends.timing import time_cpu, time_gpu

__all__ = ["HALF", "NAIVE", "PEERS", "bench_ann", "markdown", "recall"]

PEERS = {"hnswlib": "hnswlib HNSW", "faiss": "Faiss IndexHNSWFlat"}
"""The peer indexes, by key: their names in tables."""
HALF = "mgpu graph (GPU, half rows)"
"""The row of the index built with ``half=True``: the same graph, its rows kept as
float16 (dense rows, on the GPU)."""
NAIVE = "naive GPU search (heaps, one thread a query)"
"""The naive baseline's row: the same graph searched as a CPU search is, ported as it is
(``mgpu.ann.search = "heaps"``; dense rows only)."""


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    """The share of the true k nearest that were found, over all queries (ids -1 never
    count).

    >>> recall(np.array([[0, 1], [2, -1]]), np.array([[1, 0], [2, 3]]))
    0.75
    """
    hits = sum(np.intersect1d(f[f >= 0], t).size for f, t in zip(found, truth))
    return hits / truth.size


def _timed(fn: Callable[[], Any], gpu: bool = False) -> tuple[Any, float]:
    """``fn()`` and its seconds: a build, timed once (to the GPU's last kernel)."""
    t0 = time.perf_counter()
    out = fn()
    if gpu:
        import cupy

        cupy.cuda.Device().synchronize()
    return out, time.perf_counter() - t0


def _searched(fn: Callable[[], Any], repeats: int, gpu: bool = False) -> tuple[Any, float]:
    """``fn()`` (a search: its first call, untimed, compiles what numba or NVRTC compiles)
    and the median seconds of ``repeats`` more (CUDA events on the GPU)."""
    out = fn()
    timer = time_gpu if gpu else time_cpu
    return out, timer(fn, repeats=repeats, warmup=0)


def _hnswlib(X: np.ndarray, Q: np.ndarray, k: int, metric: str, degree: int, build: int,
             candidates: Sequence[int], repeats: int
             ) -> tuple[float, list[tuple[int, np.ndarray, float]]]:
    import hnswlib

    space = {"euclidean": "l2", "sqeuclidean": "l2", "cosine": "cosine",
             "inner_product": "ip"}[metric]
    index = hnswlib.Index(space=space, dim=X.shape[1])
    index.set_num_threads(os.cpu_count() or 1)

    def make() -> None:
        index.init_index(max_elements=X.shape[0], M=max(2, degree // 2),
                         ef_construction=build, random_seed=0)
        index.add_items(X, np.arange(X.shape[0]))

    _, build_s = _timed(make)
    out = []
    for c in candidates:
        index.set_ef(max(c, k))
        (ids, _), s = _searched(lambda: index.knn_query(Q, k=k), repeats)
        out.append((c, ids.astype(np.int64), s))
    return build_s, out


def _faiss(X: np.ndarray, Q: np.ndarray, k: int, metric: str, degree: int, build: int,
           candidates: Sequence[int], repeats: int
           ) -> tuple[float, list[tuple[int, np.ndarray, float]]]:
    import faiss

    faiss.omp_set_num_threads(os.cpu_count() or 1)
    X32, Q32 = np.ascontiguousarray(X, np.float32), np.ascontiguousarray(Q, np.float32)
    if metric == "cosine":  # inner products of unit rows
        faiss.normalize_L2(X32)
        faiss.normalize_L2(Q32)
    inner = metric in ("cosine", "inner_product")
    index = faiss.IndexHNSWFlat(X.shape[1], max(2, degree // 2),
                                faiss.METRIC_INNER_PRODUCT if inner else faiss.METRIC_L2)
    index.hnsw.efConstruction = build

    _, build_s = _timed(lambda: index.add(X32))
    out = []
    for c in candidates:
        index.hnsw.efSearch = max(c, k)
        (_, ids), s = _searched(lambda: index.search(Q32, k), repeats)
        out.append((c, ids.astype(np.int64), s))
    return build_s, out


_RUNNERS = {"hnswlib": _hnswlib, "faiss": _faiss}

# The GPU search's other strategies, timed on the same graph: GANNS's bitonic networks for
# the merge, and a table of the vertices met, so that no neighbour is scored twice (the
# naive search's visited set) instead of the lazy check (both: the same neighbours, other
# speeds); and the naive baseline, without GANNS's strategies at all (about the same
# neighbours: a best-first search of the same width).
_VARIANTS: dict[str, dict[str, Any]] = {
    "mgpu graph (GPU, bitonic merge)": {"mgpu.ann.merge": "bitonic"},
    "mgpu graph (GPU, visited table)": {"mgpu.ann.visited-slots": 1024},
    NAIVE: {"mgpu.ann.search": "heaps"},
}


def _row(method: str, param: int | None, build_s: float | None, found: np.ndarray | None,
         seconds: float | None, truth: np.ndarray, note: str | None = None) -> dict[str, Any]:
    nq = truth.shape[0]
    return {"method": method, "candidates": param, "build_s": build_s,
            "qps": None if seconds is None else nq / seconds,
            "recall": None if found is None else recall(found, truth), "note": note}


def bench_ann(X: Any, Q: Any, *, k: int = 10, metric: str = "euclidean", degree: int = 32,
              build_candidates: int = 64, candidates: Sequence[int] = (16, 32, 64, 128),
              peers: Sequence[str] = tuple(PEERS), repeats: int = 3, gpu: bool = False,
              batch: int = 1024, progress: Callable[[str], None] | None = None
              ) -> list[dict[str, Any]]:
    """Recall@k and queries/s of mgpu's graph index at each ``candidates`` value, of mgpu's
    exact kNN (the ground truth, recall 1) and of each peer installed, on index X and
    queries Q (dense or scipy sparse, on the CPU): one row per method and search parameter,
    with the build's seconds (one build each). A search's queries/s are from the median of
    ``repeats`` timed calls after one untimed call (whose neighbours are scored; numba
    compiles on a first call). ``gpu``: mgpu's indexes on the GPU (float32); ``batch``:
    the rows the graph's build inserts at a time.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> rows = bench_ann(rng.random((300, 8)), rng.random((20, 8)), k=5, degree=8,
    ...                  build_candidates=16, candidates=(8, 32), peers=())
    >>> [(r["method"], r["candidates"], r["recall"] > 0.5) for r in rows]
    [('mgpu exact', None, True), ('mgpu graph', 8, True), ('mgpu graph', 32, True)]
    """
    import mgpu
    from mgpu.models import GraphIndex

    say = progress or (lambda line: None)
    Xm, Qm = X, Q
    if gpu:  # float32 rows on the GPU (cupyx CSR for sparse ones)
        Xm, Qm = to_device(X.astype(np.float32)), to_device(Q.astype(np.float32))
    where = " (GPU)" if gpu else ""
    (_, truth), exact_s = _searched(lambda: mgpu.knn(Xm, Qm, k, metric=metric), repeats, gpu)
    truth = to_host(truth)
    rows = [_row(f"mgpu exact{where}", None, None, truth, exact_s, truth)]
    say(f"mgpu exact{where}: {rows[0]['qps']:,.0f} q/s")
    index = GraphIndex(k, metric=metric, degree=degree, candidates=max(build_candidates, k),
                       batch=batch)
    if gpu:  # the kernels compiled (NVRTC, once a process) before the build is timed
        _timed(lambda: index.fit(Xm[:min(64, Xm.shape[0])]), gpu)
    _, build_s = _timed(lambda: index.fit(Xm), gpu)
    for variant, settings in ((f"mgpu graph{where}", {}), *(_VARIANTS.items() if gpu else ())):
        if variant == NAIVE and sp.issparse(X):
            rows.append(_row(variant, None, None, None, None, truth, "takes dense rows only"))
            continue
        with dask.config.set(settings):
            rows += _graph_rows(variant, index, Qm, k, candidates, build_s, repeats, truth,
                                gpu, say)
    if gpu:
        rows += _half_rows(index, Xm, Qm, k, build_candidates, candidates, repeats, truth,
                           sp.issparse(X), say)
    for key in peers:
        if sp.issparse(X):
            rows.append(_row(PEERS[key], None, None, None, None, truth,
                             "takes dense vectors only: no peer exists for sparse rows"))
            continue
        try:
            importlib.import_module(key)
        except ImportError:
            rows.append(_row(PEERS[key], None, None, None, None, truth, "not installed"))
            say(f"{PEERS[key]}: not installed")
            continue
        build_s, found = _RUNNERS[key](np.asarray(X), np.asarray(Q), k, metric, degree,
                                       build_candidates, candidates, repeats)
        for c, ids, s in found:
            rows.append(_row(PEERS[key], c, build_s, ids, s, truth))
            say(f"{PEERS[key]}, efSearch {c}: {rows[-1]['qps']:,.0f} q/s, recall@{k} "
                f"{rows[-1]['recall']:.3f} (build {build_s:.2f} s)")
    return rows


def _half_rows(index: Any, Xm: Any, Qm: Any, k: int, build_candidates: int,
               candidates: Sequence[int], repeats: int, truth: np.ndarray, sparse: bool,
               say: Callable[[str], None]) -> list[dict[str, Any]]:
    """The rows of :data:`HALF`: the index built again with ``half=True`` (the same graph,
    its rows then kept as float16), searched at each candidates on the GPU."""
    from sklearn.base import clone

    if sparse:
        return [_row(HALF, None, None, None, None, truth, "takes dense rows only")]
    half = clone(index).set_params(half=True, candidates=max(build_candidates, k))
    try:
        _, build_s = _timed(lambda: half.fit(Xm), True)
    except ValueError as exc:  # a value past float16's range
        return [_row(HALF, None, None, None, None, truth, str(exc))]
    return _graph_rows(HALF, half, Qm, k, candidates, build_s, repeats, truth, True, say)


def _graph_rows(method: str, index: Any, Qm: Any, k: int, candidates: Sequence[int],
                build_s: float, repeats: int, truth: np.ndarray, gpu: bool,
                say: Callable[[str], None]) -> list[dict[str, Any]]:
    """A row for each search of the graph index at each ``candidates``."""
    out = []
    for c in candidates:
        index.set_params(candidates=max(c, k))
        (_, ids), s = _searched(lambda: index.kneighbors(Qm), repeats, gpu)
        out.append(_row(method, c, build_s, to_host(ids), s, truth))
        say(f"{method}, candidates {c}: {out[-1]['qps']:,.0f} q/s, recall@{k} "
            f"{out[-1]['recall']:.3f} (build {build_s:.2f} s)")
    return out


def markdown(rows: Sequence[dict[str, Any]], k: int = 10) -> str:
    """The rows as a Markdown table.

    >>> print(markdown([{"method": "m", "candidates": 8, "build_s": 1.0, "qps": 2000.0,
    ...                  "recall": 0.95, "note": None}]))
    | method | candidates / efSearch | build s | queries/s | recall@10 |
    |---|---|---|---|---|
    | m | 8 | 1.00 | 2,000 | 0.950 |
    """
    lines = [f"| method | candidates / efSearch | build s | queries/s | recall@{k} |",
             "|---|---|---|---|---|"]
    for r in rows:
        if r["note"]:
            lines.append(f"| {r['method']} | | | | {r['note']} |")
            continue
        build = "" if r["build_s"] is None else f"{r['build_s']:.2f}"
        param = "" if r["candidates"] is None else str(r["candidates"])
        lines.append(f"| {r['method']} | {param} | {build} | {r['qps']:,.0f} | "
                     f"{r['recall']:.3f} |")
    return "\n".join(lines)
