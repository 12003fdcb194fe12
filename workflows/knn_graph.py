"""The k-nearest-neighbour graph of a corpus's rows (mgpu.knn on a cluster).

Shows: a sparse matrix cut into row tiles of equal nonzeros that stay on the workers
(mgpu.from_scipy), every row queried against them in batches (each worker's top-k merged
in a tree, never the full distance matrix), and the result as a sparse graph: row i holds
its k nearest other rows with their distances.

Run (the first 1,000 documents of the AP corpus, cosine distance, two CPU workers):

    python workflows/knn_graph.py ../shared/data/bow/ap.dat.gz --rows 1000 -k 10 \
        --metric cosine --workers 2 --cpu --out ap-knn.npz

``--workers 0`` runs in this process; ``--out`` writes the graph with scipy.sparse.save_npz.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import scipy.sparse as sp

import mgpu
from mgpu import io
from mgpu.ops.distances import drop_self


def knn_graph(distances: np.ndarray, indices: np.ndarray, k: int) -> sp.csr_matrix:
    """Row i's k nearest rows other than itself, from its k + 1 nearest (the queries are the
    index rows themselves; a row missing from its own list, an exact duplicate tied ahead of
    it, loses its farthest instead; scikit-learn drops its nearest: see drop_self)."""
    vals, cols = drop_self(distances, indices, k)
    n = indices.shape[0]
    return sp.csr_matrix((vals.ravel(), cols.ravel(), np.arange(0, n * k + 1, k)),
                         shape=(n, n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", help="any matrix mgpu.io.load reads (bag-of-words, .mtx, ...)")
    ap.add_argument("-k", type=int, default=10, help="neighbours per row")
    ap.add_argument("--metric", default="cosine", help="a metric of mgpu.pairwise_distances")
    ap.add_argument("--rows", type=int, default=None, help="use the first ROWS rows only")
    ap.add_argument("--workers", type=int, default=None,
                    help="embedded cluster size (default: mgpu.connect's); 0: this process")
    ap.add_argument("--cpu", action="store_true", help="CPU workers only")
    ap.add_argument("--out", help="write the graph to this .npz file")
    args = ap.parse_args()

    S = sp.csr_matrix(io.load(args.corpus), dtype=np.float64)
    if args.rows is not None:
        S = S[: args.rows]
    print(f"{Path(args.corpus).name}: {S.shape[0]:,} rows x {S.shape[1]:,} columns, "
          f"{S.nnz:,} nonzeros; k={args.k}, {args.metric} distance")
    if args.workers == 0:
        dist, idx = mgpu.knn(S, S, args.k + 1, metric=args.metric)
    else:
        with mgpu.connect(gpus=False if args.cpu else None, n_workers=args.workers) as client:
            index = mgpu.from_scipy(S, client=client)  # row tiles, kept on the workers
            dist, idx = mgpu.knn(index, S, args.k + 1, metric=args.metric)
    G = knn_graph(dist, idx, args.k)
    nearest = G.data.reshape(-1, args.k)[:, 0]
    indegree = np.bincount(G.indices, minlength=G.shape[0])
    hubs = np.argsort(-indegree, kind="stable")[:5]
    print(f"distance to the nearest other row: mean {nearest.mean():.4f}, "
          f"median {np.median(nearest):.4f}")
    print("most often a neighbour: "
          + ", ".join(f"row {int(h)} ({int(indegree[h])} times)" for h in hubs))
    if args.out:
        sp.save_npz(args.out, G)
        print(f"graph written to {args.out}")


if __name__ == "__main__":  # cluster workers start with spawn: nothing runs on import
    main()
