"""Summaries of Jaccard edge weights (:func:`mgpu.jaccard`): their histogram over [0, 1] and
the strongest edges, each undirected edge counted once.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["histogram", "top_edges", "undirected_edges"]


def undirected_edges(J: sp.csr_matrix) -> sp.coo_matrix:
    """Each undirected edge of J once (i < j), its weight kept even where it is 0.

    >>> J = sp.csr_matrix(np.array([[0, .5], [.5, 0]]))
    >>> undirected_edges(J).data.tolist()
    [0.5]
    """
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
    w = undirected_edges(J).data
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
    up = undirected_edges(J)
    order = np.lexsort((up.col, up.row, -up.data))[:n]
    return [(int(up.row[k]), int(up.col[k]), float(up.data[k])) for k in order]
