"""``mgpu bench knn``: exact kNN queries per second of mgpu against scikit-learn, one run.

scikit-learn's brute force runs on all the machine's cores (``n_jobs=-1``). Both answer the
same queries; the distances are compared and the neighbour ids must agree up to exact ties.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu.backends import array_module, to_host
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


def expanded_select(S: Any, qsq: Any, sq: Any, norms: Any, metric: str, k: int
                    ) -> tuple[Any, Any]:
    """The peers' last step: from the dot products S (queries × index rows), the queries'
    and the rows' squared norms (and the rows' norms), the cosine or euclidean distances
    and each query's k nearest, unordered, as (distances, ids) on S's device."""
    xp = array_module(S)
    if metric == "cosine":
        D = 1 - S / (xp.sqrt(qsq)[:, None] * norms[None, :] + 1e-30)
    else:
        D = xp.sqrt(xp.maximum(qsq[:, None] + sq[None, :] - 2 * S, 0))
    idx = xp.argpartition(D, k, axis=1)[:, :k]
    return xp.take_along_axis(D, idx, 1), idx


def _expanded_peers(Xg, metric: str, k: int):
    """The routes through a sparse product, for cosine and euclidean: the two of cuSPARSE
    (cupyx), the sparse product per query batch (SpGEMM, Q·Xᵀ) or the index times a
    densified query block (SpMM), and mgpu's SpGEMM route (``mgpu.spgemm``, the public call,
    in SpGEMM's place); each then the distance formula and ``argpartition`` for the k best."""
    import cupy

    import mgpu

    sq = cupy.asarray(Xg.multiply(Xg).sum(axis=1)).ravel()
    norms = cupy.sqrt(sq)
    XgT = Xg.T.tocsr()

    def finish(S, Qb):
        qsq = cupy.asarray(Qb.multiply(Qb).sum(axis=1)).ravel()
        return expanded_select(S, qsq, sq, norms, metric, k)

    def spgemm(Qb):
        return finish((Qb @ XgT).toarray(), Qb)

    def spmm(Qb):
        return finish((Xg @ Qb.toarray().T).T, Qb)

    def mgpu_spgemm(Qb):
        return finish(mgpu.spgemm(Qb, XgT).toarray(), Qb)

    return {"spgemm": spgemm, "spmm": spmm, "mgpu_spgemm": mgpu_spgemm}


# SpGEMM batches tried, smaller, where neither 100 nor 500 queries a batch answers rightly
# (cuSPARSE runs out of resources, or loses products, on a wide corpus's larger batches);
# they are timed on queries spread over the set, at most this many
SPGEMM_SMALLER = (20, 5)
_SMALL_BATCH_QUERIES = 400
_CHECKED_QUERIES = 100  # a peer's answer is checked on its first batches up to this many
# mgpu.spgemm uses its scratch space in batches that fit the device (it never fails for
# lack of it), so its route needs no smaller batches; 2,000 shows what a larger one gains
MGPU_SPGEMM_BATCHES = (100, 500, 2000)
# routes timed beside the peers that are mgpu's own: never one of the cuSPARSE/cuBLAS
# routes that mgpu's kNN is compared with (their keys in ``peers`` start with these)
MGPU_ROUTES = ("mgpu_spgemm",)


def _peer_error(route, Qg, bs: int, refs: dict[str, np.ndarray]) -> str | None:
    """Why a peer route is wrong, or None: its k-th distance on the first batches (at least
    ``_CHECKED_QUERIES`` queries) against each reference's (``refs``: mgpu's float32
    answer, scikit-learn's float64 one of the first queries), to 1% (float32 rounding leaves
    far less there; a lost product, far more). A peer that answers wrongly is no timing to
    compare with."""
    import cupy

    n = min(Qg.shape[0], max(bs, _CHECKED_QUERIES))
    got = np.concatenate([cupy.sort(route(Qg[s:min(n, s + bs)])[0], axis=1)[:, -1].get()
                          for s in range(0, n, bs)]).astype(np.float64)
    for name, want in refs.items():
        m = min(got.shape[0], want.shape[0])
        err = np.abs(got[:m] - want[:m]) / np.maximum(want[:m], 1.0)
        worst = float(err.max(initial=0.0))
        if worst > 1e-2:
            return f"wrong: k-th distance off {name}'s by {worst:.2g} (relative)"
    return None


def _peer_rate(route, Qg, bs: int, refs: dict[str, np.ndarray], repeats: int,
               timed_on: Any = None) -> float | str:
    """Queries/s of a peer route in batches of ``bs`` (on ``timed_on`` where given), or
    why it has none: "wrong: ..." or its own failure."""
    import cupy

    from mgpu.backends.timing import time_gpu

    try:
        wrong = _peer_error(route, Qg, bs, refs)
        if wrong is not None:
            return wrong
        Q = Qg if timed_on is None else timed_on
        t = time_gpu(lambda: _peer_batches(route, Q, bs), repeats=repeats, warmup=1)
        return Q.shape[0] / t
    except Exception as exc:  # the peer's own failure is a result
        cupy.get_default_memory_pool().free_all_blocks()
        return f"{type(exc).__name__}: {str(exc)[:60]}"


def _peer_rates(routes, Qg, sizes, refs: dict[str, np.ndarray], repeats: int
                ) -> dict[str, Any]:
    """Each route at each batch size, then SpGEMM's smaller batches (:func:`spgemm_smaller`),
    timed on queries spread over the set, and ``mgpu_spgemm_best``: mgpu's SpGEMM route's
    fastest right batch (:func:`best_batch`), if any."""
    import cupy

    peers: dict[str, Any] = {}
    for name, bs in sizes:
        peers[f"{name}_{bs}"] = _peer_rate(routes[name], Qg, bs, refs, repeats)
    if "spgemm" in routes:
        nq = Qg.shape[0]
        m = min(nq, _SMALL_BATCH_QUERIES)

        def rate(bs: int) -> float | str:
            spread = Qg[cupy.arange(m) * (nq // m)]
            return _peer_rate(routes["spgemm"], Qg, bs, refs, repeats, spread)

        peers.update(spgemm_smaller(peers, rate, m))
    if "mgpu_spgemm" in routes:
        best = best_batch(peers, "mgpu_spgemm")
        if best is not None:
            peers["mgpu_spgemm_best"] = best
    return peers


def best_batch(rates: dict[str, Any], route: str) -> dict[str, Any] | None:
    """The fastest right batch of ``route`` among ``rates`` ({"batch", "qps"}), or None:
    the float values of the keys ``{route}_{batch}`` alone, so that ``spgemm`` does not
    take ``mgpu_spgemm_100``, nor its own ``spgemm_best`` or ``spgemm_5_queries``."""
    pattern = re.compile(re.escape(route) + r"_(\d+)")
    right = {int(m.group(1)): v for key, v in rates.items()
             if (m := pattern.fullmatch(key)) is not None and isinstance(v, float)}
    if not right:
        return None
    bs = max(right, key=right.get)
    return {"batch": bs, "qps": right[bs]}


def best_cusparse(peers: dict[str, Any]) -> float | None:
    """The fastest right cuSPARSE or cuBLAS route of ``peers`` (q/s), or None: neither the
    naive union kernel nor mgpu's own routes (:data:`MGPU_ROUTES`) count."""
    rates = [v for key, v in peers.items() if key != "naive_union"
             and not key.startswith(tuple(f"{r}_" for r in MGPU_ROUTES))
             and isinstance(v, float)]
    return max(rates) if rates else None


def spgemm_smaller(peers: dict[str, Any], rate: Any, m: int) -> dict[str, Any]:
    """Where neither SpGEMM batch of ``peers`` (100, 500) answers rightly, ``rate(bs)`` of
    each batch of :data:`SPGEMM_SMALLER` in turn until one does (timed on ``m`` queries);
    and ``spgemm_best``: the fastest right SpGEMM batch ({"batch", "qps"}), if any."""
    out: dict[str, Any] = {}
    if not any(isinstance(peers.get(f"spgemm_{b}"), float) for b in (100, 500)):
        for bs in SPGEMM_SMALLER:
            out[f"spgemm_{bs}"] = rate(bs)
            if isinstance(out[f"spgemm_{bs}"], float):
                out[f"spgemm_{bs}_queries"] = m
                break
    best = best_batch({**peers, **out}, "spgemm")
    if best is not None:
        out["spgemm_best"] = best
    return out


def _kernel_rates(Xg, Qg, k: int, metric: str, repeats: int) -> dict[str, Any]:
    """q/s of mgpu's fused and postings kernels, each forced (the postings at each tile
    size the tuner weighs, the best as ``postings_qps``)."""
    import mgpu
    from mgpu.backends import cupy_knn_postings as postings
    from mgpu.backends.timing import time_gpu

    out: dict[str, Any] = {}
    by_tile: dict[int, Any] = {}
    for kernel, blocks in [("fused", 1)] + [("postings", b) for b in postings.TILE_BLOCKS]:
        with postings.forced(kernel, blocks):
            mgpu.knn(Xg, Qg, k, metric=metric)
            choice = postings.last_choice()
            if choice.get("kernel") != kernel:
                rate: Any = choice.get("reason")
            else:
                rate = Qg.shape[0] / time_gpu(lambda: mgpu.knn(Xg, Qg, k, metric=metric),
                                              repeats=repeats, warmup=0)
        if kernel == "fused":
            out["fused_qps"] = rate
        else:
            by_tile[choice.get("tile_rows", postings.tile_rows(blocks))] = rate
    rates = [v for v in by_tile.values() if isinstance(v, float)]
    out["postings_qps"] = max(rates) if rates else next(iter(by_tile.values()))
    out["postings_qps_by_tile"] = by_tile
    return out


def _dense_peers(Xg, metric: str, k: int):
    """The cuBLAS route of dense input (cupy): ``Q @ Xᵀ`` per query batch, the distance
    formula, then ``argpartition`` for the k best."""
    import cupy

    sq = (Xg * Xg).sum(axis=1)
    norms = cupy.sqrt(sq)

    def gemm(Qb):
        return expanded_select(Qb @ Xg.T, (Qb * Qb).sum(axis=1), sq, norms, metric, k)

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

    Peers: the cuSPARSE SpGEMM route (batches of 100 and 500 queries, and of
    :data:`SPGEMM_SMALLER` where neither answers rightly; ``spgemm_best`` is its fastest
    right batch) and SpMM route (500 and 2,000) for cosine and euclidean on sparse input, the
    cuBLAS route (``Q @ Xᵀ``, 500 and 2,000) on dense input, each route's first batches
    checked against mgpu's distances and scikit-learn's float64 ones (a wrong answer is
    reported, not timed); the naive union kernel for the NAMM metrics; scikit-learn brute
    force on all cores (float64, on the first ``sklearn_queries`` queries, a tenth of that
    for NAMM metrics). Beside them in ``peers``, checked the same way but no peer (not in
    ``best_cusparse_qps``): mgpu's SpGEMM route, ``mgpu.spgemm`` in cuSPARSE's place
    (sparse input, cosine and euclidean; batches of :data:`MGPU_SPGEMM_BATCHES` as
    ``mgpu_spgemm_100`` …, its fastest right batch ``mgpu_spgemm_best``). mgpu's neighbour
    ids are checked against scikit-learn's. ``kernel`` is the kernel mgpu's rule ran
    (fused, postings or cublas) and ``rule`` what it said on the first call (its
    measurement); for the dot-product metrics on sparse input ``fused_qps`` and
    ``postings_qps`` time each kernel forced (the postings at each tile size of the tuner,
    ``postings_qps_by_tile``; ``postings_qps`` the best).
    """
    import cupy
    import cupyx.scipy.sparse as csp

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
        row["rule"] = postings.last_choice()
        t = time_gpu(lambda: mgpu.knn(Xg, Qg, k, metric=ring.name), repeats=repeats, warmup=0)
        row["mgpu_qps"] = nq / t
        row["kernel"] = postings.last_choice().get("kernel")
        if not dense and FORMS[ring.name].op == KnnOp.DOT:
            row.update(_kernel_rates(Xg, Qg, k, ring.name, repeats))
        plan = knn_batches(Xg, Qg, k, ring.name)
        row.update(launches=plan.launches, queries_per_launch=plan.per_launch,
                   plan=plan.describe())
        sk_q = min(nq, sklearn_queries if ring.kind == "expanded" else
                   max(1, sklearn_queries // 10))
        sk = _sklearn(index, queries[:sk_q], k, ring.name)
        peers: dict[str, Any] = {}
        if ring.name in ("cosine", "euclidean"):
            routes = (_dense_peers if dense else _expanded_peers)(Xg, ring.name, k)
            sizes = ((("gemm", 500), ("gemm", 2000)) if dense else
                     (("spgemm", 100), ("spgemm", 500), ("spmm", 500), ("spmm", 2000))
                     + tuple(("mgpu_spgemm", bs) for bs in MGPU_SPGEMM_BATCHES))
            refs = {"mgpu": np.abs(d[:, -1].get().astype(np.float64))}
            if sk is not None:
                refs["scikit-learn"] = sk[0][:, -1]
            peers = _peer_rates(routes, Qg, sizes, refs, repeats)
        if not dense and ring.kind == "namm":
            nn_q = min(nq, naive_queries)
            budget_rows = max(1, (1 << 30) // (4 * index.shape[0]))
            run = _naive_peer(Xg, ring.name, k)
            t = time_gpu(lambda: _peer_batches(run, Qg[:nn_q], budget_rows), repeats=repeats,
                         warmup=1)
            peers["naive_union"] = nn_q / t
        row["peers"] = peers
        best = best_cusparse(peers)
        if best is not None:
            row["best_cusparse_qps"] = best
            row["speedup_vs_cusparse"] = row["mgpu_qps"] / best
        if "naive_union" in peers:
            row["speedup_vs_naive"] = row["mgpu_qps"] / peers["naive_union"]
        if sk is None:  # scikit-learn has no sparse form of this metric
            out.append(row)
            continue
        rd, ri, t_sk = sk
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


def _sklearn(index: Any, queries: Any, k: int, metric: str
             ) -> tuple[np.ndarray, np.ndarray, float] | None:
    """scikit-learn's brute-force answer (float64 distances, ids) and its time, or None
    where it has no sparse form of the metric."""
    from sklearn.neighbors import NearestNeighbors

    nn = NearestNeighbors(n_neighbors=k, metric=_SKLEARN.get(metric, metric),
                          algorithm="brute", n_jobs=-1)
    try:
        nn.fit(index)
    except ValueError:
        return None
    rd, ri = nn.kneighbors(queries)
    t = time_cpu(lambda: nn.kneighbors(queries), repeats=1, warmup=0)
    return rd, ri, t


def markdown_gpu(rows: list[dict[str, Any]], label: str) -> str:
    """The GPU table: mgpu's kNN and its kernels; mgpu's SpGEMM route in columns of its own
    beside them (mgpu's, so no peer: "vs best cuSPARSE/cuBLAS" does not count it); then the
    peers, and mgpu's kNN against each kind of peer."""
    batches = " / ".join(str(b) for b in MGPU_SPGEMM_BATCHES)
    head = ("| corpus | metric | mgpu q/s | kernel | fused q/s | postings q/s | "
            f"mgpu SpGEMM route {batches} | mgpu SpGEMM route best right (batch) | "
            "SpGEMM 100 | SpGEMM 500 | SpGEMM best right (batch) | SpMM 500 | SpMM 2000 | "
            "GEMM 500 | GEMM 2000 | naive union | "
            "scikit-learn | vs best cuSPARSE/cuBLAS | vs naive | vs scikit-learn | ids equal | "
            "others tie |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]

    def fmt(v):
        if v is None:
            return "–"
        if isinstance(v, float):
            return f"{v:,.0f}"
        return "wrong" if str(v).startswith("wrong") else "fails"

    def best(v):
        return "–" if v is None else f"{v['qps']:,.0f} ({v['batch']})"

    def mgpu_spgemm(p):
        cells = [p.get(f"mgpu_spgemm_{b}") for b in MGPU_SPGEMM_BATCHES]
        return "–" if all(v is None for v in cells) else " / ".join(fmt(v) for v in cells)

    for r in rows:
        p = r["peers"]
        ratio = lambda key: f"{r[key]:.1f}×" if key in r else "–"  # noqa: E731
        lines.append(
            f"| {label} | {r['metric']} | {r['mgpu_qps']:,.0f} | {r.get('kernel') or '–'} | "
            f"{fmt(r.get('fused_qps'))} | {fmt(r.get('postings_qps'))} | "
            f"{mgpu_spgemm(p)} | {best(p.get('mgpu_spgemm_best'))} | "
            f"{fmt(p.get('spgemm_100'))} | "
            f"{fmt(p.get('spgemm_500'))} | {best(p.get('spgemm_best'))} | "
            f"{fmt(p.get('spmm_500'))} | "
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
