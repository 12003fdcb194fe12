"""The dispatch tables: one :class:`dask.utils.Dispatch` per primitive, keyed by the type of
its data (as ``dask/array/dispatch.py``).

The tables live here, with :func:`is_gpu_array` (the one type test they are chosen by, made
without importing CuPy). The implementations are registered by the backend modules: the
numpy side when :mod:`mgpu.backends` is imported, the CuPy side lazily, the first time CuPy
data reaches a table (:mod:`mgpu.backends.register`), so ``import mgpu`` never imports CuPy.
A Dask task calls the lookup on its chunk, so one graph runs on CPU and GPU workers alike.
"""
from __future__ import annotations

from dask.utils import Dispatch

__all__ = [
    "ann_build_lookup",
    "ann_half_lookup",
    "ann_prepare_lookup",
    "ann_search_lookup",
    "all_finite_lookup",
    "array_module_lookup",
    "csr_sound_lookup",
    "distances_lookup",
    "is_gpu_array",
    "jaccard_lookup",
    "knn_input_lookup",
    "knn_lookup",
    "knn_prepare_lookup",
    "knn_prepared_lookup",
    "namm_lookup",
    "nonfinite_lookup",
    "row_norms_lookup",
    "sddmm_flagged_lookup",
    "sddmm_lookup",
    "sddmm_plan_lookup",
    "sddmm_remember_lookup",
    "sddmm_repeat_lookup",
    "sgd_lookup",
    "spmv_flagged_lookup",
    "spmv_lookup",
    "spmv_plan_lookup",
    "spmv_takes_as_is_lookup",
    "spadd_lookup",
    "spgemm_lookup",
]

# (rows as the graph takes them, metric, d_min, d_max, N's length, exploration limit, batch,
# progress) -> (graph, degree): the proximity graph of GraphIndex
ann_build_lookup = Dispatch("ann_build")
# (rows as the graph takes them, dense) -> the same rows kept in half precision for the
# searches (GraphIndex's half=True)
ann_half_lookup = Dispatch("ann_half")
# (checked X, metric, sparse or None) -> the rows as the graph's kernels take them, in the
# form asked (None: X's own)
ann_prepare_lookup = Dispatch("ann_prepare")
# (rows, graph, degree, queries, k, metric, N's length, exploration limit) -> (dist, ids)
ann_search_lookup = Dispatch("ann_search")
# (X, op) -> per-row reduction in X's float dtype
row_norms_lookup = Dispatch("row_norms")
# (S CSR, A, B, hadamard, plan) -> S ∘ (A Bᵀ) on S's pattern
sddmm_lookup = Dispatch("sddmm")
# (S CSR, A, B, hadamard, plan) -> (S ∘ (A Bᵀ), whether NaN/inf was flagged among the values
# of A, B (and S with hadamard), or None where nothing was checked): the GPU's checked product
sddmm_flagged_lookup = Dispatch("sddmm_flagged")
# (S CSR, K, dtype, scheme) -> the SDDMMPlan of S on its device
sddmm_plan_lookup = Dispatch("sddmm_plan")
# (S CSR, A, B, hadamard, check_finite) -> (P, flagged) by the prepared call of a call
# without a plan on this very S made before (GPU), or None: the general path then runs
sddmm_repeat_lookup = Dispatch("sddmm_repeat")
# (S CSR, A) -> None: after such a call ran on S by the general path, prepare the next one
sddmm_remember_lookup = Dispatch("sddmm_remember")
namm_lookup = Dispatch("namm")  # union (merge) distances between the rows of two CSR matrices
knn_lookup = Dispatch("knn")  # (index, queries, k, ring, p, working_memory) -> (dist, ids)
distances_lookup = Dispatch("distances")  # (X, Y, ring, p) -> dense distance matrix
knn_prepare_lookup = Dispatch("knn_prepare")  # (tile, ring, p) -> an index ready for queries
# (prepared index, checked host queries, k, ring, p, working_memory) -> (dist, ids)
knn_prepared_lookup = Dispatch("knn_prepared")
# (on, X) -> X as the kNN kernels of on's device take it (X's kind and shape checked)
knn_input_lookup = Dispatch("knn_input")
# (A CSR, x 1-D or X 2-D dense, plan=None) -> A @ x, merge path (with the plan's cuts)
spmv_lookup = Dispatch("spmv")
spmv_plan_lookup = Dispatch("spmv_plan")  # (A CSR) -> SpMVPlan of A on its device
# (A, x, ndim) -> whether A and x go to the kernels as they are, with no conversion and no
# check but of their values (False wherever the full checks run first)
spmv_takes_as_is_lookup = Dispatch("spmv_takes_as_is")
# (A CSR, x, plan) -> (A @ x, whether NaN/inf was flagged, or None where nothing was
# checked): the product that checks its operands as it reads them (the GPU's)
spmv_flagged_lookup = Dispatch("spmv_flagged")
# (A CSR, B CSR, mask CSR or None) -> A @ B (restricted to mask's pattern) as canonical CSR:
# sorted indices, no duplicates, no stored zeros; A and B of one float dtype, checked finite
spgemm_lookup = Dispatch("spgemm")
# (CSR, CSR, ...) -> whether every one has consistent index arrays (row pointers from 0 to
# nnz, never decreasing; column indices in [0, n)) and finite values: one look on its device
csr_sound_lookup = Dispatch("csr_sound")
# (A CSR, B CSR, alpha, beta) -> alpha * A + beta * B as canonical CSR (as spgemm's)
spadd_lookup = Dispatch("spadd")
# (G CSR, weighted, r0, r1) -> Jaccard weights of the edges of rows r0..r1, in G's order
jaccard_lookup = Dispatch("jaccard")
# (users, items, ratings, P, Q, lr, reg_p, reg_q) -> None: one SGD pass, P and Q in place
sgd_lookup = Dispatch("sgd")
# (values) -> flat (C-order) position of the first NaN or infinity, or None
nonfinite_lookup = Dispatch("nonfinite")
# (dense X) -> whether X is all finite: a bool on the host, a 0-d array on the device
all_finite_lookup = Dispatch("all_finite")
# (x) -> the array module of x's device: numpy or cupy
array_module_lookup = Dispatch("array_module")


def is_gpu_array(x: object) -> bool:
    """Whether ``x`` is CuPy data (dense or cupyx sparse), decided without importing CuPy."""
    mod = type(x).__module__.split(".", 1)[0]
    return mod in ("cupy", "cupyx")
