"""mgpu: sparse machine-learning primitives across many GPUs and CPUs through Dask.

``import mgpu`` never imports CuPy and never creates a CUDA context: the GPU backend is
loaded lazily, the first time an operation receives CuPy data.
"""
from __future__ import annotations

from mgpu import config as _config  # noqa: F401  (registers the mgpu.* defaults)

__version__ = "0.1.0"

from mgpu.dist.sddmm import sddmm  # noqa: E402
from mgpu.dist.cluster import connect  # noqa: E402,F401
from mgpu.dist.knn import knn  # noqa: E402
from mgpu.dist.spmv import spmm, spmv  # noqa: E402,F401
from mgpu.dist.jaccard import jaccard  # noqa: E402,F401
from mgpu.mf import MatrixFactorization  # noqa: E402,F401
from mgpu.ops import (NearestNeighbors, pairwise_distances, row_norms, sddmm_plan,  # noqa: E402,F401
                      spmv_plan)
from mgpu.backends.memory import DeviceMemoryError  # noqa: E402,F401
