"""``mgpu bench jaccard``: Jaccard edge weights by mgpu's kernel against the same weights from
a sparse-sparse product (A·A restricted to A's pattern), on one device, in one run."""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu.backends.timing import time_cpu


def spgemm_jaccard(A: Any) -> Any:
    """Jaccard weights through SpGEMM: the common-neighbour counts are the entries of A·A at
    A's pattern (A a checked 0/1 graph, scipy or cupyx); ``|N(i)| + |N(j)| - c`` divides."""
    xp = np
    if type(A).__module__.startswith("cupyx"):
        import cupy as xp
    C = A.multiply(A @ A).tocsr()  # keeps A's pattern (entries of A·A outside it drop)
    C.sort_indices()
    deg = xp.diff(A.indptr).astype(xp.float64)
    rows = xp.searchsorted(A.indptr, xp.arange(A.nnz), side="right") - 1
    # C may have dropped edges with no common neighbour: read the counts at A's entries
    both = xp.zeros(A.nnz, dtype=xp.float64)
    crow = xp.searchsorted(C.indptr, xp.arange(C.nnz), side="right") - 1
    key_a = rows.astype(xp.int64) * A.shape[1] + A.indices
    key_c = crow.astype(xp.int64) * A.shape[1] + C.indices
    at = xp.searchsorted(key_a, key_c)
    both[at] = C.data
    return both / (deg[rows] + deg[A.indices] - both)


def bench_graph(G: sp.csr_matrix, device: str, repeats: int = 5) -> dict[str, Any]:
    """Edges per second of mgpu.jaccard and of the SpGEMM route on ``device``, checked equal."""
    import mgpu
    from mgpu.ops.jaccard import check_graph

    A = check_graph(G, "bench jaccard", symmetrize=True)
    row: dict[str, Any] = {"nodes": A.shape[0], "edge_entries": int(A.nnz), "device": device,
                           "max_degree": int(np.diff(A.indptr).max(initial=0))}
    if device == "gpu":
        import cupy
        import cupyx.scipy.sparse as csp

        from mgpu.backends.timing import time_gpu

        Ad = csp.csr_matrix(A.astype(np.float32))
        J = mgpu.jaccard(Ad)
        ref = spgemm_jaccard(Ad)
        t_mgpu = time_gpu(lambda: mgpu.jaccard(Ad), repeats=repeats, warmup=1)
        try:
            t_peer = time_gpu(lambda: spgemm_jaccard(Ad), repeats=repeats, warmup=1)
        except Exception as exc:  # cuSPARSE running out of memory is a result
            t_peer = None
            row["peer_error"] = f"{type(exc).__name__}: {str(exc)[:60]}"
            cupy.get_default_memory_pool().free_all_blocks()
        row["gpu"] = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
        row["max_abs_diff"] = float(abs(J.data.astype(cupy.float64) - ref).max().get())
    else:
        J = mgpu.jaccard(A)
        ref = spgemm_jaccard(A)
        t_mgpu = time_cpu(lambda: mgpu.jaccard(A), repeats=repeats, warmup=0)
        t_peer = time_cpu(lambda: spgemm_jaccard(A), repeats=repeats, warmup=0)
        row["max_abs_diff"] = float(np.abs(J.data - ref).max(initial=0.0))
    row["mgpu_s"] = t_mgpu
    row["mgpu_edges_per_s"] = A.nnz / t_mgpu
    if t_peer is not None:
        row["spgemm_s"] = t_peer
        row["spgemm_edges_per_s"] = A.nnz / t_peer
        row["speedup"] = t_peer / t_mgpu
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| graph | device | nodes | edge entries | max degree | mgpu edges/s | SpGEMM "
            "edges/s | mgpu / SpGEMM | max abs diff |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        peer = f"{r['spgemm_edges_per_s']:.3g}" if "spgemm_edges_per_s" in r else "fails"
        ratio = f"{r['speedup']:.2f}×" if "speedup" in r else "–"
        lines.append(f"| {r['graph']} | {r.get('gpu', r['device'])} | {r['nodes']:,} | "
                     f"{r['edge_entries']:,} | {r['max_degree']:,} | "
                     f"{r['mgpu_edges_per_s']:.3g} | {peer} | {ratio} | "
                     f"{r['max_abs_diff']:.1e} |")
    return "\n".join(lines)
