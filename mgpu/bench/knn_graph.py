"""The k-nearest-neighbour graph of a dataset's rows on a cluster: ``mgpu run knn-graph``.

The index is spread over the workers in nnz-balanced row tiles, every row is queried
against it, and each row's own entry is dropped, as scikit-learn's ``kneighbors_graph``
does. On a cluster of one worker kind (all GPU or all CPU workers) the rows go round the
workers SPMD (:func:`mgpu.distributed.knn_graph.all_knn`); a mixed cluster sends query batches
to the tiles as tasks (:func:`mgpu.knn`). Both give the one-device graph.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from numbers import Integral
from typing import Any

import numpy as np
import scipy.sparse as sp

# The private checks of mgpu.ops.distances, imported in this one place.
from mgpu.ops.distances import check_knn_input, check_knn_values, drop_self, resolve_metric
from mgpu.ops.validation import Interval, check_param

logger = logging.getLogger(__name__)

__all__ = ["graph_stats", "knn_graph"]


def knn_graph(S: sp.spmatrix, k: int, *, metric: str = "cosine", p: float = 2.0,
              parts: int | None = None, address: str | None = None,
              gpus: bool | None = None, progress: Callable[[int], Any] | None = None
              ) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
    """The k-NN graph of the rows of ``S``, computed on a cluster.

    Parameters
    ----------
    S : sparse matrix of shape (n_samples, n_features)
    k : int
        Neighbours per row, the row itself excluded: in [1, n_samples - 1].
    metric, p
        Any metric or alias of ``mgpu.ops.distances.SEMIRINGS``, and Minkowski's exponent.
    parts : int, optional
        Row tiles of the index (default: one per worker).
    address, gpus
        The cluster, as ``mgpu.connect`` takes them (default: an embedded one).
    progress : callable, optional
        Called with the number of rows done as batches (or the ring's steps) finish.

    Returns
    -------
    G : csr_matrix of shape (n_samples, n_samples)
        Row i holds its k neighbours, distances as values.
    distances, indices : ndarray of shape (n_samples, k)

    Raises
    ------
    ValueError, TypeError
        An unknown metric, input the metric cannot take, fewer than 2 rows, k or parts out
        of range; before any cluster is started.
    """
    from mgpu import knn
    from mgpu.distributed import connect, from_scipy, workers_now
    from mgpu.distributed.knn_graph import all_knn, one_worker_kind

    ring, p = resolve_metric(metric, p, func="knn-graph")
    S = check_knn_input(sp.csr_matrix(S), "INPUT", "knn-graph")
    check_knn_values(S, "INPUT", "knn-graph", ring)
    n = S.shape[0]
    if n < 2:  # no k fits: say what is wrong with the input, not with k
        raise ValueError(f"The INPUT of knn-graph has {n} row(s) ("
                         + ("an empty file?" if n == 0 else "nothing to be a neighbour")
                         + "); a k-NN graph needs at least 2.")
    if not 1 <= k < n:
        raise ValueError(f"The 'k' parameter of knn-graph must be in [1, {n - 1}] for {n:,} "
                         f"rows. Got {k}.")
    check_param(parts, "parts", "knn-graph", [Interval(Integral, 1, None), None])
    with connect(address, gpus=gpus) as client:
        X = from_scipy(S, parts, axis=0, client=client)
        if one_worker_kind(client):
            logger.info("knn-graph: the rows go round the %d worker(s) SPMD",
                        len(workers_now(client)))
            d, i = all_knn(X, k + 1, metric=ring.name, p=p, client=client, progress=progress)
        else:  # GPU and CPU workers: no one communicator; query batches go to the tiles
            logger.info("knn-graph: a mixed cluster; query batches go to the tiles as tasks")
            d, i = knn(X, S, k + 1, metric=ring.name, p=p, progress=progress)
    d, i = drop_self(d, i, k)
    G = sp.csr_matrix((d.ravel(), i.ravel(), np.arange(0, n * k + 1, k)), shape=(n, n))
    return G, d, i


def graph_stats(G: sp.csr_matrix, d: np.ndarray, i: np.ndarray) -> dict[str, Any]:
    """What ``mgpu run knn-graph`` reports of a graph: the finite distances and their
    quantiles (0, 0.5, 0.9, 1), how many are infinite, the in-degrees and the share of
    edges whose reverse is an edge too.

    >>> G = sp.csr_matrix(np.array([[0, 1.0], [2.0, 0]]))
    >>> s = graph_stats(G, np.array([[1.0], [2.0]]), np.array([[1], [0]]))
    >>> s["mutual"], s["in_degree"].tolist(), s["infinite"]
    (1.0, [1, 1], 0)
    """
    indeg = np.bincount(i.ravel(), minlength=G.shape[0])
    mutual = G.copy()
    mutual.data[:] = 1.0
    fin = d[np.isfinite(d)]
    return {
        "finite": fin,
        "quantiles": np.quantile(fin, [0.0, 0.5, 0.9, 1.0]) if fin.size else [np.nan] * 4,
        "infinite": int(d.size - fin.size),
        "in_degree": indeg,
        "mutual": float(mutual.multiply(mutual.T).sum()) / max(G.nnz, 1),
    }


# ----------------------------------------------------------------- mgpu bench knn-graph


def _one_device(X: sp.csr_matrix, Q: sp.csr_matrix, k: int, metric: str, gpu: bool
                ) -> tuple[float, np.ndarray, np.ndarray]:
    """Seconds, distances and ids of ``mgpu.knn(X, Q, k)`` on this process's device (the
    GPU's kernels compiled first, on a few queries, untimed)."""
    import time

    import mgpu

    if gpu:  # the one-device run on the GPU: cupyx data in, synchronised before the clock
        import cupy
        import cupyx.scipy.sparse as csp

        Xg, Qg = csp.csr_matrix(X), csp.csr_matrix(Q)
        mgpu.knn(Xg, Qg[:256], k, metric=metric)
        cupy.cuda.get_current_stream().synchronize()
        t0 = time.perf_counter()
        d, i = mgpu.knn(Xg, Qg, k, metric=metric)
        cupy.cuda.get_current_stream().synchronize()
        t = time.perf_counter() - t0
        d, i = d.get(), i.get()
        del Xg, Qg
        cupy.get_default_memory_pool().free_all_blocks()
        return t, d, i
    t0 = time.perf_counter()
    d, i = mgpu.knn(X, Q, k, metric=metric)
    return time.perf_counter() - t0, d, i


def bench_graph(S: sp.csr_matrix, k: int, metric: str, workers: tuple[int, ...], *,
                weak_rows: int = 0, check_rows: int = 2000, gpus: bool | None = None,
                progress: Callable[[str], Any] | None = None) -> list[dict[str, Any]]:
    """The kNN graph of every row of S (k nearest other rows, k + 1 with the row itself) on
    one device and SPMD on 1, 2, 4, … workers, in one run.

    GPU runs use float32 (one device and workers alike). For each worker count an embedded
    cluster is started, S is placed in one nnz-balanced row tile per worker and
    :func:`mgpu.distributed.knn_graph.all_knn` is timed once, after an untimed call on a small
    corpus that compiles the kernels on every worker; its ids must equal the one-device
    call's. With ``weak_rows``, weak scaling too: the first ``weak_rows × workers`` rows on
    that many workers (rows per worker fixed; the work per worker grows with the workers,
    as every row meets every other); efficiency is the pairs per second per worker against
    one worker's, and the ids of the first ``check_rows`` rows are checked against one
    device on the same rows.
    """
    import time

    from mgpu.backends import is_gpu_array
    from mgpu.distributed import connect, from_scipy, visible_gpus
    from mgpu.distributed.knn_graph import all_knn

    use_gpus = visible_gpus() > 0 if gpus is None else gpus
    X = sp.csr_matrix(S, dtype=np.float32 if use_gpus else np.float64)
    n = X.shape[0]
    t, _, ids = _one_device(X, X, k + 1, metric, use_gpus)
    kind = "GPU" if use_gpus else "CPU"
    out: list[dict[str, Any]] = [{"mode": "one device", "workers": 0, "kind": kind,
                                  "rows": n, "nnz": int(X.nnz), "seconds": t,
                                  "rows_per_s": n / t}]
    if progress is not None:
        progress(f"one device: {t:.2f} s ({n / t:,.0f} rows/s)")
    weak_ref: dict[int, tuple[float, np.ndarray]] = {}
    for w in workers:
        rows = min(n, weak_rows * w) if weak_rows else 0
        if rows and rows < n and rows not in weak_ref:  # the weak run's reference rows
            Xw = X[:rows]
            weak_ref[rows] = _one_device(Xw, Xw[:check_rows], k + 1, metric, use_gpus)[::2]
    for w in workers:
        with connect(n_workers=w, gpus=gpus) as client:
            warm = from_scipy(X[: min(n, 1024 * w)], w, axis=0, client=client)
            all_knn(warm, k + 1, metric=metric, client=client)
            Xd = from_scipy(X, w, axis=0, client=client)
            kind = "GPU" if is_gpu_array(Xd._meta) else "CPU"  # the report's words only
            t0 = time.perf_counter()
            _, got = all_knn(Xd, k + 1, metric=metric, client=client)
            t = time.perf_counter() - t0
            out.append({"mode": "strong", "workers": w, "kind": kind, "rows": n,
                        "nnz": int(X.nnz), "seconds": t, "rows_per_s": n / t,
                        "speedup": out[0]["seconds"] / t,
                        "ids_equal": bool(np.array_equal(got, ids))})
            if progress is not None:
                progress(f"{w} {kind} worker(s): {t:.2f} s, {out[0]['seconds'] / t:.2f}× one "
                         f"device, ids {'identical' if out[-1]['ids_equal'] else 'DIFFER'}")
            rows = min(n, weak_rows * w) if weak_rows else 0
            if not rows:
                continue
            if rows == n:  # the strong run is this weak run
                t_w, same = t, out[-1]["ids_equal"]
            else:
                Xw = from_scipy(X[:rows], w, axis=0, client=client)
                t0 = time.perf_counter()
                _, got = all_knn(Xw, k + 1, metric=metric, client=client)
                t_w = time.perf_counter() - t0
                same = bool(np.array_equal(got[:check_rows], weak_ref[rows][1]))
            out.append({"mode": "weak", "workers": w, "kind": kind, "rows": rows,
                        "nnz": int(X[:rows].nnz), "seconds": t_w,
                        "pairs_per_s_per_worker": rows * rows / t_w / w, "ids_equal": same})
    weak = [r for r in out if r["mode"] == "weak"]
    for r in weak:
        r["efficiency"] = r["pairs_per_s_per_worker"] / weak[0]["pairs_per_s_per_worker"]
    return out


def graph_markdown(rows: list[dict[str, Any]], label: str, metric: str, k: int) -> str:
    """The strong-scaling table (speedup against one device) and, when measured, the weak
    one (efficiency against one worker)."""
    lines = [f"kNN graph of {label}, {metric}, k={k} (every row a query)", "",
             "| run | rows | nnz | seconds | rows/s | speedup vs one device | ids equal |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["mode"] == "weak":
            continue
        run = "one device" if r["mode"] == "one device" else f"{r['workers']} {r['kind']} SPMD"
        lines.append(f"| {run} | {r['rows']:,} | {r['nnz']:,} | {r['seconds']:.2f} | "
                     f"{r['rows_per_s']:,.0f} | "
                     + (f"{r['speedup']:.2f}× | " if "speedup" in r else "1.00× | ")
                     + ("– |" if "ids_equal" not in r else
                        ("yes |" if r["ids_equal"] else "NO |")))
    weak = [r for r in rows if r["mode"] == "weak"]
    if weak:
        lines += ["", "| weak scaling | rows | seconds | pairs/s per worker | efficiency | "
                  "ids equal |", "|---|---|---|---|---|---|"]
        for r in weak:
            lines.append(f"| {r['workers']} {r['kind']} | {r['rows']:,} | {r['seconds']:.2f} | "
                         f"{r['pairs_per_s_per_worker']:.3g} | {r['efficiency']:.1%} | "
                         f"{'yes' if r['ids_equal'] else 'NO'} |")
    return "\n".join(lines)
