"""GPU backend: CuPy arrays and cupyx sparse matrices, kernels from ``kernels/``.

Imported lazily by the dispatch tables the first time CuPy data reaches an operation.
"""
from __future__ import annotations

import functools
import logging
import math
import threading
from dataclasses import dataclass
from typing import Any

import cupy
import cupyx.scipy.sparse as csp
import numpy as np

from mgpu.backends.dispatch import (
    all_finite_lookup,
    array_module_lookup,
    jaccard_lookup,
    nonfinite_lookup,
    row_norms_lookup,
    sddmm_flagged_lookup,
    sddmm_lookup,
)
from mgpu.backends.flags import Flag, device_flag
from mgpu.backends.instances import INSTANCES
from mgpu.backends.launch import address, launcher
from mgpu.backends.loader import c_type, get_function
from mgpu.backends.memory import gpu_available, require_gpu, require_gpu_unless_small
from mgpu.backends.numpy import ROW_ABS_SUM, ROW_SQ_SUM, ROW_SUM, dense_row_reduce
from mgpu.backends.sddmm_plan import (
    SM_SM_DENSITY,
    Candidate,
    SDDMMPlan,
    TileLayout,
    candidates,
    pattern_key,
    tile_layout,
)
from mgpu.backends.timing import time_gpu

logger = logging.getLogger(__name__)


@array_module_lookup.register((cupy.ndarray, csp.spmatrix))
def _cupy_module(x: Any) -> Any:
    return cupy


@nonfinite_lookup.register(cupy.ndarray)
def _nonfinite_device(vals: cupy.ndarray) -> int | None:
    """The device half of :func:`mgpu.backends.finite.first_nonfinite`: one round trip."""
    bad = ~cupy.isfinite(vals)
    if not bool(bad.any()):
        return None
    return int(cupy.argmax(bad.ravel()))


@all_finite_lookup.register(cupy.ndarray)
def _all_finite_device(X: cupy.ndarray) -> cupy.ndarray:
    return cupy.isfinite(X).all()  # a 0-d device array: no round trip


_ROWS = "rows.cu"
_ROWS_INSTANCES = INSTANCES[_ROWS]
_WARPS_PER_BLOCK = 8


def row_norms_is_usable_for(X: csp.csr_matrix) -> bool:
    """Whether the warp-per-row kernel takes this matrix (dtypes it is instantiated for)."""
    return (
        X.format == "csr"
        and X.dtype.name in ("float32", "float64")
        and X.indptr.dtype.name in ("int32", "int64")
    )


def row_reduce_csr_kernel(X: csp.csr_matrix, op: int) -> cupy.ndarray:
    """Per-row reduction by the ``mgpu_row_norms_warp`` kernel (one warp per row)."""
    n = X.shape[0]
    out = cupy.empty(n, dtype=X.dtype)
    if n == 0:
        return out
    fn = get_function(
        _ROWS,
        f"mgpu_row_norms_warp<{c_type(X.dtype)}, {c_type(X.indptr.dtype)}, {op}>",
        _ROWS_INSTANCES,
    )
    max_blocks = current_facts().sms * 32
    blocks = int(min(max_blocks, -(-n // _WARPS_PER_BLOCK)))
    fn((blocks,), (32 * _WARPS_PER_BLOCK,), (X.indptr, X.data, cupy.int64(n), out))
    return out


def row_reduce_csr_fallback(X: csp.csr_matrix, op: int) -> cupy.ndarray:
    """The same reduction through cupyx's own sparse routines (any dtype), in float64."""
    X64 = X.astype(cupy.float64)
    if op == ROW_SUM:
        r = X64.sum(axis=1)
    elif op == ROW_ABS_SUM:
        r = abs(X64).sum(axis=1)
    elif op == ROW_SQ_SUM:
        r = X64.multiply(X64).sum(axis=1)
    else:
        r = abs(X64).max(axis=1).toarray()
    return cupy.asarray(r).ravel().astype(X.dtype, copy=False)


@row_norms_lookup.register(csp.spmatrix)
def _row_reduce_sparse(X, op: int):
    X = X.tocsr()
    if row_norms_is_usable_for(X):
        return row_reduce_csr_kernel(X, op)
    return row_reduce_csr_fallback(X, op)


@row_norms_lookup.register(cupy.ndarray)
def _row_reduce_dense(X, op: int):
    return dense_row_reduce(X, op, cupy)


_SDDMM = "sddmm.cu"
_SDDMM_THREADS = 256
_GATHER_BYTES = 1 << 28  # working memory of the gather-dot fallback per pass
_TUNE_REPEATS = 3
# Most device memory the tiled layout of S takes while it is built, per nonzero: its int64
# temporaries and the sort's scratch (as CuPy's pool counts them, tests/test_memory.py;
# 128 leaves room for the pool's rounding). Where it does not fit
# beside the product, S runs by the CSR kernel, which needs none.
LAYOUT_BYTES_PER_NZ = 128


@dataclass(frozen=True)
class DeviceFacts:
    """What the SDDMM model and the launch sizes read from the device (once per device:
    ``Device.attributes`` queries every attribute each time it is read)."""

    name: str
    sms: int
    threads_per_sm: int  # resident threads an SM holds
    l2_bytes: int
    smem_bytes: int  # shared memory a tile may take: a quarter of an SM's, within a block's
    smem_optin: int = 0  # the most a block may take when the kernel opts in (SpGEMM's tables)


@functools.lru_cache(maxsize=None)
def device_facts(device_id: int) -> DeviceFacts:
    dev = cupy.cuda.Device(device_id)
    attrs = dev.attributes
    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    per_sm = attrs.get("MaxSharedMemoryPerMultiprocessor", 0) or attrs["MaxSharedMemoryPerBlock"]
    smem = min(attrs["MaxSharedMemoryPerBlock"], max(16 * 1024, per_sm // 4))
    return DeviceFacts(name=name, sms=attrs["MultiProcessorCount"],
                       threads_per_sm=attrs["MaxThreadsPerMultiProcessor"],
                       l2_bytes=attrs["L2CacheSize"], smem_bytes=int(smem),
                       smem_optin=int(attrs.get("MaxSharedMemoryPerBlockOptin", 0)
                                      or attrs["MaxSharedMemoryPerBlock"]))


def current_facts() -> DeviceFacts:
    """:func:`device_facts` of the current device."""
    return device_facts(cupy.cuda.runtime.getDevice())


FLOATS = (np.dtype(np.float32), np.dtype(np.float64))  # the dtypes the kernels are built for
_INDEX_TYPES = (np.dtype(np.int32), np.dtype(np.int64))


def sddmm_is_usable_for(S: csp.csr_matrix, A: cupy.ndarray, B: cupy.ndarray) -> bool:
    """Whether the kernels take these operands (instantiated dtypes, C order)."""
    return (
        S.format == "csr"
        and S.dtype in FLOATS
        and S.dtype == A.dtype == B.dtype
        and S.indptr.dtype in _INDEX_TYPES
        and S.indices.dtype == S.indptr.dtype
        and A.flags.c_contiguous
        and B.flags.c_contiguous
        and A.shape[1] < 2**31
    )


def tiled_is_usable_for(S: csp.csr_matrix) -> bool:
    """Whether the tiled schemes take S: their int32 tile-local indices must hold it."""
    return max(S.nnz, *S.shape) < 2**31


def _vector_width(A: cupy.ndarray, B: cupy.ndarray) -> int:
    """Elements per 16-byte load when K and both base addresses allow it, else 1."""
    w = 16 // A.itemsize
    K = A.shape[1]
    aligned = A.data.ptr % 16 == 0 and B.data.ptr % 16 == 0
    return w if K % w == 0 and aligned and K else 1


def _lanes(vectors_per_row: int) -> int:
    """Lanes of a virtual warp: the power of two in [4, 32] nearest above the row's vectors."""
    v = 4
    while v < 32 and v < vectors_per_row:
        v *= 2
    return v


_SDDMM_INSTANCES = frozenset(INSTANCES[_SDDMM])


def _sddmm_function(expression: str):
    if expression not in _SDDMM_INSTANCES:
        raise ValueError(f"{expression!r} is not among the instantiations of {_SDDMM}")
    # compile only what is used: one module per instantiation
    return get_function(_SDDMM, expression, (expression,))


# mgpu_sddmm_csr's arguments (mgpu.backends.launch): indptr, indices, values, A, B, n_rows,
# nnz, K, hadamard, nz_per_warp, out, out_indices, out_indptr, product_blocks, the three
# arrays checked for the flag and their sizes, the flag
_CSR_SIGNATURE = "pppppqqiiipppqpqpqpqp"
_EXTRA_ITEMS = 8  # values a thread of the extra blocks looks at, at least


def run_csr(S: csp.csr_matrix, A: cupy.ndarray, B: cupy.ndarray, hadamard: bool,
            out: cupy.ndarray, out_indices: cupy.ndarray | None = None,
            out_indptr: cupy.ndarray | None = None, checked: tuple[cupy.ndarray, ...] = (),
            flag: Flag | None = None, product: bool = True) -> None:
    """``out`` (S's nonzeros, CSR order) by the virtual-warp kernel straight on CSR, in one
    launch (:mod:`mgpu.backends.launch`). With ``out_indices`` and ``out_indptr`` (S's
    sizes and index dtype) the launch also copies S's index arrays into them; with
    ``flag``, it checks every value of the (at most three, C-ordered, of the product's
    dtype) ``checked`` arrays for NaN and infinity and raises the flag on a find: blocks
    past the product's do both. Without ``product`` the launch does only those (``out`` is
    not written): the copies and the check beside a tiled scheme's product.

    The launch's sizes and kernel (:func:`_csr_recipe`) are looked up by one key of the
    call's sizes, dtypes and alignment: a small call's launch is bound by the host."""
    nnz = int(S.nnz)
    a, b = A.data.ptr, B.data.ptr
    sizes = [c.size for c in checked] + [0] * (3 - len(checked))
    key = (cupy.cuda.runtime.getDevice(), S.shape[0], nnz, A.shape[1], A.dtype.char,
           S.indptr.dtype.char, not (a | b) & 15, out_indices is None, out_indptr is None,
           flag is None, product, *sizes)
    recipe = _CSR_RECIPES.get(key)
    if recipe is None:
        recipe = _csr_recipe(S, A, B, out_indices is not None, out_indptr is not None,
                             sizes if flag is not None else [0, 0, 0], product)
        if len(_CSR_RECIPES) >= _CSR_RECIPES_MAX:
            _CSR_RECIPES.clear()
        _CSR_RECIPES[key] = recipe
    launch, grid, nz_per_warp, blocks = recipe
    if not grid:
        return
    ptrs = [c.data.ptr for c in checked] + [0] * (3 - len(checked))
    launch(grid, _CSR_BLOCK, (
        S.indptr.data.ptr, S.indices.data.ptr, S.data.data.ptr, a, b, S.shape[0], nnz,
        A.shape[1], 1 if hadamard else 0, nz_per_warp, out.data.ptr, address(out_indices),
        address(out_indptr), blocks, ptrs[0], sizes[0], ptrs[1], sizes[1], ptrs[2], sizes[2],
        0 if flag is None else flag.addr))


# run_csr's launches by (device, rows, nonzeros, K, dtypes, alignment, what is written and
# checked, the checked arrays' sizes): (launcher, grid, nonzeros per warp, product blocks)
_CSR_RECIPES: dict[tuple, tuple] = {}
_CSR_RECIPES_MAX = 1 << 12
_CSR_BLOCK = (_SDDMM_THREADS,)


def _csr_recipe(S: csp.csr_matrix, A: cupy.ndarray, B: cupy.ndarray, indices: bool,
                indptr: bool, sizes: list[int], product: bool) -> tuple:
    """(launcher, grid, nonzeros per warp, product blocks) of a :func:`run_csr` launch;
    ``sizes``: the checked arrays' (zeros without a flag)."""
    return csr_recipe(S.shape[0], int(S.nnz), A.shape[1], A.dtype, S.indptr.dtype,
                      _vector_width(A, B), indices, indptr, sizes, product)


def csr_recipe(n_rows: int, nnz: int, K: int, dtype: Any, index_dtype: Any, W: int,
               indices: bool, indptr: bool, sizes: list[int], product: bool) -> tuple:
    """:func:`_csr_recipe` by the sizes alone: ``W`` elements per load (1, or 16 bytes' worth
    for factors whose rows and base addresses allow it, :func:`_vector_width`)."""
    V = _lanes(K // W)
    nz_per_warp, blocks = _csr_launch(nnz, V) if nnz and product else (1, 0)
    work = (n_rows + 1 if indptr else 0) + sum(sizes) + (nnz if indices else 0)
    # as many blocks as kernels/flags.cu's launch would take, past the product's
    extra = min(-(-work // (_SDDMM_THREADS * _EXTRA_ITEMS)), 8 * current_facts().sms)
    expr = f"mgpu_sddmm_csr<{c_type(dtype)}, {c_type(index_dtype)}, {W}, {V}>"
    launch = launcher(_SDDMM, expr, (expr,), _CSR_SIGNATURE, _SDDMM_INSTANCES)
    return launch, ((blocks + extra,) if blocks + extra else ()), nz_per_warp, blocks


def _csr_launch(nnz: int, V: int) -> tuple[int, int]:
    """(nonzeros per warp, blocks) for the virtual-warp kernels: every SM filled twice over,
    then runs of at most 512 nonzeros, a whole number of the warp's steps."""
    per_step = (32 // V) * 4  # nonzeros a warp has in flight
    facts = current_facts()
    want_warps = facts.sms * 64 * 2
    nz_per_warp = max(per_step, min(512, -(-nnz // want_warps)))
    nz_per_warp = -(-nz_per_warp // per_step) * per_step
    warps = -(-nnz // nz_per_warp)
    return nz_per_warp, -(-warps * 32 // _SDDMM_THREADS)


def gather_rows(S: csp.csr_matrix, B: cupy.ndarray, out: cupy.ndarray) -> None:
    """The benchmark's gather probe (kernels/probe.cu): B's row per nonzero, nothing else."""
    nnz = int(S.nnz)
    if not nnz:
        return
    W = _vector_width(B, B)
    V = _lanes(B.shape[1] // W)
    nz_per_warp, blocks = _csr_launch(nnz, V)
    expr = f"mgpu_gather_rows<{c_type(B.dtype)}, {c_type(S.indices.dtype)}, {W}, {V}>"
    fn = get_function("probe.cu", expr, (expr,) if expr in INSTANCES["probe.cu"] else ())
    fn((blocks,), (_SDDMM_THREADS,), (S.indices, B, cupy.int64(nnz), cupy.int32(B.shape[1]),
                                      cupy.int32(nz_per_warp), out))


def run_tiled(S: csp.csr_matrix, A: cupy.ndarray, B: cupy.ndarray, hadamard: bool,
              layout: TileLayout, scheme: str, Tk: int, out: cupy.ndarray) -> None:
    """``out`` (CSR order) by the SM-L2 or SM-SM kernel on S's tiled layout."""
    if not layout.n_tiles:
        return
    K = A.shape[1]
    W = _vector_width(A, B)
    tk = min(Tk, -(-K // W) * W)  # a slice never wider than K
    V = _lanes(tk // W)
    stage_b = scheme == "sm-sm"
    rows = layout.ti + (layout.Tj if stage_b else 0)
    smem = rows * tk * A.itemsize
    limit = current_facts().smem_bytes
    if smem > limit:
        raise ValueError(f"{scheme} tile of {rows} rows × {tk} needs {smem} bytes of shared "
                         f"memory; this device gives a block {limit}")
    partial = cupy.empty(S.nnz, dtype=A.dtype) if tk < K else out  # unused with one slice
    expr = f"mgpu_sddmm_tiled<{c_type(A.dtype)}, {W}, {V}, {'true' if stage_b else 'false'}>"
    # packed by mgpu.backends.launch, as run_csr's launch: not CuPy's per-argument wrapping
    launch = launcher(_SDDMM, expr, (expr,), _TILED_SIGNATURE, _SDDMM_INSTANCES)
    launch((layout.n_tiles,), (_SDDMM_THREADS,), (
        layout.tile_start.data.ptr, layout.tile_row0.data.ptr, layout.tile_panel.data.ptr,
        layout.active_rows.data.ptr, layout.local_row.data.ptr, layout.local_col.data.ptr,
        address(layout.perm),  # null: CSR order
        S.data.data.ptr, A.data.ptr, B.data.ptr, int(S.shape[1]), K, int(layout.Tj), tk,
        1 if hadamard else 0, partial.data.ptr, out.data.ptr,
    ), shared_mem=smem)


# mgpu_sddmm_tiled's arguments: the layout's six arrays and perm, S's values, A, B, n_cols,
# K, Tj, Tk, hadamard, partial, out
_TILED_SIGNATURE = "ppppppppppqiiiipp"


# Per-call products (no plan) whose tuned scheme is the CSR kernel, by (device, shape, nnz,
# K, dtype): the tuned choice of a shape class never changes once made, and the CSR kernel
# needs no layout and no memory beyond the product, so these calls skip planning (the
# tuner's lookup and the device memory query that decides whether a tiled layout would
# fit). A tiled choice is planned on every call, its layout built then.
_CSR_CALLS: set[tuple] = set()
_CSR_CALLS_MAX = 1 << 12


def call_plan(S: csp.csr_matrix, A: cupy.ndarray, B: cupy.ndarray) -> SDDMMPlan | None:
    """How a call without a plan runs: None for the CSR kernel, else the tuned plan of S's
    shape class for a per-call layout (:func:`plan_sddmm` with ``reuse=False``)."""
    key = (cupy.cuda.runtime.getDevice(), S.shape, int(S.nnz), A.shape[1], A.dtype.char)
    if key in _CSR_CALLS:
        return None
    plan = plan_sddmm(S, A.shape[1], A.dtype, reuse=False, factors=(A, B))
    if plan.scheme != "csr":
        return plan
    if len(_CSR_CALLS) >= _CSR_CALLS_MAX:
        _CSR_CALLS.clear()
    _CSR_CALLS.add(key)
    return None


def launch_sddmm(S: csp.csr_matrix, A: cupy.ndarray, B: cupy.ndarray, hadamard: bool,
                 plan: SDDMMPlan | None, out: cupy.ndarray) -> None:
    """Queue the product into ``out`` (S's nonzeros, CSR order) by the plan's kernel (the
    CSR kernel when ``plan`` is None; a plan without a layout builds it first)."""
    if not S.nnz:
        return
    if plan is None or plan.scheme == "csr":
        run_csr(S, A, B, hadamard, out)
        return
    layout = plan.layout
    if layout is None:
        layout = tile_layout(S.indptr, S.indices, S.shape, plan.Tj, plan.ti)
    run_tiled(S, A, B, hadamard, layout, plan.scheme, plan.Tk, out)


def sddmm_kernel(S: csp.csr_matrix, A: cupy.ndarray, B: cupy.ndarray, hadamard: bool,
                 plan: SDDMMPlan | None = None, flag: Flag | None = None) -> csp.csr_matrix:
    """P = S ∘ (A Bᵀ) by the plan's kernel (the tuned plan for S's shape class if None).

    With ``flag``, every value of A and B (and of S with ``hadamard``) is checked for NaN
    and infinity; nothing waits here. By the CSR kernel, the whole call is one launch: the
    product, P's index arrays and the check (:func:`run_csr`), into one allocation
    (:func:`csr_output`). By a tiled scheme, the index arrays and the check are one launch
    after the product's (:func:`run_csr` without the product).
    """
    if plan is None and S.nnz:
        plan = call_plan(S, A, B)
    if plan is None or plan.scheme == "csr":
        values, indices, indptr = csr_output(S, A.dtype)
        run_csr(S, A, B, hadamard, values, indices, indptr,
                (A, B, S.data) if hadamard else (A, B), flag)
        return csr_of(S, values, indices, indptr)  # made while the device works
    values, indices, indptr = csr_output(S, A.dtype)
    launch_sddmm(S, A, B, hadamard, plan, values)
    run_csr(S, A, B, hadamard, values, indices, indptr,
            (A, B, S.data) if hadamard else (A, B), flag, product=False)
    return csr_of(S, values, indices, indptr)


def csr_output(S: csp.csr_matrix, dtype: Any) -> tuple[cupy.ndarray, cupy.ndarray,
                                                       cupy.ndarray]:
    """Uninitialised arrays for a product on S's pattern: values (S's nonzeros, ``dtype``),
    indices and indptr (S's sizes and index dtype), views of one allocation of the memory
    pool (one request instead of three; each array starts on a 16-byte boundary)."""
    nnz, rows, it, dt = int(S.nnz), S.shape[0], S.indptr.dtype, np.dtype(dtype)
    at_indices = -(-nnz * dt.itemsize // 16) * 16
    at_indptr = at_indices + -(-nnz * it.itemsize // 16) * 16
    mem = cupy.cuda.alloc(at_indptr + (rows + 1) * it.itemsize)
    return (cupy.ndarray((nnz,), dt, memptr=mem),
            cupy.ndarray((nnz,), it, memptr=mem + at_indices),
            cupy.ndarray((rows + 1,), it, memptr=mem + at_indptr))


def csr_of(S: csp.csr_matrix, values: cupy.ndarray, indices: cupy.ndarray,
           indptr: cupy.ndarray) -> csp.csr_matrix:
    """A CSR matrix of S's shape holding the given arrays (S's pattern, in P's own arrays).

    A shallow copy of S handed the arrays: cupyx's constructor from a ``(data, indices,
    indptr)`` triple reads indptr's ends back from the device, a wait on every call, and
    even from S it converts and checks each array and makes a cuSPARSE descriptor (some
    microseconds of a small call); the copy shares S's descriptor (a general matrix,
    zero-based: never changed) and what S knows of its pattern (sorted, no duplicates),
    which is P's pattern too."""
    # what copy.copy does for a cupyx matrix (no __copy__, __reduce__ or __slots__ there),
    # without its protocol look-ups: a new object of S's class holding S's attributes
    P = object.__new__(type(S))
    state = P.__dict__
    state.update(S.__dict__)
    state["data"], state["indices"], state["indptr"] = values, indices, indptr
    return P


def with_values(S: csp.csr_matrix, values: cupy.ndarray) -> csp.csr_matrix:
    """A CSR matrix of S's pattern, with its own copies of S's index arrays, holding
    ``values`` (the tiled schemes' and the fallback's output; the CSR kernel writes the
    copies itself).

    The copies are two ``cudaMemcpyAsync`` into one new allocation (``indices`` and
    ``indptr`` are views of it), not two copy kernels of two allocations.
    """
    idx, ptr = S.indices, S.indptr
    if idx.dtype == ptr.dtype and idx.flags.c_contiguous and ptr.flags.c_contiguous:
        both = cupy.empty(idx.size + ptr.size, dtype=idx.dtype)
        indices, indptr = both[:idx.size], both[idx.size:]
        stream = cupy.cuda.get_current_stream()
        for dst, src in ((indices, idx), (indptr, ptr)):
            if src.size:
                dst.data.copy_from_device_async(src.data, src.nbytes, stream)
    else:
        indices, indptr = idx.copy(), ptr.copy()
    return csr_of(S, values, indices, indptr)


def sddmm_fallback(S: csp.csr_matrix, A: cupy.ndarray, B: cupy.ndarray,
                   hadamard: bool) -> csp.csr_matrix:
    """The same product as a CuPy gather-dot, in passes bounded by working memory."""
    nnz = int(S.nnz)
    out = cupy.empty(nnz, dtype=A.dtype)
    rows = cupy.repeat(cupy.arange(S.shape[0], dtype=cupy.int64),
                       cupy.diff(S.indptr).astype(cupy.int64))
    step = max(1, _GATHER_BYTES // max(1, 2 * A.shape[1] * A.itemsize))
    for s in range(0, nnz, step):
        r, c = rows[s:s + step], S.indices[s:s + step]
        out[s:s + step] = (A[r] * B[c]).sum(axis=1)
    if hadamard:
        out *= S.data.astype(out.dtype, copy=False)
    return with_values(S, out)


# ------------------------------------------------------------------------------- the tuner

# (device, dtype, K, scheme family, log2 density, log2 nnz, reuse) -> chosen candidate
_TUNED: dict[tuple, Candidate] = {}
_tune_lock = threading.Lock()


def _shape_class(facts: DeviceFacts, S: csp.csr_matrix, K: int, dtype: np.dtype,
                 reuse: bool) -> tuple:
    m, n = S.shape
    density = S.nnz / (m * n)
    return (facts.name, np.dtype(dtype).str, K, density > SM_SM_DENSITY,
            round(math.log2(density)), round(math.log2(S.nnz)), reuse)


def _median_ms(fn) -> float:
    return 1e3 * time_gpu(fn, repeats=_TUNE_REPEATS, warmup=1)


def _measure(S: csp.csr_matrix, K: int, dtype: np.dtype, cands: list[Candidate],
             reuse: bool, factors: tuple[cupy.ndarray, cupy.ndarray] | None = None
             ) -> dict[Candidate, float]:
    """Median milliseconds of each candidate on S (layout included unless ``reuse``), with
    the caller's factors, or random ones (a second copy of A and B) without them."""
    if factors is not None:
        A, B = factors
    else:
        rng = cupy.random.default_rng(0)
        A = rng.standard_normal((S.shape[0], K), dtype=dtype)
        B = rng.standard_normal((S.shape[1], K), dtype=dtype)
    Sd = S if S.dtype == dtype else S.astype(dtype)
    out = cupy.empty(int(S.nnz), dtype=dtype)
    times = {}
    for c in cands:
        if c.scheme == "csr":
            times[c] = _median_ms(lambda: run_csr(Sd, A, B, True, out))
            continue
        if reuse:
            lay = tile_layout(Sd.indptr, Sd.indices, Sd.shape, c.Tj, c.ti)
            times[c] = _median_ms(lambda: run_tiled(Sd, A, B, True, lay, c.scheme, c.Tk, out))
        else:
            def call(c=c):
                lay = tile_layout(Sd.indptr, Sd.indices, Sd.shape, c.Tj, c.ti)
                run_tiled(Sd, A, B, True, lay, c.scheme, c.Tk, out)
            times[c] = _median_ms(call)
    return times


def plan_sddmm(S: csp.csr_matrix, K: int, dtype: Any, *, reuse: bool,
               force: str | None = None,
               factors: tuple[cupy.ndarray, cupy.ndarray] | None = None) -> SDDMMPlan:
    """The plan for S on the current device: the tuned candidate of its shape class.

    ``reuse`` says whether the tiled layout is built once and kept (a plan handed back to
    :func:`mgpu.sddmm`) or built on every call; the tuner times what will be paid. ``force``
    (a scheme name) skips the tuner and takes that scheme's first candidate. ``factors``
    (A, B of this K and dtype) are timed with instead of random ones. Where the device
    cannot hold the tiled layout (:data:`LAYOUT_BYTES_PER_NZ`) beside the product, the CSR
    kernel is the only candidate.
    """
    dtype = np.dtype(dtype)
    facts = current_facts()
    cands = candidates(S.shape, int(S.nnz), K, dtype.itemsize, facts.l2_bytes, facts.smem_bytes)
    if not tiled_is_usable_for(S) or not layout_fits(S, K, dtype, factors is None):
        if force not in (None, "csr"):
            raise ValueError(f"scheme {force!r} needs the tiled layout of S, which does not fit "
                             "in this device's memory beside the product; use 'csr'.")
        cands = cands[:1]
    timings: dict[str, float] = {}
    if force is not None:
        pick = [c for c in cands if c.scheme == force]
        if not pick:
            raise ValueError(f"scheme {force!r} does not apply to this input; candidates: "
                             + ", ".join(sorted({c.scheme for c in cands})))
        choice = pick[0]
    elif len(cands) == 1 or S.nnz == 0:
        choice = cands[0]
    else:
        key = _shape_class(facts, S, K, dtype, reuse)
        with _tune_lock:
            cached = _TUNED.get(key)
            if cached is not None:
                # the same class on another S: take the tuned Tk and scheme, this S's sizes
                choice = next((c for c in cands if (c.scheme, c.Tk) == (cached.scheme, cached.Tk)),
                              cands[0])
            else:
                measured = _measure(S, K, dtype, cands, reuse, factors)
                choice = min(measured, key=measured.get)
                _TUNED[key] = choice
                timings = {c.label: t for c, t in measured.items()}
                logger.info("sddmm tuned for %s: %s (%s)", key, choice.label,
                            ", ".join(f"{k} {v:.3f} ms" for k, v in timings.items()))
    tk = min(choice.Tk, max(K, 1))
    W = 16 // dtype.itemsize if K and K % (16 // dtype.itemsize) == 0 else 1
    layout = None
    if choice.scheme != "csr" and reuse and S.nnz:
        layout = tile_layout(S.indptr, S.indices, S.shape, choice.Tj, choice.ti)
    return SDDMMPlan(
        scheme=choice.scheme, device=facts.name, shape=tuple(S.shape), nnz=int(S.nnz), K=K,
        dtype=dtype.name, Tj=choice.Tj, Tk=choice.Tk, ti=choice.ti,
        lanes=_lanes(max(1, (K if choice.scheme == "csr" else tk) // W)), vector=W,
        n_panels=max(1, -(-S.shape[1] // max(choice.Tj, 1))), l2_bytes=facts.l2_bytes,
        smem_bytes=facts.smem_bytes, timings_ms=timings, layout=layout,
        pattern=pattern_key(S),
    )


def product_bytes(S: csp.csr_matrix, dtype: Any) -> int:
    """Device bytes of an SDDMM result on S's pattern: its values and its own index arrays."""
    return int(S.nnz) * (np.dtype(dtype).itemsize + S.indices.itemsize) + S.indptr.nbytes


def layout_fits(S: csp.csr_matrix, K: int, dtype: Any, random_factors: bool) -> bool:
    """Whether the device holds the tiled layout's build, the tuner's output (and random
    factors, when there are no real ones to time with) beside the product."""
    need = 2 * product_bytes(S, dtype) + LAYOUT_BYTES_PER_NZ * int(S.nnz)
    if random_factors:
        need += (S.shape[0] + S.shape[1]) * K * np.dtype(dtype).itemsize
    return need <= gpu_available()[0]


def _require_product(S: csp.csr_matrix, A: cupy.ndarray, usable: bool) -> None:
    """Refuse a product the device cannot hold (asked of the device only when it is not
    small: :func:`mgpu.backends.memory.require_gpu_unless_small`)."""
    need = product_bytes(S, A.dtype)
    if not usable:  # the gather-dot's passes
        need += min(int(S.nnz), max(1, _GATHER_BYTES // max(1, 2 * A.shape[1] * A.itemsize))) \
            * 2 * A.shape[1] * A.itemsize + int(S.nnz) * 8
    require_gpu_unless_small(
        need, lambda: f"SDDMM of a {S.shape[0]}×{S.shape[1]} S with {int(S.nnz):,} nonzeros "
        f"and K={A.shape[1]} ({np.dtype(A.dtype).name})",
        "Pass host (numpy/scipy) operands with device='gpu' to stream them through the GPU "
        "in tiles (mgpu.sddmm), or cut S over several GPUs (mgpu.distributed).")


@sddmm_lookup.register(csp.spmatrix)
def _sddmm_sparse(S, A, B, hadamard: bool, plan: SDDMMPlan | None = None):
    usable = sddmm_is_usable_for(S, A, B)
    _require_product(S, A, usable)
    if usable:
        return sddmm_kernel(S, A, B, hadamard, plan)
    return sddmm_fallback(S, A, B, hadamard)


@sddmm_flagged_lookup.register(csp.spmatrix)
def sddmm_flagged(S: csp.csr_matrix, A: cupy.ndarray, B: cupy.ndarray, hadamard: bool,
                  plan: SDDMMPlan | None = None) -> tuple[csp.csr_matrix, bool | None]:
    """The checked product on the GPU: P, and whether NaN or infinity was found among the
    values of A and B (and of S with ``hadamard``), every one of them whatever S's pattern
    touches, read from the call's flag (:mod:`mgpu.backends.flags`) after its one wait for
    the stream. ``None`` in its place for operands the kernels do not take (the gather-dot
    fallback checks nothing, and is not waited for)."""
    usable = sddmm_is_usable_for(S, A, B)
    _require_product(S, A, usable)
    if not usable:
        return sddmm_fallback(S, A, B, hadamard), None
    with device_flag() as flag:
        P = sddmm_kernel(S, A, B, hadamard, plan, flag)
        return P, flag.raised()


_JACCARD = "jaccard.cu"


@jaccard_lookup.register(csp.spmatrix)
def _jaccard_gpu(G, weighted: bool, r0: int, r1: int) -> cupy.ndarray:
    """Jaccard weights of the edges of rows r0..r1 of a checked cupyx graph (one thread per
    edge, ``kernels/jaccard.cu``), in G's dtype."""
    if (r0, r1) == (0, G.shape[0]):
        lo, hi = 0, int(G.nnz)  # the whole graph: no wait for its row pointers
    else:
        lo, hi = (int(v) for v in G.indptr[cupy.asarray([r0, r1])].get())
    require_gpu((hi - lo) * (G.dtype.itemsize + G.indices.itemsize) + G.indptr.nbytes,
                f"Jaccard weights of {hi - lo:,} edges", "Cut the graph over several GPUs "
                "(mgpu.jaccard with a cluster).")
    out = cupy.empty(hi - lo, dtype=G.dtype)
    if hi > lo:
        fn = get_function(_JACCARD, f"mgpu_jaccard<{c_type(G.dtype)}, "
                          f"{'true' if weighted else 'false'}>", INSTANCES[_JACCARD])
        sms = current_facts().sms
        blocks = int(min(sms * 32, -(-(hi - lo) // 256)))
        fn((blocks,), (256,), (G.indptr, G.indices, G.data, np.int32(r0), np.int32(r1), out))
    return out
