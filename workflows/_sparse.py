"""Helpers the workflows share."""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp


def transpose_map(S: Any) -> tuple[Any, Any, Any]:
    """Sᵀ's CSR structure (indptr, indices) and, for each of its entries, where it sits in
    S.data: a matrix of S's pattern is then transposed by one gather, ``data[perm]``.
    Arrays on S's device (scipy or cupyx CSR with sorted indices)."""
    host = S.get() if hasattr(S, "get") else S
    pos = sp.csr_matrix((np.arange(host.nnz, dtype=np.float64) + 1, host.indices, host.indptr),
                        shape=host.shape)
    T = pos.T.tocsr()
    T.sort_indices()
    perm = T.data.astype(np.int64) - 1
    if hasattr(S, "get"):
        import cupy

        return cupy.asarray(T.indptr), cupy.asarray(T.indices), cupy.asarray(perm)
    return T.indptr, T.indices, perm
