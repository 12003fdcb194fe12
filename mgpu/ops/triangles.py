"""Per-vertex triangle counts of an undirected graph by one masked SpGEMM.

With A the 0/1 adjacency of a simple graph, ``(A @ A)[i, j]`` is the number of common
neighbours of i and j; kept only where A has an edge (the mask), row i of
``C = (A @ A) ∘ A`` sums, over the neighbours j of i, the triangles through the edge
(i, j): every triangle through i is counted twice (once from each of its two other
vertices), so ``t_i = rowsum(C)_i / 2``. The mask keeps C within A's pattern, so the
product never builds the much larger A @ A.

Conventions, those of ``networkx.triangles``: self-loops are dropped (a vertex is not its
own neighbour), stored duplicates and edge weights count as one edge, stored zeros are not
edges.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from mgpu.backends import array_module
from mgpu.ops.jaccard import check_graph
from mgpu.ops.spgemm import spgemm
from mgpu.ops.validation import Boolean, check_param, is_dask_array

__all__ = ["triangles", "triangles_local"]

# float64 holds every integer up to 2**53 exactly: row sums below it are exact in any order
_EXACT = 2.0 ** 53


def triangles_local(A: Any) -> Any:
    """The triangle counts of a checked graph (:func:`mgpu.ops.jaccard.check_graph`, not
    weighted) on its own device: int64, numpy for scipy, cupy for cupyx.

    Raises RuntimeError where the SpGEMM's row sums are not the even integers they must be
    (a wrong product, or a row sum past float64's exact integers).
    """
    xp = array_module(A)
    n = A.shape[0]
    if A.nnz == 0:  # no edge, no triangle (and no empty product for a device library)
        return xp.zeros(n, dtype=np.int64)
    if A.dtype != np.float64:  # float32 counts stop being exact at 2**24
        A = A.astype(np.float64)
    # the public spgemm checks A again, as operands and as the mask (a few O(nnz) passes,
    # small beside the product), and hands its backend the mask in canonical form
    C = spgemm(A, A, mask=A)
    twice = C @ xp.ones(n, dtype=np.float64)
    t = xp.rint(twice / 2)
    bad = xp.flatnonzero((t * 2 != twice) | (twice >= _EXACT))
    if bad.size:
        i = int(bad[0])
        raise RuntimeError(
            f"triangles: row {i} of (A @ A) masked by A sums to {float(twice[i])!r}, which is "
            f"not an even integer below 2**53 ({bad.size} such row(s)); the SpGEMM gave a "
            "wrong product, or the counts exceed float64's exact integers.")
    return t.astype(np.int64)


def triangles(G: Any, *, symmetrize: bool = False) -> Any:
    """Number of triangles through every vertex of an undirected graph.

    One masked SpGEMM (:func:`mgpu.spgemm`): ``t = rowsum((A @ A) ∘ A) / 2``, with A the
    graph's 0/1 adjacency; the product is computed only at A's edges, in float64, so the
    counts are exact (row sums up to 2**53).

    Parameters
    ----------
    G : {scipy, cupyx} sparse matrix of shape (n_nodes, n_nodes)
        Adjacency of an undirected simple graph: a symmetric pattern. Its values are not
        used (weights and stored duplicates count as one edge); self-loops are dropped and
        stored zeros are not edges, as networkx's ``triangles`` counts them.
    symmetrize : bool, default=False
        Use the pattern of ``G + Gᵀ`` (an edge in either direction is an edge) instead of
        refusing a directed graph, for edge lists that store each edge once.

    Returns
    -------
    t : {numpy, cupy} ndarray of shape (n_nodes,)
        int64 triangle counts per vertex: numpy from scipy input, cupy from cupyx input.
        Each triangle is counted at its three vertices, so the graph has ``t.sum() // 3``.

    Raises
    ------
    TypeError
        Dense or non-numeric input; a dask array (the count runs on one device).
    ValueError
        Non-square G, NaN or infinity among its values, a pattern that is not symmetric
        (the message names an asymmetric entry and offers ``symmetrize=True``).
    RuntimeError
        The SpGEMM's row sums are not even integers (a wrong product): never the input's
        fault.

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> K4 = sp.csr_matrix(np.ones((4, 4)) - np.eye(4))  # every 3 of 4 vertices: 4 triangles
    >>> triangles(K4)
    array([3, 3, 3, 3])
    >>> path = sp.csr_matrix(([1, 1], ([0, 1], [1, 2])), shape=(3, 3))  # 0 -> 1 -> 2
    >>> triangles(path, symmetrize=True)
    array([0, 0, 0])
    """
    func = "triangles"
    check_param(symmetrize, "symmetrize", func, Boolean())
    if is_dask_array(G):
        raise TypeError(f"The 'G' parameter of {func} is a dask array, and the count runs on "
                        "one device: pass a scipy or cupyx matrix (mgpu.gather brings a dask "
                        "array of sparse tiles back as one scipy matrix).")
    A = check_graph(G, func, weighted=False, symmetrize=symmetrize)
    return triangles_local(A)
