"""Local operations: validate at the boundary, dispatch to a backend by the data's type,
and return the input's family (numpy/scipy in -> numpy out, cupy/cupyx in -> cupy out,
dask in -> dask out).

``NearestNeighbors`` (mgpu.ops.neighbors, which imports scikit-learn) is loaded the first time
it is asked for."""
from __future__ import annotations

from typing import Any

from mgpu.ops.distances import SEMIRINGS, knn, pairwise_distances
from mgpu.ops.rownorms import NORMS, row_norms
from mgpu.ops.sddmm import sddmm, sddmm_plan
from mgpu.ops.spgemm import spadd, spgemm
from mgpu.ops.spmv import spmm, spmv, spmv_plan
from mgpu.ops.triangles import triangles

__all__ = ["NORMS", "SEMIRINGS", "NearestNeighbors", "knn", "pairwise_distances", "row_norms",
           "sddmm", "sddmm_plan", "spadd", "spgemm", "spmm", "spmv", "spmv_plan",
           "triangles"]


def __getattr__(name: str) -> Any:
    if name == "NearestNeighbors":
        from mgpu.ops.neighbors import NearestNeighbors

        return NearestNeighbors
    raise AttributeError(f"module 'mgpu.ops' has no attribute {name!r}")
