"""The Jaccard workflow: edge weights of a real graph, their histogram and the strongest edges.

``mgpu run jaccard INPUT`` loads a SNAP edge list (or any adjacency mgpu.io reads), treats it
as undirected, spreads the weights over the cluster in nnz-balanced row blocks (on the GPUs
when the workers have them) and reports the distribution and the top-weighted edges.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

import mgpu

__all__ = ["edge_weights", "histogram", "plot", "top_edges"]


def edge_weights(G: Any, *, weighted: bool = False, symmetrize: bool = True,
                 parts: int | None = None, client: Any = None,
                 progress: Callable[[int], None] | None = None) -> sp.csr_matrix:
    """:func:`mgpu.jaccard` of G, on the cluster when ``parts`` is given."""
    return mgpu.jaccard(G, weighted=weighted, symmetrize=symmetrize, parts=parts,
                        client=client, progress=progress)


def _upper(J: sp.csr_matrix) -> sp.coo_matrix:
    """Each undirected edge once (i < j), weight kept even where it is 0."""
    coo = J.tocoo()
    keep = coo.row < coo.col
    return sp.coo_matrix((coo.data[keep], (coo.row[keep], coo.col[keep])), shape=J.shape)


def histogram(J: sp.csr_matrix, bins: int = 20) -> dict[str, Any]:
    """Counts of the undirected edges' weights in ``bins`` equal bins of [0, 1], and a summary.

    >>> J = sp.csr_matrix(np.array([[0, .5, 0], [.5, 0, 1.0], [0, 1.0, 0]]))
    >>> h = histogram(J, bins=2)
    >>> h["edges"], h["counts"], h["mean"]
    (2, [0, 2], 0.75)
    """
    w = _upper(J).data
    counts, edges = np.histogram(w, bins=bins, range=(0.0, 1.0))
    return {"edges": int(w.size), "bin_edges": edges.tolist(), "counts": counts.tolist(),
            "mean": float(w.mean()) if w.size else float("nan"),
            "median": float(np.median(w)) if w.size else float("nan"),
            "zero": float((w == 0).mean()) if w.size else float("nan"),
            "one": float((w == 1).mean()) if w.size else float("nan")}


def top_edges(J: sp.csr_matrix, n: int = 10) -> list[tuple[int, int, float]]:
    """The n undirected edges of largest weight, ties by the lower (i, j).

    >>> J = sp.csr_matrix(np.array([[0, .5, .5], [.5, 0, 1.0], [.5, 1.0, 0]]))
    >>> top_edges(J, 2)
    [(1, 2, 1.0), (0, 1, 0.5)]
    """
    up = _upper(J)
    order = np.lexsort((up.col, up.row, -up.data))[:n]
    return [(int(up.row[k]), int(up.col[k]), float(up.data[k])) for k in order]


def plot(J: sp.csr_matrix, path: str, title: str) -> None:
    """A histogram of the edge weights (log count axis) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w = _upper(J).data
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.hist(w, bins=50, range=(0.0, 1.0), color="#3b6ea8")
    ax.set_yscale("log")
    ax.set_xlabel("Jaccard weight")
    ax.set_ylabel("edges")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
