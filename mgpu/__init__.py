"""mgpu: sparse machine-learning primitives across many GPUs and CPUs through Dask.

``import mgpu`` never imports CuPy and never creates a CUDA context: the GPU backend is
loaded lazily, the first time an operation receives CuPy data.
"""
from __future__ import annotations

from mgpu import config as _config  # noqa: F401  (registers the mgpu.* defaults)

__version__ = "0.1.0"

from mgpu.backends.memory import DeviceMemoryError  # noqa: E402
from mgpu.distributed.cluster import connect  # noqa: E402
from mgpu.distributed.collection import from_scipy, gather  # noqa: E402
from mgpu.distributed.jaccard import jaccard  # noqa: E402
from mgpu.distributed.knn import knn  # noqa: E402
from mgpu.distributed.sddmm import sddmm  # noqa: E402
from mgpu.distributed.spmv import spmm, spmv  # noqa: E402
from mgpu.mf import MatrixFactorization  # noqa: E402
from mgpu.ops import (NearestNeighbors, pairwise_distances, row_norms, sddmm_plan,  # noqa: E402
                      spmv_plan)

__all__ = [
    "DeviceMemoryError",
    "MatrixFactorization",
    "NearestNeighbors",
    "connect",
    "from_scipy",
    "gather",
    "jaccard",
    "knn",
    "pairwise_distances",
    "row_norms",
    "sddmm",
    "sddmm_plan",
    "spmm",
    "spmv",
    "spmv_plan",
]


def __getattr__(name: str):
    # ``mgpu.dist`` was the distributed layer's name before ``mgpu.distributed``.
    if name == "dist":
        import warnings

        import mgpu.distributed

        warnings.warn("mgpu.dist is now mgpu.distributed (mgpu.from_scipy and mgpu.gather are "
                      "at the top level too)", DeprecationWarning, stacklevel=2)
        return mgpu.distributed
    raise AttributeError(f"module 'mgpu' has no attribute {name!r}")
