"""Summaries of per-vertex triangle counts (:func:`mgpu.triangles`): the graph's totals, its
global clustering coefficient, and the vertices with most triangles.
"""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["summary", "top_vertices"]


def summary(t: np.ndarray, degrees: np.ndarray) -> dict[str, Any]:
    """Totals of a simple undirected graph from its triangle counts ``t`` and its vertex
    degrees (self-loops not counted, as :func:`mgpu.triangles` does not count them).

    ``triples`` are the connected triples (paths of two edges, Σ d(d−1)/2), and
    ``transitivity`` the global clustering coefficient 3 × triangles / triples (0 without
    triples), networkx's ``transitivity``.

    >>> s = summary(np.array([1, 1, 1, 0]), np.array([2, 2, 3, 1]))  # a triangle and a tail
    >>> s["triangles"], s["triples"], round(s["transitivity"], 4)
    (1, 5, 0.6)
    """
    t = np.asarray(t, dtype=np.int64)
    d = np.asarray(degrees, dtype=np.int64)
    triples = int((d * (d - 1) // 2).sum())
    closed = int(t.sum())  # 3 × triangles: each is counted at its three vertices
    return {"vertices": int(t.size), "edges": int(d.sum()) // 2, "triangles": closed // 3,
            "triples": triples, "transitivity": closed / triples if triples else 0.0}


def top_vertices(t: np.ndarray, n: int = 10) -> list[tuple[int, int]]:
    """The n vertices with most triangles as (vertex, count), ties by the lower vertex.

    >>> top_vertices(np.array([1, 3, 0, 3]), 3)
    [(1, 3), (3, 3), (0, 1)]
    """
    t = np.asarray(t, dtype=np.int64)
    order = np.lexsort((np.arange(t.size), -t))[:n]
    return [(int(i), int(t[i])) for i in order]
