"""Host and device helpers that decide by the type of the data, importing CuPy only when
CuPy data is there."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu.backends.dispatch import array_module_lookup, is_gpu_array

__all__ = ["array_module", "csr_astype", "csr_well_formed", "csr_with_values", "is_sparse",
           "on_device_of", "require_gpu_device", "sparse_module", "synchronize", "to_device",
           "to_host", "to_host_all"]


def to_host(x: object):
    """A numpy (or scipy) copy of CuPy (or cupyx) data (``x.get()``); host data as it is."""
    if is_gpu_array(x):
        return x.get()
    return x if sp.issparse(x) else np.asarray(x)


def require_gpu_device(func: str) -> Any:
    """CuPy, for a ``device='gpu'`` that ``func`` was given; else a refusal that says what is
    missing and how to get it (ImportError without CuPy, RuntimeError when CuPy sees no GPU),
    not CuPy's ModuleNotFoundError from somewhere inside the operation."""
    try:
        import cupy
    except ImportError as exc:
        raise ImportError(f"{func}(device='gpu') needs CuPy, which is not installed here "
                          f"({exc}). Install mgpu's GPU extra with pip install 'mgpu[gpu]' "
                          "(CuPy and dask-cuda for CUDA 13), or pass device='cpu'.") from None
    try:
        n, why = int(cupy.cuda.runtime.getDeviceCount()), "none visible"
    except Exception as exc:  # CuPy's CUDARuntimeError: no driver, or no device
        n, why = 0, str(exc)
    if n == 0:
        raise RuntimeError(f"{func}(device='gpu') needs a GPU, and CuPy finds none ({why}). "
                           "Check the driver and CUDA_VISIBLE_DEVICES, or pass device='cpu'.")
    return cupy


def to_device(x: Any) -> Any:
    """A CuPy copy of host data: cupyx CSR for a sparse matrix, a cupy array otherwise."""
    if sp.issparse(x):
        import cupyx.scipy.sparse as csp

        return csp.csr_matrix(x)
    import cupy

    return cupy.asarray(x)


def on_device_of(x: Any, like: Any, to_gpu: Callable[[Any], Any] | None = None) -> Any:
    """x on the device of ``like``: as it is when it is there already, else copied to the
    host (:func:`to_host`) or to the GPU (``to_gpu``, by default :func:`to_device`)."""
    if is_gpu_array(x) == is_gpu_array(like):
        return x
    if is_gpu_array(like):
        return (to_gpu or to_device)(x)
    return to_host(x)


def to_host_all(values: list[Any]) -> list[Any]:
    """Several results (flags, 0-d arrays) as host values, with one device round trip for all
    when any is on the GPU."""
    if any(is_gpu_array(v) for v in values):
        import cupy

        return cupy.stack([cupy.asarray(v) for v in values]).get().tolist()
    return list(values)


def sparse_module(x: Any) -> Any:
    """scipy.sparse for host data, cupyx.scipy.sparse for CuPy data."""
    if is_gpu_array(x):
        import cupyx.scipy.sparse as csp

        return csp
    return sp


def csr_with_values(S: Any, values: Any) -> Any:
    """A CSR matrix of S's pattern, with its own copies of S's index arrays, holding
    ``values`` (on the GPU without reading S's row pointers back: see
    :func:`mgpu.backends.cupy.with_values`)."""
    if is_gpu_array(S):
        from mgpu.backends.cupy import with_values

        return with_values(S, values)
    return sp.csr_matrix((values, S.indices.copy(), S.indptr.copy()), shape=S.shape)


def csr_astype(S: Any, dtype: Any) -> Any:
    """CSR S with its values in ``dtype``, its index arrays and their order kept (scipy's
    astype would sort unsorted indices)."""
    if is_gpu_array(S):
        return S.astype(dtype)
    return sp.csr_matrix((S.data.astype(dtype), S.indices, S.indptr), shape=S.shape)


def csr_well_formed(X: Any) -> Any:
    """Whether CSR X's index arrays are consistent (m + 1 row pointers from 0 to nnz, never
    decreasing; as many column indices as values, each in [0, n)): a bool on the host, a
    0-d array on the device (scipy or cupyx X)."""
    xp = array_module(X.indptr)
    m, n = X.shape
    ptr, idx = X.indptr, X.indices
    if ptr.shape != (m + 1,) or idx.ndim != 1 or X.data.shape != idx.shape:
        return False
    ok = (ptr[0] == 0) & (ptr[-1] == idx.size) & (xp.diff(ptr) >= 0).all()
    if idx.size:
        ok = ok & (idx.min() >= 0) & (idx.max() < n)
    return ok


def synchronize(x: object) -> object:
    """Wait for the device work that produced CuPy data ``x``; ``x`` itself, either way.

    A distributed task on a GPU ends here, so that it ends when its kernels do: otherwise
    Dask would time (and schedule by) launches rather than work.
    """
    if is_gpu_array(x):
        import cupy

        cupy.cuda.get_current_stream().synchronize()
    return x


def array_module(x: Any) -> Any:
    """numpy for host data, cupy for CuPy data (dense or sparse; a dask array's ``_meta``)."""
    return array_module_lookup(x)


def is_sparse(x: Any) -> bool:
    """Whether x is a scipy or cupyx sparse matrix."""
    if sp.issparse(x):
        return True
    if is_gpu_array(x):
        import cupyx.scipy.sparse as csp

        return csp.issparse(x)
    return False


@array_module_lookup.register(object)
def _numpy_module(x: Any) -> Any:
    return np
