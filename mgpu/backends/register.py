"""Which module registers each primitive (as ``dask/array/backends.py``): the numpy side
eagerly, the CuPy side lazily, the first time CuPy data reaches a table. Importing
:mod:`mgpu.backends` runs this, so a lookup is complete wherever it is called."""
from __future__ import annotations

import importlib

from dask.sizeof import sizeof

import mgpu.backends.arrays  # noqa: F401  (the numpy side of array_module)
import mgpu.backends.finite  # noqa: F401  (the host finite scan)
import mgpu.backends.numpy  # noqa: F401  (row norms, SDDMM, NAMM, Jaccard)
import mgpu.backends.numpy_knn  # noqa: F401  (kNN and distances)
import mgpu.backends.numpy_spmv  # noqa: F401  (SpMV, SpMM, their plans)
import mgpu.backends.numpy_spgemm  # noqa: F401  (SpGEMM, SpAdd)
import mgpu.backends.numpy_ann  # noqa: F401  (the proximity graph of GraphIndex)
import mgpu.backends.dispatch as d

# The module that registers the CuPy side of each table, when CuPy data first reaches it.
# knn_prepared_lookup is not among them: it dispatches on the index knn_prepare_lookup
# returns, whose GPU type (GpuIndex, of module mgpu.backends.cupy_knn, not cupy's) is
# registered where it is defined; a GpuIndex cannot exist, nor be unpickled on a worker,
# without importing that module, and so its registration.
CUPY_MODULES: dict[str, tuple] = {
    "mgpu.backends.cupy": (
        d.row_norms_lookup, d.sddmm_lookup, d.sddmm_flagged_lookup, d.jaccard_lookup,
        d.nonfinite_lookup, d.all_finite_lookup, d.array_module_lookup,
    ),
    "mgpu.backends.cupy_sddmm_plan": (
        d.sddmm_plan_lookup, d.sddmm_repeat_lookup, d.sddmm_remember_lookup,
    ),
    "mgpu.backends.cupy_knn": (
        d.knn_lookup, d.distances_lookup, d.knn_prepare_lookup, d.knn_input_lookup,
    ),
    "mgpu.backends.cupy_spmv": (
        d.spmv_lookup, d.spmv_plan_lookup, d.spmv_takes_as_is_lookup, d.spmv_flagged_lookup,
    ),
    "mgpu.backends.cupy_sgd": (d.sgd_lookup,),
    "mgpu.backends.cupy_csr": (d.csr_sound_lookup,),
    "mgpu.backends.cupy_spgemm": (d.spgemm_lookup,),
    "mgpu.backends.cupy_spadd": (d.spadd_lookup,),
    "mgpu.backends.cupy_ann": (d.ann_prepare_lookup, d.ann_build_lookup, d.ann_search_lookup,
                               d.ann_half_lookup),
}


def _lazy(module: str):
    def register() -> None:
        importlib.import_module(module)

    return register


for _module, _lookups in CUPY_MODULES.items():
    for _lookup in _lookups:
        _lookup.register_lazy("cupy", _lazy(_module))
        _lookup.register_lazy("cupyx", _lazy(_module))


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
