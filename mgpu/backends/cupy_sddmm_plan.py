"""SDDMM with a plan on the GPU: what a call on the plan's S can reuse, prepared once.

:func:`mgpu.sddmm_plan` on cupyx data (:func:`plan_gpu`) tunes the scheme
(:func:`mgpu.backends.cupy.plan_sddmm`) and gives the plan a :class:`PlannedCall` holding
everything that does not depend on the factors:

- S itself, as far as a call must match it: its class, shape and its index arrays (the very
  objects, compared by identity: no look at the device), the product's dtype and the
  factors' shapes, the device;
- the launch of the CSR kernel (the product with the CSR scheme; the copies and the check
  beside a tiled one) per variant (``hadamard``, checked or not): kernel, grid, launch sizes
  and an argument buffer with every fixed argument packed
  (:class:`mgpu.backends.launch.PreparedLaunch`); a call writes only the addresses of S's
  values, A, B, P's arrays and the flag;
- P's index arrays: one copy of S's, made here and shared by every result of the plan, when
  S's indices are sorted without duplicates (then no method of cupyx rewrites them in place:
  ``sort_indices`` and ``sum_duplicates`` have nothing to do); otherwise the launch copies
  them into each result's own arrays, as a call without a plan does;
- whether the product is small enough to be allocated without asking the device first
  (:func:`mgpu.backends.memory.small_request`; the pool's limit is read again every call).

A call (:meth:`PlannedCall.__call__`) takes only operands that are exactly what the plan was
made for (cupy factors of the plan's dtype and shapes, C-ordered, 16-byte aligned where the
kernel loads 16 bytes at a time, on the plan's device; S's values of that dtype) and answers
None for anything else: :func:`mgpu.ops.sddmm.sddmm` then takes its general path, which
converts what it may and refuses the rest with its own words, before any launch. So this
path refuses nothing by itself, and every check of the general path either holds here by
the plan (S's kind, format and duplicates, the plan's fit) or is made again (shapes, dtypes,
order). NaN and infinity are checked by the launch's flag, read after the call's one wait.
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import cupy
import cupyx.scipy.sparse as csp
import numpy as np

from mgpu.backends.cupy import (
    _CSR_BLOCK,
    _require_product,
    call_plan,
    csr_of,
    csr_output,
    csr_recipe,
    plan_sddmm,
    run_tiled,
    sddmm_is_usable_for,
)
from mgpu.backends.dispatch import (
    sddmm_plan_lookup,
    sddmm_remember_lookup,
    sddmm_repeat_lookup,
)
from mgpu.backends.flags import Flag, device_flag
from mgpu.backends.launch import PreparedLaunch
from mgpu.backends.memory import small_request
from mgpu.backends.sddmm_plan import SDDMMPlan

__all__ = ["PlannedCall", "plan_gpu", "remember_call", "repeat_call"]

# the arguments of mgpu_sddmm_csr (mgpu.backends.cupy's _CSR_SIGNATURE) a call writes: S's
# values, A, B, P's values, indices and indptr (0: the plan's shared ones), the three checked
# arrays, the flag (0: unchecked)
_FREE = (2, 3, 4, 10, 11, 12, 14, 16, 18, 20)
_ndarray = cupy.ndarray
_get_device = cupy.cuda.runtime.getDevice


class PlannedCall:
    """A plan's calls on the GPU with everything but the factors prepared (see the module's
    text). ``call(S, A, B, hadamard, check_finite)`` gives ``(P, flagged)``, flagged telling
    whether the launch's flag saw NaN or infinity among A, B (and S's values with
    ``hadamard``; always False unchecked), or None where the operands are not the plan's
    (the caller then takes the general path)."""

    __slots__ = ("device", "kind", "shape", "nnz", "indptr", "indices", "dtype", "a_shape",
                 "b_shape", "scheme", "layout", "Tk", "W", "out_shape", "out_indices",
                 "out_indptr", "small", "pool", "_launches")

    def __init__(self, S: csp.csr_matrix, dtype: Any, K: int, scheme: str = "csr",
                 layout: Any = None, Tk: int = 0, share: bool = True) -> None:
        self.device = _get_device()
        self.kind = type(S)
        self.shape = tuple(S.shape)
        self.nnz = int(S.nnz)
        self.indptr, self.indices = S.indptr, S.indices  # held: their addresses stay S's
        self.dtype = np.dtype(dtype)
        m, n = self.shape
        self.a_shape, self.b_shape = (m, K), (n, K)
        self.scheme, self.layout, self.Tk = scheme, layout, Tk
        w = 16 // self.dtype.itemsize
        self.W = w if K and K % w == 0 else 1  # a call with unaligned factors: None
        self.out_shape = (self.nnz,)
        need = self.nnz * self.dtype.itemsize
        if share and S.has_canonical_format:  # known since sddmm_plan checked S for duplicates
            self.out_indices, self.out_indptr = S.indices.copy(), S.indptr.copy()
        else:  # unsorted: each result its own (cupyx's sort_indices sorts in place)
            self.out_indices = self.out_indptr = None
            need += S.indices.nbytes + S.indptr.nbytes
        self.small = small_request(need)
        self.pool = cupy.get_default_memory_pool()
        self._launches: dict[tuple[bool, bool], PreparedLaunch | None] = {}

    def __call__(self, S: Any, A: Any, B: Any, hadamard: bool, check_finite: bool
                 ) -> tuple[csp.csr_matrix, bool] | None:
        dt = self.dtype
        if (type(S) is not self.kind or S.indptr is not self.indptr
                or S.indices is not self.indices or type(A) is not _ndarray
                or type(B) is not _ndarray or A.shape != self.a_shape
                or B.shape != self.b_shape or A.dtype != dt or B.dtype != dt
                or S.shape != self.shape):
            return None
        values = S.data
        if (values.dtype != dt or values.size != self.nnz or not values.flags.c_contiguous
                or not A.flags.c_contiguous or not B.flags.c_contiguous):
            return None
        a, b = A.data.ptr, B.data.ptr
        if (self.W > 1 and (a | b) & 15) or _get_device() != self.device:
            return None
        if not self.small or self.pool.get_limit():  # as the general path asks the device
            _require_product(S, A, True)
        hadamard = bool(hadamard)
        if not check_finite:
            return self._run(S, A, B, a, b, values.data.ptr, hadamard, None), False
        with device_flag() as flag:
            P = self._run(S, A, B, a, b, values.data.ptr, hadamard, flag)
            return P, flag.raised()

    def _run(self, S: csp.csr_matrix, A: cupy.ndarray, B: cupy.ndarray, a: int, b: int,
             v: int, hadamard: bool, flag: Flag | None) -> csp.csr_matrix:
        """Queue the product and its check; P (made while the device works)."""
        if self.out_indices is not None:
            out = _ndarray(self.out_shape, self.dtype)
            indices, indptr, i, p = self.out_indices, self.out_indptr, 0, 0
        else:
            out, indices, indptr = csr_output(S, self.dtype)
            i, p = indices.data.ptr, indptr.data.ptr
        if self.scheme != "csr" and self.nnz:
            run_tiled(S, A, B, hadamard, self.layout, self.scheme, self.Tk, out)
        key = (hadamard, flag is not None)
        launch = self._launches[key] if key in self._launches else self._prepare(*key)
        if launch is not None:
            launch(v, a, b, out.data.ptr, i, p, a, b, v if hadamard else 0,
                   0 if flag is None else flag.addr)
        return csr_of(S, out, indices, indptr)

    def _prepare(self, hadamard: bool, checked: bool) -> PreparedLaunch | None:
        """The CSR kernel's launch of one variant (None: nothing to launch), made once."""
        m, n = self.shape
        K = self.a_shape[1]
        sizes = [m * K, n * K, self.nnz if hadamard else 0] if checked else [0, 0, 0]
        copies = self.out_indices is None
        launch, grid, nz_per_warp, blocks = csr_recipe(
            m, self.nnz, K, self.dtype, self.indptr.dtype, self.W, copies, copies, sizes,
            self.scheme == "csr")
        prepared = None
        if grid:
            # the free arguments' values (0 here) are written by every call
            args = (self.indptr.data.ptr, self.indices.data.ptr, 0, 0, 0, m, self.nnz, K,
                    1 if hadamard else 0, nz_per_warp, 0, 0, 0, blocks, 0, sizes[0], 0,
                    sizes[1], 0, sizes[2], 0)
            prepared = launch.prepare(grid, _CSR_BLOCK, args, _FREE)
        self._launches[(hadamard, checked)] = prepared
        return prepared


@sddmm_plan_lookup.register(csp.spmatrix)
def plan_gpu(S: csp.csr_matrix, K: int, dtype: np.dtype, scheme: str | None = None
             ) -> SDDMMPlan:
    """:func:`mgpu.sddmm_plan` on the GPU: tuned, with the tiled layout kept and its calls
    prepared (:class:`PlannedCall`)."""
    plan = plan_sddmm(S, int(K), dtype, reuse=True, force=scheme)
    return dataclasses.replace(plan, call=PlannedCall(S, plan.dtype, plan.K, plan.scheme,
                                                      plan.layout, plan.Tk))


# Calls without a plan, repeated on one S (an ALS or gradient loop's): the prepared call of
# each S seen before, per factors' K and dtype and device, made by such a call that ran the
# CSR kernel (call_plan None) on an S known free of duplicates (has_canonical_format, which
# cupyx keeps with S and the general path reads as well). Results have index arrays of their
# own, as every call without a plan gives. An entry lives as long as its S (a weak
# reference; at most _REPEAT_MAX of them, all dropped when full).
_REPEAT: dict[int, tuple[Any, dict[tuple, PlannedCall]]] = {}
_REPEAT_MAX = 64


def _forget(ref: Any, key: int) -> None:
    entry = _REPEAT.get(key)
    if entry is not None and entry[0] is ref:
        del _REPEAT[key]


@sddmm_remember_lookup.register(csp.spmatrix)
def remember_call(S: csp.csr_matrix, A: Any, B: Any) -> None:
    """After a call without a plan on S with factors A and B (of S's dtype, as they were
    used): its prepared call for the next call on this S, where the call ran the CSR kernel
    and S holds no duplicates."""
    if type(S) is not csp.csr_matrix or type(A) is not _ndarray or type(B) is not _ndarray \
            or A.ndim != 2 or B.ndim != 2 or not S.nnz or not sddmm_is_usable_for(S, A, B) \
            or not S.has_canonical_format or call_plan(S, A, B) is not None:
        return
    key = (int(A.shape[1]), A.dtype.char, _get_device())
    entry = _REPEAT.get(id(S))
    if entry is None or entry[0]() is not S:
        if len(_REPEAT) >= _REPEAT_MAX:
            _REPEAT.clear()
        entry = (weakref.ref(S, lambda r, i=id(S): _forget(r, i)), {})
        _REPEAT[id(S)] = entry
    calls = entry[1]
    call = calls.get(key)
    if call is None or call.indptr is not S.indptr or call.indices is not S.indices:
        calls[key] = PlannedCall(S, A.dtype, int(A.shape[1]), share=False)


@sddmm_repeat_lookup.register(cupy.ndarray)
def _no_repeat(S: Any, *args: Any) -> None:
    """A dense S: nothing prepared (the general path refuses it)."""
    return None


@sddmm_repeat_lookup.register(csp.spmatrix)
def repeat_call(S: Any, A: Any, B: Any, hadamard: bool, check_finite: bool
                ) -> tuple[csp.csr_matrix, bool] | None:
    """:func:`mgpu.sddmm`'s call without a plan on an S it has run before: (P, flagged) by
    that S's prepared call, or None (the general path then runs, with every check)."""
    entry = _REPEAT.get(id(S))
    if entry is None or entry[0]() is not S or type(A) is not _ndarray or A.ndim != 2:
        return None
    call = entry[1].get((A.shape[1], A.dtype.char, _get_device()))
    if call is None or not S.has_canonical_format:
        return None
    return call(S, A, B, hadamard, check_finite)
