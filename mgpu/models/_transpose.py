"""The transpose of a CSR pattern as one gather, for models that transpose every step."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu.backends import is_gpu_array, to_device, to_host


@dataclass(frozen=True)
class Transposer:
    """Transposes matrices of one CSR pattern S by one gather: ``T`` holds Sᵀ's pattern
    (CSR, sorted indices) and ``perm`` where each of its entries sits in S.data."""

    T: Any
    perm: Any

    @classmethod
    def of(cls, S: Any) -> Transposer:
        """For S (scipy or cupyx CSR with sorted indices); arrays on S's device."""
        host = to_host(S)
        pos = sp.csr_matrix((np.arange(host.nnz, dtype=np.float64) + 1, host.indices,
                             host.indptr), shape=host.shape)
        T = pos.T.tocsr()
        T.sort_indices()
        perm = T.data.astype(np.int64) - 1
        T.data = np.zeros(T.nnz, dtype=S.dtype)
        # the map is built on the host once; a GPU pattern gets it back on its device
        if is_gpu_array(S):
            return cls(to_device(T), to_device(perm))
        return cls(T, perm)

    def counts(self) -> Any:
        """Entries per row of Sᵀ (per column of S)."""
        return self.T.indptr[1:] - self.T.indptr[:-1]

    def __call__(self, data: Any) -> Any:
        """Sᵀ holding the values ``data`` (given in S.data's order).

        The result shares T's index arrays, which nothing here changes, and is made from T
        rather than from a ``(data, indices, indptr)`` triple: cupyx's constructor reads a
        triple's indptr back from the device, a wait per call.
        """
        out = type(self.T)(self.T)
        out.data = data[self.perm]
        return out
