"""Checks shared by the public operations; messages follow scikit-learn's wording."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import scipy.sparse as sp

# The NaN/infinity scan and the sparse test live in the backends layer (one per device);
# the ops take them from here.
from mgpu.backends import all_finite, first_nonfinite, is_gpu_array, is_sparse, place_of
from mgpu.ops._params import StrOptions, check_param

__all__ = ["all_finite", "canonical_csr", "check_matrix", "check_option", "first_nonfinite",
           "float_dtype", "is_dask_array", "is_sparse", "place_of"]


def check_option(name: str, func: str, value: Any, options: Iterable[str]) -> None:
    """Refuse a string option that is not one of ``options``."""
    check_param(value, name, func, StrOptions(options))


def is_dask_array(x: Any) -> bool:
    return type(x).__module__.startswith("dask.array") and hasattr(x, "dask")


def check_matrix(x: Any, name: str, func: str) -> None:
    """Refuse anything that is not a 2-D numpy/cupy array or scipy/cupyx sparse matrix."""
    # is_gpu_array: CuPy data is one of the kinds taken (not a choice of device)
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
