"""Backends: the same operation on the CPU (numpy/scipy/numba) and the GPU (CuPy).

Each primitive has a :class:`dask.utils.Dispatch` keyed by the type of its data
(:mod:`mgpu.backends.dispatch`). The numpy side is registered when this package is imported;
the CuPy side is registered lazily, the first time CuPy data arrives
(:mod:`mgpu.backends.register`), so ``import mgpu`` never imports CuPy. A Dask task calls
the lookup on its chunk, so one graph runs on CPU and GPU workers alike.

The modules of this package import each other and :mod:`mgpu.backends.dispatch`, never this
package itself; the names below are for the layers above.
"""
from __future__ import annotations

import mgpu.backends.register  # noqa: F401  (fills the tables)
from mgpu.backends.arrays import (
    array_module,
    csr_astype,
    csr_well_formed,
    csr_with_values,
    is_sparse,
    on_device_of,
    sparse_module,
    synchronize,
    to_device,
    to_host,
    to_host_all,
)
from mgpu.backends.dispatch import (
    all_finite_lookup,
    ann_build_lookup,
    ann_half_lookup,
    ann_prepare_lookup,
    ann_search_lookup,
    array_module_lookup,
    csr_sound_lookup,
    distances_lookup,
    is_gpu_array,
    jaccard_lookup,
    knn_input_lookup,
    knn_lookup,
    knn_prepare_lookup,
    knn_prepared_lookup,
    namm_lookup,
    nonfinite_lookup,
    row_norms_lookup,
    sddmm_flagged_lookup,
    sddmm_lookup,
    sddmm_plan_lookup,
    sddmm_remember_lookup,
    sddmm_repeat_lookup,
    sgd_lookup,
    spadd_lookup,
    spgemm_lookup,
    spmv_flagged_lookup,
    spmv_lookup,
    spmv_plan_lookup,
    spmv_takes_as_is_lookup,
)
from mgpu.backends.finite import all_finite, first_nonfinite, place_of

__all__ = [
    "all_finite",
    "all_finite_lookup",
    "ann_build_lookup",
    "ann_half_lookup",
    "ann_prepare_lookup",
    "ann_search_lookup",
    "array_module",
    "array_module_lookup",
    "csr_astype",
    "csr_well_formed",
    "csr_sound_lookup",
    "csr_with_values",
    "distances_lookup",
    "first_nonfinite",
    "is_gpu_array",
    "is_sparse",
    "jaccard_lookup",
    "knn_input_lookup",
    "knn_lookup",
    "knn_prepare_lookup",
    "knn_prepared_lookup",
    "namm_lookup",
    "nonfinite_lookup",
    "on_device_of",
    "place_of",
    "row_norms_lookup",
    "sddmm_flagged_lookup",
    "sddmm_lookup",
    "sddmm_plan_lookup",
    "sddmm_remember_lookup",
    "sddmm_repeat_lookup",
    "sgd_lookup",
    "sparse_module",
    "spadd_lookup",
    "spgemm_lookup",
    "spmv_flagged_lookup",
    "spmv_lookup",
    "spmv_plan_lookup",
    "spmv_takes_as_is_lookup",
    "synchronize",
    "to_device",
    "to_host",
    "to_host_all",
]
