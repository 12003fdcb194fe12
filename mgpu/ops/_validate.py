"""Checks shared by the public operations; messages follow scikit-learn's wording."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numba
import numpy as np
import scipy.sparse as sp

from mgpu.backends import is_gpu_array


def check_option(name: str, func: str, value: Any, options: Iterable[str]) -> None:
    """Refuse a string option that is not one of ``options``."""
    opts = sorted(options)
    if not isinstance(value, str) or value not in opts:
        raise ValueError(
            f"The '{name}' parameter of {func} must be a str among "
            f"{{{', '.join(repr(o) for o in opts)}}}. Got {value!r} instead."
        )


def is_dask_array(x: Any) -> bool:
    return type(x).__module__.startswith("dask.array") and hasattr(x, "dask")


def is_sparse(x: Any) -> bool:
    if sp.issparse(x):
        return True
    if is_gpu_array(x):
        import cupyx.scipy.sparse as csp

        return csp.issparse(x)
    return False


def check_matrix(x: Any, name: str, func: str) -> None:
    """Refuse anything that is not a 2-D numpy/cupy array or scipy/cupyx sparse matrix."""
    ok = isinstance(x, np.ndarray) or sp.issparse(x) or is_gpu_array(x) or is_dask_array(x)
    if not ok:
        raise TypeError(
            f"The '{name}' parameter of {func} must be a 2-D numpy or cupy array, a scipy or "
            f"cupyx sparse matrix, or a dask array. Got {type(x).__name__} instead."
        )
    if len(x.shape) != 2:
        raise ValueError(
            f"The '{name}' parameter of {func} must be 2-D. Got shape {tuple(x.shape)} instead."
        )
    kind = np.dtype(x.dtype).kind
    if kind not in "biuf":
        raise TypeError(
            f"The '{name}' parameter of {func} must hold real numbers. Got dtype {x.dtype}."
        )


def float_dtype(dtype: Any) -> np.dtype:
    """float32 stays float32, float64 stays float64, everything else computes in float64."""
    dt = np.dtype(dtype)
    return dt if dt in (np.dtype(np.float32), np.dtype(np.float64)) else np.dtype(np.float64)


def canonical_csr(x: Any) -> Any:
    """CSR in float32/float64 with sorted indices and no duplicates (scipy or cupyx).

    Duplicates are summed, as scipy's own arithmetic treats them; the input is never
    modified in place.
    """
    dt = float_dtype(x.dtype)
    out = x.tocsr()
    if out.dtype != dt:
        out = out.astype(dt)  # a new matrix (cupyx's astype takes no copy flag)
    if not out.has_canonical_format:
        if out is x:
            out = out.copy()
        out.sum_duplicates()
    return out


_FINITE_CHUNK = 1 << 24  # values per pass of the host scan: no mask the size of a factor
_PARALLEL_SCAN = 1 << 20  # contiguous host arrays of this many values are scanned in parallel


@numba.njit(parallel=True, nogil=True, cache=True)
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
        xp = np if isinstance(X.indptr, np.ndarray) else _cupy()
        return int(xp.searchsorted(X.indptr, p, side="right")) - 1, int(X.indices[p])
    return tuple(int(v) for v in np.unravel_index(p, X.shape))


def first_nonfinite(X: Any) -> tuple[int, ...] | None:
    """The place (:func:`place_of`) of X's first NaN or infinity among its values (a CSR
    matrix's stored ones), or None. A host array is scanned in chunks of rows, so that a
    factor of tens of GB gets no mask of its size; a device array costs one round trip."""
    vals = X.data if is_sparse(X) else X
    if np.dtype(vals.dtype).kind != "f" or vals.size == 0:
        return None
    if isinstance(vals, np.ndarray):
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
                return place_of(X, s * width + int(np.flatnonzero(bad)[0]))
        return None
    bad = ~_cupy().isfinite(vals)
    if not bool(bad.any()):
        return None
    return place_of(X, int(_cupy().argmax(bad.ravel())))


def all_finite(X: Any) -> Any:
    """Whether the dense X is all finite: a bool for numpy (scanned as
    :func:`first_nonfinite` does), a 0-d device array for cupy (no round trip)."""
    if isinstance(X, np.ndarray):
        return first_nonfinite(X) is None
    return _cupy().isfinite(X).all()


def _cupy() -> Any:
    import cupy

    return cupy
