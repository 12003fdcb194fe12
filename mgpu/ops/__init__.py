"""Local operations: validate at the boundary, dispatch to a backend by the data's type,
and return the input's family (numpy/scipy in -> numpy out, cupy/cupyx in -> cupy out,
dask in -> dask out)."""
from __future__ import annotations

from mgpu.ops.distances import SEMIRINGS, knn, pairwise_distances
from mgpu.ops.neighbors import NearestNeighbors
from mgpu.ops.rownorms import NORMS, row_norms
from mgpu.ops.sddmm import sddmm, sddmm_plan
from mgpu.ops.spmv import spmm, spmv, spmv_plan

__all__ = ["NORMS", "SEMIRINGS", "NearestNeighbors", "knn", "pairwise_distances", "row_norms",
           "sddmm", "sddmm_plan", "spmm", "spmv", "spmv_plan"]
