"""``mgpu bench knn``: exact kNN queries per second of mgpu against scikit-learn, one run.

scikit-learn's brute force runs on all the machine's cores (``n_jobs=-1``). Both answer the
same queries; the distances are compared and the neighbour ids must agree up to exact ties.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

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
            "mgpu / scikit-learn | ids equal | others tie | max |Δd| |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {label} | {r['metric']} | {r['k']} | {r['n_index']:,} | "
                     f"{r['n_queries']:,} | {r['mgpu_qps']:.0f} | {r['sklearn_qps']:.0f} | "
                     f"{r['speedup_vs_sklearn']:.2f}× | {r['ids_equal']:.1%} | "
                     f"{'yes' if r['differing_ids_are_ties'] else 'NO'} | "
                     f"{r['max_abs_distance_diff']:.1e} |")
    return "\n".join(lines)
