"""Host and device helpers that decide by the type of the data, importing CuPy only when
CuPy data is there."""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu.backends.dispatch import array_module_lookup, is_gpu_array

__all__ = ["array_module", "is_sparse", "synchronize", "to_host"]


def to_host(x: object):
    """A numpy copy of CuPy data (``x.get()``); numpy data as it is."""
    return x.get() if is_gpu_array(x) else np.asarray(x)


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
