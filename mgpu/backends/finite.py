"""The NaN/infinity scan: where the first non-finite value of an array or of a sparse
matrix's stored values lies. The host scan runs on every core (numba) and in chunks of rows,
so a factor of tens of GB gets no mask of its size; the device scan
(:mod:`mgpu.backends.cupy`) costs one round trip."""
from __future__ import annotations

from typing import Any

import numba
import numpy as np

from mgpu.backends.arrays import array_module, is_sparse
from mgpu.backends.dispatch import all_finite_lookup, nonfinite_lookup
from mgpu.backends.jit import njit

__all__ = ["all_finite", "first_nonfinite", "place_of"]

_FINITE_CHUNK = 1 << 24  # values per pass of the host scan: no mask the size of a factor
_PARALLEL_SCAN = 1 << 20  # contiguous host arrays of this many values are scanned in parallel


@njit(parallel=True, nogil=True)
def _count_nonfinite(flat: np.ndarray, parts: int) -> int:  # pragma: no cover (numba)
    """NaNs and infinities of a 1-D array, counted in ``parts`` over numba's threads."""
    n = flat.size
    step = (n + parts - 1) // parts
    bad = 0
    for p in numba.prange(parts):
        c = 0
        for i in range(p * step, min(n, (p + 1) * step)):
            v = flat[i]
            c += 0 if v - v == 0 else 1  # v - v is NaN for NaN and infinity
        bad += c
    return bad


def place_of(X: Any, p: int) -> tuple[int, ...]:
    """Where value ``p`` of X lies: its index in a dense array (C order), or (row, column) of
    a CSR matrix's stored value ``p``."""
    if is_sparse(X):
        xp = array_module(X)
        return int(xp.searchsorted(X.indptr, p, side="right")) - 1, int(X.indices[p])
    return tuple(int(v) for v in np.unravel_index(p, X.shape))


def first_nonfinite(X: Any) -> tuple[int, ...] | None:
    """The place (:func:`place_of`) of X's first NaN or infinity among its values (a CSR
    matrix's stored ones), or None. A host array is scanned in chunks of rows, so that a
    factor of tens of GB gets no mask of its size; a device array costs one round trip."""
    vals = X.data if is_sparse(X) else X
    if np.dtype(vals.dtype).kind != "f" or vals.size == 0:
        return None
    p = nonfinite_lookup(vals)
    return None if p is None else place_of(X, p)


def all_finite(X: Any) -> Any:
    """Whether the dense X is all finite: a bool for numpy (scanned as
    :func:`first_nonfinite` does), a 0-d device array for cupy (no round trip)."""
    return all_finite_lookup(X)


@nonfinite_lookup.register(np.ndarray)
def _nonfinite_host(vals: np.ndarray) -> int | None:
    if vals.size >= _PARALLEL_SCAN and vals.dtype.type in (np.float32, np.float64) \
            and vals.flags.c_contiguous | vals.flags.f_contiguous \
            and _count_nonfinite(vals.reshape(-1, order="A"),
                                 64 * numba.get_num_threads()) == 0:
        return None  # the common case, on every core; the place is found below
    width = vals[0].size if vals.ndim > 1 else 1
    step = max(1, _FINITE_CHUNK // max(1, width))
    for s in range(0, vals.shape[0], step):
        bad = ~np.isfinite(vals[s:s + step])
        if bad.any():
            return s * width + int(np.flatnonzero(bad)[0])
    return None


@all_finite_lookup.register(np.ndarray)
def _all_finite_host(X: np.ndarray) -> bool:
    return first_nonfinite(X) is None
