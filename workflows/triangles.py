"""Triangles through every vertex of a graph (mgpu.triangles), and what they say about it.

Shows: a real SNAP edge list read as an undirected graph, the triangles through every vertex
counted by one masked SpGEMM (``(A @ A) ∘ A``, row sums halved) on one device, and what the
counts give: the graph's total, its global clustering coefficient (3 × triangles /
connected triples), the average of the vertices' own clustering coefficients (triangles /
pairs of neighbours), and the vertices with most triangles, by original id.

Run (the SNAP ego-Facebook graph, on the CPU):

    python workflows/triangles.py ../shared/data/graphs/facebook_combined.txt.gz --top 10

``--gpu`` counts on the GPU (the graph copied there as a cupyx matrix); ``--out`` writes the
count of every vertex as CSV (``node_id,triangles``), ``--json`` the summary.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import mgpu
from mgpu import io
from mgpu.models.triangles import summary, top_vertices


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("graph", help="SNAP edge list (plain or gzip), read as undirected")
    ap.add_argument("--top", type=int, default=10, help="vertices with most triangles listed")
    ap.add_argument("--gpu", action="store_true", help="count on the GPU (needs mgpu[gpu])")
    ap.add_argument("--out", help="write every vertex's count to this CSV file")
    ap.add_argument("--json", help="write the summary and the top vertices as JSON")
    args = ap.parse_args()

    # symmetric=True stores both directions of every line, self_loops=False drops 'u u'
    # lines: the simple undirected graph, whose degrees are its rows' lengths
    G, ids = io.load_snap(args.graph, symmetric=True, self_loops=False, relabel=True,
                          return_ids=True, dtype=np.float64)
    print(f"{Path(args.graph).name}: {G.shape[0]:,} vertices, {G.nnz // 2:,} edges")
    t0 = time.perf_counter()
    if args.gpu:
        import cupyx.scipy.sparse as csp

        t = mgpu.triangles(csp.csr_matrix(G)).get()  # cupyx in, cupy out
    else:
        t = mgpu.triangles(G)  # scipy in, numpy out
    elapsed = time.perf_counter() - t0
    degrees = np.diff(G.indptr)
    s = summary(t, degrees)
    # a vertex's own clustering coefficient: the share of its pairs of neighbours that are
    # linked (0 below degree 2, as networkx's average_clustering counts it)
    pairs = degrees * (degrees - 1) / 2
    local = np.divide(t, pairs, out=np.zeros(t.size), where=pairs > 0)
    s["average_clustering"] = float(local.mean()) if t.size else 0.0
    print(f"{s['triangles']:,} triangles in {elapsed:.2f} s "
          f"({'GPU' if args.gpu else 'CPU'}, one masked SpGEMM)")
    print(f"global clustering coefficient {s['transitivity']:.4f} "
          f"({s['triples']:,} connected triples); average clustering "
          f"{s['average_clustering']:.4f}")
    top = [(int(ids[v]), c) for v, c in top_vertices(t, args.top)]
    for v, c in top:
        print(f"  vertex {v}: {c:,} triangles")
    if args.out:
        with open(args.out, "w") as f:
            f.write("node_id,triangles\n")
            f.writelines(f"{v},{c}\n" for v, c in zip(ids.tolist(), t.tolist()))
        print(f"counts written to {args.out}")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": s, "top_vertices": top}, indent=1))


if __name__ == "__main__":
    main()
