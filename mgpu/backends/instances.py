"""The explicit list of kernel instantiations, per source file in ``kernels/``.

Kept apart from the CuPy backend so that it can be read (and every entry compiled by nvcc
as a check) on a machine without CuPy.
"""
from __future__ import annotations

from mgpu.backends.knn_codes import UNION_OPS, KnnOp
from mgpu.backends.numpy import ROW_ABS_MAX, ROW_ABS_SUM, ROW_SQ_SUM, ROW_SUM

_FLOATS = ("float", "double")
_INDICES = ("int", "long long")
_VECTOR = {"float": 4, "double": 2}
_LANES = (4, 8, 16, 32)

# kNN, compiled in groups (an accumulated operation of kernels/knn.cu's KnnOp and a dtype)
# so that a metric builds only its own kernels. Index pointers are int: cupyx CSR is 32-bit.
# (queries per lane, list length): lists of 16 for k <= 16, of 128 for k <= 128 (one query
# per lane, to bound local memory), 0 for the dense-tile form (pairwise distances, larger k)
KNN_OPS = tuple(int(op) for op in KnnOp)
KNN_SHAPES = ((4, 16), (1, 128), (4, 0))
KNN_SELECT = (16, 128)
# merge-path SpMV/SpMM (kernels/spmv.cu): merge items (rows + nonzeros) per thread of an SpMV
# tile (128 threads; odd, so that the threads' strided reads of the tile in shared memory
# fall in different banks) and per SpMM piece
SPMV_ITEMS = (3, 5)
SPMM_ITEMS = (8, 16)
# SpGEMM (kernels/spgemm.cu): the (threads per row, hash slots) of the shared-memory tables.
# Symbolic pass (keys only): a row goes to the first table with at least min(products,
# columns of B) slots. Numeric pass (keys and values): to the first with at least twice the
# row's exact count, so that probes stay short. Tables of more than 48 KiB live in dynamic
# shared memory (spgemm_dynamic), where the device allows that much a block; longer rows use
# tables in global memory.
SPGEMM_SYMBOLIC = ((32, 512), (256, 2048), (256, 8192), (1024, 32768))
SPGEMM_NUMERIC = ((32, 64), (32, 128), (32, 256), (256, 512), (256, 1024), (256, 2048),
                  (256, 4096), (1024, 8192), (1024, 16384))
# A row is binned by at least its products / this ratio (symbolic, numeric), so that a row of
# many products goes to a group of more threads (at most ratio × slots / threads products a
# thread), and past the largest table to the global ones, which the whole grid shares.
SPGEMM_RATIO = (16, 32)


def spgemm_dynamic(table: int, numeric: bool) -> bool:
    """Whether the SpGEMM table of ``table`` slots is instantiated in dynamic shared memory
    (more than 48 KiB in float64)."""
    return table * (12 if numeric else 4) >= 48 * 1024


def spgemm_shared(t: str, group: int, table: int, numeric: bool) -> str:
    """The name expression of the shared-memory SpGEMM kernel of that table."""
    dyn = "true" if spgemm_dynamic(table, numeric) else "false"
    return f"mgpu_spgemm_shared<{t}, {group}, {table}, {'true' if numeric else 'false'}, {dyn}>"


SPGEMM_RUN = 8  # products per thread of the masked product (one search, then a walk)
SPGEMM_CLOSE_RUN = 8  # places per thread of the closing copy (one search, then a walk)
# SGD (kernels/sgd.cu): factor elements per lane, so k <= 32 * the largest
SGD_KPL = (1, 2, 4, 8)
# ratings in flight per warp of the wavefront kernel (its ring of D slots in shared memory);
# a (T, KPL) takes the depths whose slots hold at most 128 bytes of factors per lane (8 KiB a
# warp: the shared memory then never holds fewer blocks an SM than the registers do)
WAVE_DEPTHS = (2, 4, 8)
_WAVE_SLOT_BYTES = 128
# mgpu bench sgd --depths, Netflix's shape, k = 128, H100: 1.80 G updates/s at 8, 1.70 at 4
WAVE_DEFAULT_DEPTH = 8


def wave_depths(t: str, kpl: int) -> tuple[int, ...]:
    """The ring depths instantiated for factors of C type ``t`` and ``kpl`` per lane."""
    size = 8 if t == "double" else 4
    return tuple(d for d in WAVE_DEPTHS if d * kpl * size <= _WAVE_SLOT_BYTES) or WAVE_DEPTHS[:1]


def wave_default_depth(t: str, kpl: int) -> int:
    """The ring depth a wavefront launch takes unless told: :data:`WAVE_DEFAULT_DEPTH` where
    it is instantiated for (``t``, ``kpl``), else the deepest that is."""
    depths = wave_depths(t, kpl)
    return WAVE_DEFAULT_DEPTH if WAVE_DEFAULT_DEPTH in depths else depths[-1]


def wave_kernel(t: str, kpl: int, depth: int | None = None) -> str:
    """The wavefront kernel's name expression for factors of C type ``t``, ``kpl`` per lane
    and ``depth`` ratings in flight per warp (default :func:`wave_default_depth`), or
    ValueError naming the depths there are.

    >>> wave_kernel("float", 4), wave_kernel("float", 8), wave_kernel("double", 8)
    ('mgpu_sgd_wave<float, 4, 8>', 'mgpu_sgd_wave<float, 8, 4>', 'mgpu_sgd_wave<double, 8, 2>')
    >>> wave_kernel("double", 8, 4)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: The 'depth' parameter of the wavefront SGD kernel must be one of [2] for ...
    """
    depths = wave_depths(t, kpl)
    if depth is None:
        depth = wave_default_depth(t, kpl)
    if depth not in depths:
        raise ValueError(f"The 'depth' parameter of the wavefront SGD kernel must be one of "
                         f"{list(depths)} for {t} factors of {kpl} per lane. Got {depth!r} "
                         "instead.")
    return f"mgpu_sgd_wave<{t}, {kpl}, {depth}>"


KNN_GROUPS: dict[str, tuple[str, ...]] = {
    **{f"op{op}-{t}": tuple(f"mgpu_knn_csr<{t}, int, {op}, {m}, {kmax}>" for m, kmax in KNN_SHAPES)
       + ((f"mgpu_centred_stats<{t}>",) if op == KnnOp.CORRELATION else ())
       for op in KNN_OPS for t in _FLOATS},
    "select": tuple(f"mgpu_select_k<{t}, {kmax}>" for t in _FLOATS for kmax in KNN_SELECT)
    + tuple(f"mgpu_{f}<{t}>" for f in ("finish_tile", "query_block") for t in _FLOATS),
    # the dot-product metrics from the index's postings (cupy_knn_postings), lists as above
    "postings": tuple(f"mgpu_knn_postings<{t}, {kmax}>" for t in _FLOATS for kmax in KNN_SELECT)
    + ("mgpu_postings_count",) + tuple(f"mgpu_postings_fill<{t}>" for t in _FLOATS),
    # the benchmark's one-thread-per-pair union peer (NAMM operations)
    "naive": tuple(f"mgpu_union_naive<{t}, {int(op)}>" for t in _FLOATS
                   for op in sorted(UNION_OPS)),
}

INSTANCES: dict[str, tuple[str, ...]] = {
    # the proximity graph: its search (dense rows or CSR) and the links made back
    # (and its search of half rows: float queries and sums, rows as binary16 bits)
    "ann.cu": tuple(f"mgpu_ann_search<{t}, {s}>" for t in _FLOATS for s in ("false", "true"))
    + ("mgpu_ann_search<float, false, unsigned short>",)
    + tuple(f"mgpu_ann_link<{t}>" for t in _FLOATS)
    + tuple(f"mgpu_ann_search_heap<{t}>" for t in _FLOATS),
    "jaccard.cu": tuple(f"mgpu_jaccard<{t}, {w}>" for t in _FLOATS for w in ("false", "true")),
    "knn.cu": tuple(e for group in KNN_GROUPS.values() for e in group),
    "rows.cu": tuple(
        f"mgpu_row_norms_warp<{t}, {i}, {op}>"
        for t in _FLOATS
        for i in _INDICES
        for op in (ROW_SUM, ROW_ABS_SUM, ROW_SQ_SUM, ROW_ABS_MAX)
    ),
    # W: 1, or the elements of a 16-byte load; V: lanes per nonzero
    "sddmm.cu": tuple(
        f"mgpu_sddmm_csr<{t}, {i}, {w}, {v}>"
        for t in _FLOATS
        for i in _INDICES
        for w in (1, _VECTOR[t])
        for v in _LANES
    ) + tuple(
        f"mgpu_sddmm_tiled<{t}, {w}, {v}, {b}>"
        for t in _FLOATS
        for w in (1, _VECTOR[t])
        for v in _LANES
        for b in ("false", "true")
    ),
    # merge-path SpMV/SpMM: int32 indices only (cupyx CSR), carries added by the fix-ups
    "spmv.cu": tuple(f"mgpu_spmv_merge<{t}, {items}, {c}, {s}>" for t in _FLOATS
                     for items in SPMV_ITEMS for c in ("false", "true") for s in ("false", "true"))
    + tuple(f"mgpu_spmm_merge<{t}, {items}>" for t in _FLOATS for items in SPMM_ITEMS)
    + tuple(f"mgpu_carry_apply<{t}>" for t in _FLOATS)
    + ("mgpu_spmv_tile_search", "mgpu_spmv_carries", "mgpu_spmm_carries"),
    "spgemm.cu": tuple(spgemm_shared(t, g, n, False) for t in _FLOATS for g, n in SPGEMM_SYMBOLIC)
    + tuple(spgemm_shared(t, g, n, True) for t in _FLOATS for g, n in SPGEMM_NUMERIC)
    + tuple(f"mgpu_spgemm_global<{t}, {b}>" for t in _FLOATS for b in ("false", "true"))
    + tuple(f"mgpu_spgemm_global_{k}<{t}>" for k in ("gather", "rank") for t in _FLOATS)
    + tuple(f"mgpu_spgemm_dense<{t}, {b}>" for t in _FLOATS for b in ("false", "true"))
    + tuple(f"mgpu_spgemm_dense_place<{t}>" for t in _FLOATS)
    + ("mgpu_spgemm_dense_count", "mgpu_spgemm_row_cum")
    + tuple(f"mgpu_spgemm_masked<{t}, {SPGEMM_RUN}>" for t in _FLOATS)
    + tuple(f"mgpu_spgemm_scan_{k}<{b}>" for k in ("reduce", "apply") for b in ("false", "true"))
    + ("mgpu_spgemm_scan_partials",)
    + tuple(f"mgpu_spgemm_{k}<{t}>" for k in ("nonzeros", "compact") for t in _FLOATS)
    + tuple(f"mgpu_spgemm_close_up<{t}, {SPGEMM_CLOSE_RUN}>" for t in _FLOATS)
    + tuple(f"mgpu_spgemm_bin_{k}<{b}>" for k in ("count", "fill") for b in ("false", "true")),
    # the finiteness flag of the checked calls (mgpu.backends.flags)
    "flags.cu": tuple(f"mgpu_flag_{k}<{t}>" for k in ("nonfinite", "csr") for t in _FLOATS),
    # SGD block kernel of matrix factorisation: k <= 32 * KPL
    "sgd.cu": tuple(f"mgpu_sgd_block<{t}, {kpl}>" for t in _FLOATS for kpl in SGD_KPL)
    + tuple(f"mgpu_sgd_wave<{t}, {kpl}, {d}>" for t in _FLOATS for kpl in SGD_KPL
            for d in wave_depths(t, kpl)),
    # benchmark probe (float32 factors, as the SDDMM benchmark uses)
    "probe.cu": tuple(
        f"mgpu_gather_rows<float, {i}, {w}, {v}>" for i in _INDICES for w in (1, 4) for v in _LANES
    ),
}
