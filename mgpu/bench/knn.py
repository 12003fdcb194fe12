"""``mgpu bench knn``: exact kNN queries per second of mgpu against scikit-learn, one run.

scikit-learn's brute force runs on all the machine's cores (``n_jobs=-1``). Both answer the
same queries; the distances are compared and the neighbour ids must agree up to exact ties.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu.backends import to_host
from mgpu.backends.timing import time_cpu

# scikit-learn's name where it differs from mgpu's
_SKLEARN = {"manhattan": "cityblock"}


def bench_cpu(index: sp.csr_matrix, queries: sp.csr_matrix, k: int, metrics: tuple[str, ...],
              repeats: int = 1) -> list[dict[str, Any]]:
    """Queries/s of mgpu's CPU path and of scikit-learn's brute force, per metric."""
    from sklearn.neighbors import NearestNeighbors

    import mgpu
    from mgpu.ops.distances import resolve_metric

    out = []
    for metric in metrics:
        ring, _ = resolve_metric(metric, 2, func="bench knn")
        d, i = mgpu.knn(index, queries, k, metric=ring.name)
        t_mgpu = time_cpu(lambda: mgpu.knn(index, queries, k, metric=ring.name),
                          repeats=repeats, warmup=0)
        nn = NearestNeighbors(n_neighbors=k, metric=_SKLEARN.get(ring.name, ring.name),
                              algorithm="brute", n_jobs=-1).fit(index)
        rd, ri = nn.kneighbors(queries)
        t_sk = time_cpu(lambda: nn.kneighbors(queries), repeats=repeats, warmup=0)
        same = i == ri
        # where the ids differ the distances must tie (up to rounding)
        tie_ok = bool(np.allclose(d[~same], rd[~same], rtol=1e-6, atol=1e-9))
        nq = queries.shape[0]
        out.append({"metric": ring.name, "k": k, "n_index": index.shape[0],
                    "index_nnz": int(index.nnz), "n_queries": nq, "device": "cpu",
                    "mgpu_qps": nq / t_mgpu, "sklearn_qps": nq / t_sk,
                    "speedup_vs_sklearn": t_sk / t_mgpu,
                    "max_abs_distance_diff": float(np.abs(d - rd).max(initial=0.0)),
                    "ids_equal": float(same.mean()), "differing_ids_are_ties": tie_ok})
    return out


def markdown(rows: list[dict[str, Any]], label: str) -> str:
    head = ("| corpus | metric | k | index rows | queries | mgpu q/s | scikit-learn q/s | "
            "mgpu / scikit-learn | ids equal | others tie | max abs Δd |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {label} | {r['metric']} | {r['k']} | {r['n_index']:,} | "
                     f"{r['n_queries']:,} | {r['mgpu_qps']:.0f} | {r['sklearn_qps']:.0f} | "
                     f"{r['speedup_vs_sklearn']:.2f}× | {r['ids_equal']:.1%} | "
                     f"{'yes' if r['differing_ids_are_ties'] else 'NO'} | "
                     f"{r['max_abs_distance_diff']:.1e} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------- GPU


def _peer_batches(fn, Q, bs: int) -> None:
    for s in range(0, Q.shape[0], bs):
        fn(Q[s:s + bs])


def _expanded_peers(Xg, metric: str, k: int):
    """The two cuSPARSE routes of the peer timings (cupyx), for cosine and euclidean: the
    sparse product per query batch (SpGEMM, Q·Xᵀ) or the index times a densified query block
    (SpMM), the distance formula, then ``argpartition`` for the k best."""
    import cupy

    sq = cupy.asarray(Xg.multiply(Xg).sum(axis=1)).ravel()
    norms = cupy.sqrt(sq)
    XgT = Xg.T.tocsr()

    def finish(S, Qb):
        qsq = cupy.asarray(Qb.multiply(Qb).sum(axis=1)).ravel()
        if metric == "cosine":
            D = 1 - S / (cupy.sqrt(qsq)[:, None] * norms[None, :] + 1e-30)
        else:
            D = cupy.sqrt(cupy.maximum(qsq[:, None] + sq[None, :] - 2 * S, 0))
        idx = cupy.argpartition(D, k, axis=1)[:, :k]
        return cupy.take_along_axis(D, idx, 1), idx

    def spgemm(Qb):
        return finish((Qb @ XgT).toarray(), Qb)

    def spmm(Qb):
        return finish((Xg @ Qb.toarray().T).T, Qb)

    return {"spgemm": spgemm, "spmm": spmm}


def _peer_error(route, Qg, bs: int, d) -> str | None:
    """Why a peer route's first batch is wrong, or None: its k-th distance per query against
    mgpu's, to 1% (float32 rounding leaves far less there; a lost product, far more). A peer
    that answers wrongly is no timing to compare with."""
    import cupy

    D, _ = route(Qg[:bs])
    got = cupy.sort(D, axis=1)[:, -1].get().astype(np.float64)
    want = np.abs(d[:got.shape[0], -1].get().astype(np.float64))
    err = np.abs(got - want) / np.maximum(want, 1.0)
    worst = float(err.max(initial=0.0))
    return None if worst <= 1e-2 else f"wrong: k-th distance off by {worst:.2g} (relative)"


def _kernel_rates(Xg, Qg, k: int, metric: str, repeats: int) -> dict[str, Any]:
    """q/s of mgpu's fused and postings kernels, each forced, and what the rule ran."""
    import mgpu
    from mgpu.backends import cupy_knn_postings as postings
    from mgpu.backends.timing import time_gpu

    out: dict[str, Any] = {}
    for kernel in postings.KERNELS:
        with postings.forced(kernel):
            mgpu.knn(Xg, Qg, k, metric=metric)
            if postings.last_choice().get("kernel") != kernel:
                out[f"{kernel}_qps"] = postings.last_choice().get("reason")
                continue
            t = time_gpu(lambda: mgpu.knn(Xg, Qg, k, metric=metric), repeats=repeats,
                         warmup=0)
        out[f"{kernel}_qps"] = Qg.shape[0] / t
    return out


def _dense_peers(Xg, metric: str, k: int):
    """The cuBLAS route of dense input (cupy): ``Q @ Xᵀ`` per query batch, the distance
    formula, then ``argpartition`` for the k best."""
    import cupy

    sq = (Xg * Xg).sum(axis=1)
    norms = cupy.sqrt(sq)

    def gemm(Qb):
        S = Qb @ Xg.T
        qsq = (Qb * Qb).sum(axis=1)
        if metric == "cosine":
            D = 1 - S / (cupy.sqrt(qsq)[:, None] * norms[None, :] + 1e-30)
        else:
            D = cupy.sqrt(cupy.maximum(qsq[:, None] + sq[None, :] - 2 * S, 0))
        idx = cupy.argpartition(D, k, axis=1)[:, :k]
        return cupy.take_along_axis(D, idx, 1), idx

    return {"gemm": gemm}


def _naive_peer(Xg, metric: str, k: int):
    """One thread per (query, row) pair over the union of the two rows, then the k best."""
    import cupy

    from mgpu.backends.cupy_knn import FORMS, naive_union

    op = FORMS[metric].op

    def run(Qb):
        D = naive_union(Xg, Qb, op, 2.0)
        idx = cupy.argpartition(D, k, axis=1)[:, :k]
        return cupy.take_along_axis(D, idx, 1), idx

    return run


def bench_gpu(index: Any, queries: Any, k: int, metrics: tuple[str, ...], *,
              sklearn_queries: int = 1000, naive_queries: int = 200, repeats: int = 3
              ) -> list[dict[str, Any]]:
    """Queries/s of mgpu on the GPU (float32) and of its peers, in one run, per metric.

    Peers: the cuSPARSE SpGEMM route (batches of 100 and 500 queries) and SpMM route (500 and
    2,000) for cosine and euclidean on sparse input, each route's first batch checked against
    mgpu's distances (a wrong answer is reported, not timed), the cuBLAS route (``Q @ Xᵀ``,
    500 and 2,000) on dense input; the naive union kernel for the NAMM metrics; scikit-learn
    brute force on all cores (float64, on the first ``sklearn_queries`` queries, a tenth of
    that for NAMM metrics). mgpu's neighbour ids are checked against scikit-learn's.
    ``kernel`` is the kernel mgpu's rule ran (fused, postings or cublas); for the
    dot-product metrics on sparse input ``fused_qps`` and ``postings_qps`` time each kernel
    forced.
    """
    import cupy
    import cupyx.scipy.sparse as csp
    from sklearn.neighbors import NearestNeighbors

    import mgpu
    from mgpu.backends import cupy_knn_postings as postings
    from mgpu.backends.cupy_knn import FORMS, knn_batches
    from mgpu.backends.knn_codes import KnnOp
    from mgpu.backends.timing import time_gpu
    from mgpu.ops.distances import resolve_metric

    dense = isinstance(index, np.ndarray)
    f32 = index.astype(np.float32)
    Xg = cupy.asarray(f32) if dense else csp.csr_matrix(f32)
    Qh = queries.astype(np.float32)
    Qg = cupy.asarray(Qh) if dense else csp.csr_matrix(Qh)
    nq = queries.shape[0]
    out = []
    for metric in metrics:
        ring, _ = resolve_metric(metric, 2, func="bench knn")
        row: dict[str, Any] = {"metric": ring.name, "k": k, "n_index": index.shape[0],
                               "n_features": index.shape[1], "n_queries": nq,
                               "index_nnz": int(np.count_nonzero(index) if dense else index.nnz),
                               "dense": dense, "device": cupy.cuda.runtime.getDeviceProperties(
                                   cupy.cuda.Device().id)["name"].decode()}
        d, i = mgpu.knn(Xg, Qg, k, metric=ring.name)
        t = time_gpu(lambda: mgpu.knn(Xg, Qg, k, metric=ring.name), repeats=repeats, warmup=0)
        row["mgpu_qps"] = nq / t
        row["kernel"] = postings.last_choice().get("kernel")
        if not dense and FORMS[ring.name].op == KnnOp.DOT:
            row.update(_kernel_rates(Xg, Qg, k, ring.name, repeats))
        plan = knn_batches(Xg, Qg, k, ring.name)
        row.update(launches=plan.launches, queries_per_launch=plan.per_launch,
                   plan=plan.describe())
        peers: dict[str, Any] = {}
        if ring.name in ("cosine", "euclidean"):
            routes = (_dense_peers if dense else _expanded_peers)(Xg, ring.name, k)
            sizes = ((("gemm", 500), ("gemm", 2000)) if dense else
                     (("spgemm", 100), ("spgemm", 500), ("spmm", 500), ("spmm", 2000)))
            for name, bs in sizes:
                key = f"{name}_{bs}"
                try:
                    wrong = _peer_error(routes[name], Qg, bs, d)
                    if wrong is not None:
                        peers[key] = wrong
                        continue
                    t = time_gpu(lambda: _peer_batches(routes[name], Qg, bs),
                                 repeats=repeats, warmup=1)
                    peers[key] = nq / t
                except Exception as exc:  # the peer's own failure is a result
                    peers[key] = f"{type(exc).__name__}: {str(exc)[:60]}"
                    cupy.get_default_memory_pool().free_all_blocks()
        if not dense and ring.kind == "namm":
            nn_q = min(nq, naive_queries)
            budget_rows = max(1, (1 << 30) // (4 * index.shape[0]))
            run = _naive_peer(Xg, ring.name, k)
            t = time_gpu(lambda: _peer_batches(run, Qg[:nn_q], budget_rows), repeats=repeats,
                         warmup=1)
            peers["naive_union"] = nn_q / t
        row["peers"] = peers
        numeric = [v for name, v in peers.items() if name != "naive_union"
                   and isinstance(v, float)]
        if numeric:
            row["best_cusparse_qps"] = max(numeric)
            row["speedup_vs_cusparse"] = row["mgpu_qps"] / max(numeric)
        if "naive_union" in peers:
            row["speedup_vs_naive"] = row["mgpu_qps"] / peers["naive_union"]
        sk_q = min(nq, sklearn_queries if ring.kind == "expanded" else
                   max(1, sklearn_queries // 10))
        nn = NearestNeighbors(n_neighbors=k, metric=_SKLEARN.get(ring.name, ring.name),
                              algorithm="brute", n_jobs=-1)
        try:
            nn.fit(index)
        except ValueError:  # scikit-learn has no sparse form of this metric
            out.append(row)
            continue
        rd, ri = nn.kneighbors(queries[:sk_q])
        t_sk = time_cpu(lambda: nn.kneighbors(queries[:sk_q]), repeats=1, warmup=0)
        row["sklearn_qps"] = sk_q / t_sk
        row["sklearn_queries"] = sk_q
        row["speedup_vs_sklearn"] = row["mgpu_qps"] / row["sklearn_qps"]
        dh, ih = d.get()[:sk_q], i.get()[:sk_q]
        same = ih == ri
        row["ids_equal"] = float(same.mean())
        # float32 against scikit-learn's float64: where ids differ the distances must tie
        # to float32 rounding
        row["differing_ids_are_ties"] = bool(np.allclose(dh[~same], rd[~same], rtol=1e-4,
                                                         atol=1e-5))
        row["max_rel_distance_diff"] = float(
            (np.abs(dh - rd) / np.maximum(np.abs(rd), 1e-12)).max(initial=0.0))
        out.append(row)
    return out


def markdown_gpu(rows: list[dict[str, Any]], label: str) -> str:
    head = ("| corpus | metric | mgpu q/s | kernel | fused q/s | postings q/s | SpGEMM 100 | "
            "SpGEMM 500 | SpMM 500 | SpMM 2000 | GEMM 500 | GEMM 2000 | naive union | "
            "scikit-learn | vs best cuSPARSE/cuBLAS | vs naive | vs scikit-learn | ids equal | "
            "others tie |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]

    def fmt(v):
        if v is None:
            return "–"
        if isinstance(v, float):
            return f"{v:,.0f}"
        return "wrong" if str(v).startswith("wrong") else "fails"

    for r in rows:
        p = r["peers"]
        ratio = lambda key: f"{r[key]:.1f}×" if key in r else "–"  # noqa: E731
        lines.append(
            f"| {label} | {r['metric']} | {r['mgpu_qps']:,.0f} | {r.get('kernel') or '–'} | "
            f"{fmt(r.get('fused_qps'))} | {fmt(r.get('postings_qps'))} | "
            f"{fmt(p.get('spgemm_100'))} | "
            f"{fmt(p.get('spgemm_500'))} | {fmt(p.get('spmm_500'))} | "
            f"{fmt(p.get('spmm_2000'))} | {fmt(p.get('gemm_500'))} | "
            f"{fmt(p.get('gemm_2000'))} | {fmt(p.get('naive_union'))} | "
            f"{fmt(r.get('sklearn_qps'))} | {ratio('speedup_vs_cusparse')} | "
            f"{ratio('speedup_vs_naive')} | {ratio('speedup_vs_sklearn')} | "
            + (f"{r['ids_equal']:.1%} | {'yes' if r['differing_ids_are_ties'] else 'NO'} |"
               if "ids_equal" in r else "– | – |"))
    return "\n".join(lines)


# --------------------------------------------------------------------- several workers


def bench_scaling(index: sp.csr_matrix, queries: sp.csr_matrix, k: int, metric: str,
                  workers: tuple[int, ...], *, tiles_per_worker: int = 1, repeats: int = 3,
                  gpus: bool | None = None, progress: Any = None) -> list[dict[str, Any]]:
    """The distributed kNN on 1, 2, 4, … workers, the index resident on them, in one run.

    For each worker count an embedded cluster is started (GPU workers when ``gpus`` or when
    GPUs are visible) and the index is cut by nnz into ``tiles_per_worker`` row tiles per
    worker (:func:`mgpu.from_scipy`). A timed call is the public ``mgpu.knn`` on the
    dask index with host queries: tiles checked and prepared on their workers, query batches
    broadcast, local top-k, merge tree, results gathered on the client. The first call, on
    a few queries, compiles and is not timed. Every worker count must return the same ids as
    the first (ties go to the lower id everywhere); the one-device call (no cluster) on the
    same data is the first row.
    """
    import time

    import mgpu
    from mgpu.backends import is_gpu_array
    from mgpu.distributed import chunk_nnz, connect, from_scipy, visible_gpus

    use_gpus = visible_gpus() > 0 if gpus is None else gpus
    X = index.astype(np.float32) if use_gpus else index
    Q = queries.astype(X.dtype)
    nq = Q.shape[0]
    out: list[dict[str, Any]] = []

    def timed(fn) -> tuple[float, Any]:
        times, res = [], None
        for _ in range(repeats):
            t0 = time.perf_counter()
            res = fn()
            times.append(time.perf_counter() - t0)
        return float(np.median(times)), res

    def row(workers: Any, kind: str, t: float, ids: np.ndarray, imbalance: float) -> dict:
        r = {"workers": workers, "kind": kind, "metric": metric, "k": k, "n_index": X.shape[0],
             "index_nnz": int(X.nnz), "n_queries": nq, "median_s": t, "qps": nq / t,
             "imbalance": imbalance}
        if out:
            r["speedup"] = out[1]["median_s"] / t if len(out) > 1 else 1.0
            r["ids_equal_first"] = bool(np.array_equal(ids, out[0]["_ids"]))
        r["_ids"] = ids
        return r

    if use_gpus:
        import cupy
        import cupyx.scipy.sparse as csp

        Xg, Qg = csp.csr_matrix(X), csp.csr_matrix(Q)
        mgpu.knn(Xg, Qg[: min(nq, 256)], k, metric=metric)
        t, (_, ids) = timed(lambda: _synced(mgpu.knn(Xg, Qg, k, metric=metric)))
        del Xg, Qg
        cupy.get_default_memory_pool().free_all_blocks()
    else:
        mgpu.knn(X, Q[: min(nq, 256)], k, metric=metric)
        t, (_, ids) = timed(lambda: mgpu.knn(X, Q, k, metric=metric))
    out.append(row("one device, no cluster", "GPU" if use_gpus else "CPU", t, to_host(ids), 1.0))
    if progress is not None:
        progress(f"one device: {nq / t:,.0f} queries/s")
    for n in workers:
        with connect(n_workers=n, gpus=gpus) as client:
            Xd = from_scipy(X, n * tiles_per_worker, axis=0, client=client)
            kind = "GPU" if is_gpu_array(Xd._meta) else "CPU"  # the report's words only
            mgpu.knn(Xd, Q[: min(nq, 256)], k, metric=metric)
            t, (_, ids) = timed(lambda: mgpu.knn(Xd, Q, k, metric=metric))
            nnz = chunk_nnz(Xd).ravel()
            r = row(n, kind, t, ids, float(nnz.max() / nnz.mean()) if nnz.size else 1.0)
            r["tiles"] = int(nnz.size)
            out.append(r)
            if progress is not None:
                progress(f"{n} {kind} worker(s): {r['qps']:,.0f} queries/s, speedup "
                         f"{r['speedup']:.2f}×, nnz imbalance {r['imbalance']:.4f}, ids "
                         f"{'identical' if r['ids_equal_first'] else 'DIFFER'}")
    for r in out:
        r.pop("_ids")
    return out


def _synced(res: Any) -> Any:
    import cupy

    cupy.cuda.get_current_stream().synchronize()
    return res


def scaling_markdown(rows: list[dict[str, Any]], label: str) -> str:
    """The scaling table: queries/s and speedup against one worker, nnz imbalance, ids."""
    head = ("| corpus | metric | k | workers | tiles | nnz imbalance | queries | median s | "
            "queries/s | speedup vs 1 worker | ids equal to one device |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        same = r.get("ids_equal_first")
        lines.append(
            f"| {label} | {r['metric']} | {r['k']} | {r['workers']} {r['kind']} | "
            f"{r.get('tiles', '–')} | {r['imbalance']:.4f} | {r['n_queries']:,} | "
            f"{r['median_s']:.3f} | {r['qps']:,.0f} | "
            + (f"{r['speedup']:.2f}× | " if "speedup" in r else "– | ")
            + ("– |" if same is None else ("yes |" if same else "NO |")))
    return "\n".join(lines)
