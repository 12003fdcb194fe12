"""Jaccard weights of a graph's edges (mgpu.jaccard), their distribution and the strongest.

Shows: a real SNAP edge list read as an undirected graph, the weights
``|N(i) ∩ N(j)| / |N(i) ∪ N(j)|`` of every edge computed on a cluster in row blocks of equal
nonzeros (on the GPUs when the workers have them), and what they say: the histogram over
[0, 1] and the most similar neighbours, by original node id.

Run (the SNAP ego-Facebook graph, two CPU workers):

    python workflows/jaccard_weights.py ../shared/data/graphs/facebook_combined.txt.gz \
        --workers 2 --cpu --top 10 --out facebook-jaccard.npz

``--workers 0`` runs in this process; ``--out`` writes the weights (scipy.sparse.save_npz,
rows and columns in the order of the sorted original ids), ``--json`` the summary.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import scipy.sparse as sp

import mgpu
from mgpu import io
from mgpu.models.jaccard import histogram, top_edges


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("graph", help="SNAP edge list (plain or gzip), read as undirected")
    ap.add_argument("--top", type=int, default=10, help="strongest edges listed")
    ap.add_argument("--parts", type=int, default=None,
                    help="row blocks on the cluster (default: four per worker)")
    ap.add_argument("--workers", type=int, default=None,
                    help="embedded cluster size (default: mgpu.connect's); 0: this process")
    ap.add_argument("--cpu", action="store_true", help="CPU workers only")
    ap.add_argument("--out", help="write the weights to this .npz file")
    ap.add_argument("--json", help="write the histogram and the strongest edges as JSON")
    args = ap.parse_args()

    G, ids = io.load_snap(args.graph, relabel=True, return_ids=True, dtype=np.float64)
    print(f"{Path(args.graph).name}: {G.shape[0]:,} nodes, {G.nnz:,} stored edges")
    if args.workers == 0:
        J = mgpu.jaccard(G, symmetrize=True)
    else:
        with mgpu.connect(gpus=False if args.cpu else None, n_workers=args.workers) as client:
            parts = args.parts or 4 * len(mgpu.distributed.workers_now(client))
            J = mgpu.jaccard(G, symmetrize=True, parts=parts, client=client)
    h = histogram(J)
    print(f"{h['edges']:,} undirected edges: mean weight {h['mean']:.4f}, median "
          f"{h['median']:.4f}; weight 0: {h['zero']:.1%}, weight 1: {h['one']:.1%}")
    strongest = [(int(ids[u]), int(ids[v]), w) for u, v, w in top_edges(J, args.top)]
    for u, v, w in strongest:
        print(f"  {u} -- {v}: {w:.4f}")
    if args.out:
        sp.save_npz(args.out, J)
        print(f"weights written to {args.out}")
    if args.json:
        Path(args.json).write_text(json.dumps({"histogram": h, "top_edges": strongest},
                                              indent=1))


if __name__ == "__main__":  # cluster workers start with spawn: nothing runs on import
    main()
