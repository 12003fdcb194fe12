"""Backends: the same operation on the CPU (numpy/scipy/numba) and the GPU (CuPy).

Each primitive has a :class:`dask.utils.Dispatch` keyed by the type of its data. The numpy
side is registered when :mod:`mgpu.backends.numpy` is imported; the CuPy side is registered
lazily, the first time CuPy data arrives, so ``import mgpu`` never imports CuPy. A Dask task
calls the lookup on its chunk, so one graph runs on CPU and GPU workers alike.
"""
from __future__ import annotations

from dask.sizeof import sizeof
from dask.utils import Dispatch

row_norms_lookup = Dispatch("row_norms")
sddmm_lookup = Dispatch("sddmm")
namm_lookup = Dispatch("namm")  # union (merge) distances between the rows of two CSR matrices
knn_lookup = Dispatch("knn")  # (index, queries, k, ring, p, working_memory) -> (dist, ids)
distances_lookup = Dispatch("distances")  # (X, Y, ring, p) -> dense distance matrix
knn_prepare_lookup = Dispatch("knn_prepare")  # (tile, ring, p) -> an index ready for queries
spmv_lookup = Dispatch("spmv")  # (A CSR, x 1-D or X 2-D dense) -> A @ x, merge path
jaccard_lookup = Dispatch("jaccard")  # (G CSR, weighted) -> Jaccard weights on G's pattern
# (users, items, ratings, P, Q, lr, reg_p, reg_q) -> None: one SGD pass, P and Q in place
sgd_lookup = Dispatch("sgd")


def _register_cupy() -> None:
    import mgpu.backends.cupy  # noqa: F401  (registers the CuPy side of every lookup)
    import mgpu.backends.cupy_knn  # noqa: F401
    import mgpu.backends.cupy_sgd  # noqa: F401
    import mgpu.backends.cupy_spmv  # noqa: F401


for _lookup in (row_norms_lookup, sddmm_lookup, knn_lookup, distances_lookup,
                knn_prepare_lookup, spmv_lookup, jaccard_lookup, sgd_lookup):
    _lookup.register_lazy("cupy", _register_cupy)
    _lookup.register_lazy("cupyx", _register_cupy)



@sizeof.register_lazy("cupyx")
def _register_cupyx_sizeof() -> None:
    # Dask sizes a cupyx sparse matrix by its Python object (a few dozen bytes): the scheduler
    # would then move a GPU tile of S to wherever a factor is, and dask-cuda's device memory
    # limit would never count it.
    import cupyx.scipy.sparse as csp

    @sizeof.register(csp.spmatrix)
    def _sizeof_cupyx_sparse(x: object) -> int:
        parts = ("data", "indices", "indptr", "row", "col")
        return sum(int(getattr(x, name).nbytes) for name in parts if hasattr(x, name))


import mgpu.backends.numpy  # noqa: E402,F401  (registers the CPU side)
import mgpu.backends.numpy_spmv  # noqa: E402,F401


def is_gpu_array(x: object) -> bool:
    """Whether ``x`` is CuPy data (dense or cupyx sparse), decided without importing CuPy."""
    mod = type(x).__module__.split(".", 1)[0]
    return mod in ("cupy", "cupyx")


def to_host(x: object):
    """A numpy copy of CuPy data (``x.get()``); numpy data as it is."""
    import numpy

    return x.get() if is_gpu_array(x) else numpy.asarray(x)


def synchronize(x: object) -> object:
    """Wait for the device work that produced CuPy data ``x``; ``x`` itself, either way.

    A distributed task on a GPU ends here, so that it ends when its kernels do: otherwise
    Dask would time (and schedule by) launches rather than work.
    """
    if is_gpu_array(x):
        import cupy

        cupy.cuda.get_current_stream().synchronize()
    return x
