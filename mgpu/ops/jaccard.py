"""Jaccard edge weights of an undirected graph (Anzt & Dongarra's kernel, one item per edge).

For every edge (i, j) of G the weight is ``|N(i) ∩ N(j)| / |N(i) ∪ N(j)|``, computed on G's
pattern only: J = A ⊙_J Aᵀ has A's pattern, so there is no symbolic phase. With
``weighted=True`` the rows' weights take part (the weighted Jaccard, or Ruzicka, similarity):
``Σ_k min(w_ik, w_jk) / Σ_k max(w_ik, w_jk)`` over the union of the two neighbourhoods.

Conventions: self-loops are dropped (a node is not its own neighbour, as in an undirected
simple graph; networkx would count a self-loop in N(i)); stored zeros are not edges; the
result has G's pattern without the diagonal.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from mgpu.backends import array_module, csr_with_values, jaccard_lookup, sparse_module, to_host
from mgpu.ops.validation import check_array, first_nonfinite, float_dtype, is_dask_array

__all__ = ["check_graph", "jaccard_local"]


def _xp(G: Any) -> tuple[Any, Any]:
    """The array and sparse modules of G's device."""
    return array_module(G), sparse_module(G)


def _drop(G: Any, keep: Any) -> Any:
    """G without the stored entries where ``keep`` is False (scipy or cupyx CSR)."""
    xp, sparse = _xp(G)
    rows = xp.searchsorted(G.indptr, xp.arange(G.nnz), side="right") - 1
    counts = xp.bincount(rows[keep], minlength=G.shape[0])
    indptr = xp.concatenate([xp.zeros(1, G.indptr.dtype), xp.cumsum(counts)]).astype(
        G.indptr.dtype)
    return sparse.csr_matrix((G.data[keep], G.indices[keep], indptr), shape=G.shape)


def check_graph(G: Any, func: str = "jaccard", *, weighted: bool = False,
                symmetrize: bool = False) -> Any:
    """G as the kernels take it: canonical CSR (float32/float64, sorted, no duplicates, no
    stored zeros, no self-loops) with a symmetric pattern (and symmetric weights when
    ``weighted``), on G's device. Refuses what is not an undirected graph."""
    if is_dask_array(G):
        raise TypeError(f"The 'G' parameter of {func} is a dask array: pass the scipy graph "
                        "and parts=N to spread the work over the cluster.")
    check_array(G, "G", func, accept_dense=False, ndim=None,
                kinds="a sparse adjacency matrix (scipy or cupyx)",
                kinds_hint="; dense input: pass scipy.sparse.csr_matrix(G)")
    xp, sparse = _xp(G)
    if G.ndim != 2 or G.shape[0] != G.shape[1]:
        raise ValueError(f"The 'G' parameter of {func} must be a square adjacency matrix. Got "
                         f"shape {tuple(G.shape)} instead.")
    G = sparse.csr_matrix(G, dtype=float_dtype(G.dtype), copy=True)
    G.sum_duplicates()
    G.sort_indices()
    if G.nnz:
        at = first_nonfinite(G)
        if at is not None:
            raise ValueError(f"The 'G' parameter of {func} holds NaN or infinity (first at row "
                             f"{at[0]}, column {at[1]}).")
        if weighted and bool((G.data < 0).any()):
            raise ValueError(f"The 'G' parameter of {func} has negative edge weights; "
                             "weighted=True needs non-negative ones.")
    rows = xp.searchsorted(G.indptr, xp.arange(G.nnz), side="right") - 1
    keep = (G.data != 0) & (G.indices != rows)  # no stored zeros, no self-loops
    if not bool(keep.all()):
        G = _drop(G, keep)
    if not weighted:
        G.data[:] = 1
    if symmetrize:
        G = (G.maximum(G.T) if weighted else G + G.T).tocsr()
        if not weighted:
            G.data[:] = 1
        G.sum_duplicates()
        G.sort_indices()
        return G
    T = G.T.tocsr()
    T.sum_duplicates()
    T.sort_indices()
    same = bool(xp.array_equal(G.indptr, T.indptr)) and bool(
        xp.array_equal(G.indices, T.indices))
    if same and weighted:
        same = bool(xp.array_equal(G.data, T.data))
    if not same:
        H = to_host(G)
        D = (H - H.T).tocoo()
        nz = np.flatnonzero(D.data)
        where = f" (first: row {int(D.row[nz[0]])}, column {int(D.col[nz[0]])})" if nz.size \
            else ""
        what = "weights" if weighted else "pattern"
        raise ValueError(f"The 'G' parameter of {func} must be an undirected graph, but its "
                         f"{what} is not symmetric{where}. Pass symmetrize=True to use "
                         f"G + Gᵀ{' (the larger weight of each pair)' if weighted else ''}.")
    return G


def jaccard_local(G: Any, weighted: bool) -> Any:
    """Jaccard weights of a checked graph on its own device: a CSR of G's pattern (scipy
    float64 from scipy input, cupyx in G's dtype from cupyx input)."""
    return csr_with_values(G, jaccard_lookup(G, weighted, 0, G.shape[0]))
