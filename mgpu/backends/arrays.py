"""Host and device helpers that decide by the type of the data, importing CuPy only when
CuPy data is there."""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu.backends.dispatch import array_module_lookup, is_gpu_array

__all__ = ["array_module", "csr_astype", "is_sparse", "synchronize", "to_device", "to_host",
           "to_host_all"]


def to_host(x: object):
    """A numpy (or scipy) copy of CuPy (or cupyx) data (``x.get()``); host data as it is."""
    if is_gpu_array(x):
        return x.get()
    return x if sp.issparse(x) else np.asarray(x)


def to_device(x: Any) -> Any:
    """A CuPy copy of host data: cupyx CSR for a sparse matrix, a cupy array otherwise."""
    if sp.issparse(x):
        import cupyx.scipy.sparse as csp

        return csp.csr_matrix(x)
    import cupy

    return cupy.asarray(x)


def to_host_all(values: list[Any]) -> list[Any]:
    """Several results (flags, 0-d arrays) as host values, with one device round trip for all
    when any is on the GPU."""
    if any(is_gpu_array(v) for v in values):
        import cupy

        return cupy.stack([cupy.asarray(v) for v in values]).get().tolist()
    return list(values)


def csr_astype(S: Any, dtype: Any) -> Any:
    """CSR S with its values in ``dtype``, its index arrays and their order kept (scipy's
    astype would sort unsorted indices)."""
    if is_gpu_array(S):
        return S.astype(dtype)
    return sp.csr_matrix((S.data.astype(dtype), S.indices, S.indptr), shape=S.shape)


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
