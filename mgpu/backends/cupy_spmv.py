"""GPU merge-path SpMV and SpMM (``kernels/spmv.cu``), registered on ``spmv_lookup``.

Imported lazily with the rest of the CuPy backend. The kernels take cupyx CSR (int32
indices) in float32 or float64 with x of the same dtype; anything else goes to cuSPARSE
through cupyx's own ``A @ x``, the tested fallback.
"""
from __future__ import annotations

import logging

import cupy
import cupyx.scipy.sparse as csp
import numpy as np

from mgpu.backends.cupy import FLOATS, current_facts
from mgpu.backends.dispatch import (
    spmv_flagged_lookup,
    spmv_lookup,
    spmv_plan_lookup,
    spmv_takes_as_is_lookup,
)
from mgpu.backends.flags import Flag, device_flag, flag_nonfinite
from mgpu.backends.instances import INSTANCES, SPMM_ITEMS, SPMV_ITEMS
from mgpu.backends.launch import address, launcher
from mgpu.backends.loader import c_type, get_function
from mgpu.backends.memory import require_gpu_unless_small
from mgpu.backends.spmv_plan import SpMVPlan

logger = logging.getLogger(__name__)

__all__ = ["merge_product", "plan_spmv", "spmm_merge", "spmv_fallback", "spmv_flagged",
           "spmv_is_usable_for", "spmv_items", "spmv_merge", "takes_as_is"]

_SPMV = "spmv.cu"
_TILE_THREADS = 128  # SpMV: threads of a tile's block (MGPU_SPMV_THREADS in kernels/spmv.cu)
_TILES_PER_SM = 16  # SpMV: its blocks resident on an SM (its launch bounds)
# SpMV launches of at most this many waves of tiles find their tiles' places in the tiles'
# own blocks (no search launch); beyond, the blocks' searches would idle the memory.
_SEARCH_WAVES = 8
_THREADS = 256  # the searches and carry passes (a multiple of 32: the carries shuffle in warps)
_SPMM_PIECES = 8  # SpMM: pieces per block, each a warp over 32 columns of X
_FULL_WAVES = 4  # below this many items per resident thread, smaller pieces pay off
# A plan leaves empty rows out of the merge when at least one row in this many is empty: a
# row's number in A then costs a read per non-empty row, an empty row a read and a write
# instead of a merge item (several times as long, on graphs with many empty rows).
_COMPACT_SHARE = 16
_INT32 = np.dtype(np.int32)


def spmv_is_usable_for(A: csp.csr_matrix, x: cupy.ndarray) -> bool:
    """Whether the merge-path kernels take these operands (dtypes they are instantiated for,
    32-bit indices, row-major x, int32 carry rows)."""
    return (
        A.format == "csr"
        and A.dtype in FLOATS
        and x.dtype == A.dtype
        and x.ndim in (1, 2)
        and x.flags.c_contiguous
        and A.indptr.dtype == _INT32
        and A.indices.dtype == _INT32
        and A.shape[0] < 2**31 - 1
    )


@spmv_takes_as_is_lookup.register((cupy.ndarray, csp.spmatrix))
def takes_as_is(A: object, x: object, ndim: int) -> bool:
    """Whether ``mgpu.spmv`` (``ndim`` 1) or ``mgpu.spmm`` (2) can hand A and x to the kernels
    with no conversion and no check but of their values: a cupyx CSR matrix and a cupy array
    of that many dimensions, x's rows A's columns, and :func:`spmv_is_usable_for`."""
    return (type(A) is csp.csr_matrix and type(x) is cupy.ndarray and x.ndim == ndim
            and x.shape[0] == A.shape[1] and spmv_is_usable_for(A, x))


def _pick(m: int, nnz: int, sizes: tuple[int, ...]) -> int:
    """The larger of ``sizes`` once the merge fills the device ``_FULL_WAVES`` times over with
    it, the smaller otherwise (more pieces, more threads)."""
    facts = current_facts()
    resident = facts.sms * facts.threads_per_sm
    small, large = min(sizes), max(sizes)
    return large if (m + nnz) >= _FULL_WAVES * resident * large else small


def spmv_items(m: int, nnz: int) -> int:
    """Merge items per thread of an SpMV tile (one of ``SPMV_ITEMS``)."""
    return _pick(m, nnz, SPMV_ITEMS)


def _function(expression: str):
    return get_function(_SPMV, expression, INSTANCES[_SPMV])


def _launcher(expression: str, signature: str):
    return launcher(_SPMV, expression, INSTANCES[_SPMV], signature)


def _blocks(n: int, threads: int = _THREADS) -> tuple[int]:
    return (max(1, -(-n // threads)),)


# launches of at most this many SpMV tiles add their carries in the merge launch itself
# (its last block: see kernels/spmv.cu); more go to the carry passes' own launches. Measured
# per checked call (H100): the last block's walk faster at 1,054 tiles (email-Enron, 0.063
# against 0.067 ms), the passes at 2,684 and 2,836 (Slashdot 0.067 against 0.072, Visium
# 0.063 against 0.070)
_FUSED_CARRIES = 2048
# the kernels' arguments (mgpu.backends.launch), in their order
_MERGE_SIGNATURE = "ppppqqpppppppqqp"  # indptr .. x, m, nnz, tile_row .. empty, n_empty, n_x, done
_CARRIES_SIGNATURE = "ppqq"
_APPLY_SIGNATURE = "ppqqqpp"
_SEARCH_SIGNATURE = "pqqqqp"
_done: dict[tuple[int, int], cupy.ndarray] = {}  # (device, stream) -> the merge's counter


def _done_counter() -> int:
    """The address of the current stream's counter of finished blocks (a zeroed device
    int, set back to 0 by the last block of each launch that uses it): launches on one
    stream run one after another, those of other streams count in their own. 0 (no
    counter: the carry passes' launches instead) while the stream is captured into a CUDA
    graph, and on a stream without one where none is made.

    Never in a capture, even where the stream has its counter from calls before it: a graph
    may be launched on any stream, so two replays at once, or a replay beside calls on the
    stream it was captured on, would count in the same counter and add wrong carries; and
    in a graph, where a launch costs about a microsecond, the passes' launches took less of
    the device's time than the last block's walk over the carries (``mgpu bench spmv``'s
    graph column, H100: 0.0164 against 0.0291 ms a call on Slashdot's 2,684 tiles)."""
    stream = cupy.cuda.get_current_stream()
    if stream.is_capturing():
        return 0
    key = (cupy.cuda.runtime.getDevice(), stream.ptr)
    counter = _done.get(key)
    if counter is None:
        # none past 256 streams (a launch may still hold one that would be freed): the
        # carry passes' launches then
        if len(_done) >= 256:
            return 0
        counter = cupy.zeros(1, dtype=cupy.uint32)
        stream.synchronize()  # zeroed before the first launch that reads it
        counter = _done.setdefault(key, counter)
    return counter.data.ptr


def _carries(n_pieces: int, k: int) -> tuple[object, int, int]:
    """One allocation for the carries of ``n_pieces`` pieces and ``k`` columns: the memory
    (to hold until the launches are queued) and the addresses of the rows (int32) and the
    values (double, 8-byte aligned)."""
    at_val = -(-4 * n_pieces // 16) * 16
    mem = cupy.cuda.alloc(at_val + 8 * n_pieces * k)
    return mem, mem.ptr, mem.ptr + at_val


def _add_carries(carry_row: int, carry_val: int, n_pieces: int, m: int, k: int,
                 out: cupy.ndarray, rows: cupy.ndarray | None = None) -> None:
    """The fix-up (at the addresses of the carries' rows and values): gather each cut
    row's carries at its first piece, in double (pass 1), then add the total to the row
    once (pass 2): to row ``rows[row]`` of ``out`` when the merge ran over a compacted A."""
    if k == 1 and out.ndim == 1:
        _launcher("mgpu_spmv_carries", _CARRIES_SIGNATURE)(
            _blocks(n_pieces), (_THREADS,), (carry_row, carry_val, n_pieces, m))
    else:
        _function("mgpu_spmm_carries")(_blocks(n_pieces * k), (_THREADS,), (
            np.uint64(carry_row), np.uint64(carry_val), cupy.int64(n_pieces), cupy.int64(m),
            cupy.int64(k)))
    _launcher(f"mgpu_carry_apply<{c_type(out.dtype)}>", _APPLY_SIGNATURE)(
        _blocks(n_pieces * k), (_THREADS,),
        (carry_row, carry_val, n_pieces, m, k, out.data.ptr, address(rows)))


def _tile_starts(indptr: cupy.ndarray, m: int, nnz: int, items: int) -> cupy.ndarray:
    """Rows of the merge consumed before each SpMV tile of ``128 * items`` items starts, and
    ``m`` after the last (``mgpu_spmv_tile_search``, a thread a tile)."""
    n_tiles = -(-(m + nnz) // (_TILE_THREADS * items))
    tile_row = cupy.empty(n_tiles + 1, dtype=cupy.int64)
    _launcher("mgpu_spmv_tile_search", _SEARCH_SIGNATURE)(
        _blocks(n_tiles + 1), (_THREADS,),
        (indptr.data.ptr, m, nnz, _TILE_THREADS * items, n_tiles, tile_row.data.ptr))
    return tile_row


@spmv_plan_lookup.register(csp.spmatrix)
def plan_spmv(A: csp.csr_matrix) -> SpMVPlan:
    """The GPU plan of :func:`mgpu.spmv_plan` for a cupyx CSR A with int32 indices: where
    every tile starts, found once; and, when at least one row in ``_COMPACT_SHARE`` is
    empty, A's non-empty rows compacted (their indptr and their numbers in A) and the list
    of its empty rows, for the kernel to zero."""
    m = int(A.shape[0])
    nnz = int(A.nnz)
    lengths = cupy.diff(A.indptr)
    n_empty = int(cupy.count_nonzero(lengths == 0)) if m else 0
    compacted = n_empty > 0 and n_empty * _COMPACT_SHARE >= m
    indptr = rows = empty = None
    if compacted:
        rows = cupy.flatnonzero(lengths).astype(cupy.int32)
        empty = cupy.flatnonzero(lengths == 0).astype(cupy.int32)
        indptr = cupy.concatenate([A.indptr[rows], A.indptr[m:]])
    merge_rows = m - n_empty if compacted else m
    items = spmv_items(merge_rows, nnz)
    starts = _tile_starts(A.indptr if indptr is None else indptr, merge_rows, nnz, items)
    return SpMVPlan(device="gpu", shape=(m, int(A.shape[1])), nnz=nnz, empty_rows=n_empty,
                    compacted=compacted, items=items, pieces=int(starts.size) - 1,
                    starts=starts, indptr=indptr, rows=rows, empty=empty)


def spmv_merge(A: csp.csr_matrix, x: cupy.ndarray, *, items: int | None = None,
               flag: Flag | None = None, plan: SpMVPlan | None = None) -> cupy.ndarray:
    """``A @ x`` for 1-D ``x``: ``mgpu_spmv_merge`` over tiles of ``128 * items`` merge
    items, and the carries: added by the merge launch's own last block for up to
    ``_FUSED_CARRIES`` tiles (one launch in all), by the carry passes' launches for more
    and in a CUDA graph's capture (see :func:`_done_counter`), not at all for a single
    tile. Where each tile starts on the
    merge path is found by the tile's own block in a launch of up to ``_SEARCH_WAVES`` waves
    of tiles, by a search launch before it otherwise, and is read from ``plan`` (made by
    :func:`plan_spmv` for this A) when there is one; the plan may also have the merge run
    over A's non-empty rows alone.

    Operands must pass :func:`spmv_is_usable_for`; ``items`` (one of ``SPMV_ITEMS``)
    defaults to :func:`spmv_items`. ``flag`` (:func:`mgpu.backends.flags.device_flag`) is
    raised when x holds NaN or infinity (any of its values: the tiles' blocks scan x in
    shares, in the same launch) or a row's sum is not finite: always when A's stored
    values hold NaN or infinity, and also when a sum overflows; nothing reads it here.
    Without ``flag`` nothing is checked (and x is read only where A's columns point).
    """
    m = int(A.shape[0])
    nnz = int(A.nnz)  # cupyx keeps data of length indptr[-1]: no device sync
    if m == 0:
        if flag is not None:  # no tile to scan x: a launch of its own
            flag_nonfinite((x,), flag)
        return cupy.empty(0, dtype=A.dtype)
    indptr, rows, empty, n_empty, tile_row = A.indptr, None, None, 0, None
    check = flag is not None
    if plan is not None:
        items, n_tiles, tile_row = plan.items, plan.pieces, plan.starts
        if plan.compacted:
            indptr, rows, empty, n_empty = plan.indptr, plan.rows, plan.empty, plan.empty_rows
        m = plan.merge_rows
        launch = _merge_launcher(A.dtype, items, check, False)
    else:
        key = (cupy.cuda.runtime.getDevice(), m, nnz, A.dtype.char, items, check)
        recipe = _MERGE_RECIPES.get(key)
        if recipe is None:
            recipe = _merge_recipe(m, nnz, A.dtype, items, check)
            if len(_MERGE_RECIPES) >= _MERGE_RECIPES_MAX:
                _MERGE_RECIPES.clear()
            _MERGE_RECIPES[key] = recipe
        launch, items, n_tiles, search = recipe
        if not search:  # else each tile's block finds its own place (tile_row null)
            tile_row = _tile_starts(indptr, m, nnz, items)
    y, carry_row, carry_val = _output_and_carries(int(A.shape[0]), A.dtype, n_tiles)
    # the carries added by the merge's last block, with the stream's counter
    done = _done_counter() if 1 < n_tiles <= _FUSED_CARRIES else 0
    # blocks past the tiles only zero empty rows: TILE of them a block
    grid = max(n_tiles, -(-n_empty // (_TILE_THREADS * items)))
    launch((grid,), (_TILE_THREADS,),
           (indptr.data.ptr, A.indices.data.ptr, A.data.data.ptr, x.data.ptr, m, nnz,
            address(tile_row), y.data.ptr, carry_row, carry_val,
            flag.addr if check else 0, address(rows), address(empty), n_empty, x.size, done))
    if n_tiles > 1 and not done:
        _add_carries(carry_row, carry_val, n_tiles, m, 1, y, rows)
    return y


# spmv_merge's launches without a plan by (device, rows, nonzeros, dtype, items asked,
# checked): (launcher, items, tiles, whether the tiles' blocks find their own places)
_MERGE_RECIPES: dict[tuple, tuple] = {}
_MERGE_RECIPES_MAX = 1 << 12


def _merge_launcher(dtype: np.dtype, items: int, check: bool, search: bool):
    return _launcher(f"mgpu_spmv_merge<{c_type(dtype)}, {items}, "
                     f"{'true' if check else 'false'}, {'true' if search else 'false'}>",
                     _MERGE_SIGNATURE)


def _merge_recipe(m: int, nnz: int, dtype: np.dtype, items: int | None, check: bool) -> tuple:
    items = spmv_items(m, nnz) if items is None else int(items)
    n_tiles = -(-(m + nnz) // (_TILE_THREADS * items))
    search = n_tiles <= _SEARCH_WAVES * current_facts().sms * _TILES_PER_SM
    return _merge_launcher(dtype, items, check, search), items, n_tiles, search


def _output_and_carries(m: int, dtype: np.dtype, n_tiles: int) -> tuple[cupy.ndarray, int, int]:
    """y (``m`` of ``dtype``, uninitialised) and, in the same allocation after it (held as
    long as y: a few bytes a tile), the addresses of the tiles' carry rows (int32) and
    values (double, 8-byte aligned): one request of the memory pool a call."""
    at_row = -(-m * np.dtype(dtype).itemsize // 16) * 16
    at_val = at_row + -(-4 * n_tiles // 16) * 16
    mem = cupy.cuda.alloc(at_val + 8 * n_tiles)
    return cupy.ndarray((m,), dtype, memptr=mem), mem.ptr + at_row, mem.ptr + at_val


def spmm_merge(A: csp.csr_matrix, X: cupy.ndarray, *, items: int | None = None,
               flag: Flag | None = None) -> cupy.ndarray:
    """``A @ X`` for row-major 2-D ``X`` by ``mgpu_spmm_merge`` and the carry passes:
    each piece is walked by one warp per block of 32 columns of X. ``items`` is one of
    ``SPMM_ITEMS``; ``flag`` as in :func:`spmv_merge` (A's values and X are scanned for it,
    in one launch)."""
    m, k = int(A.shape[0]), int(X.shape[1])
    nnz = int(A.nnz)  # cupyx keeps data of length indptr[-1]: no device sync
    col_blocks = -(-k // 32)
    if col_blocks > 65535:
        raise ValueError(f"spmm takes at most {65535 * 32} columns of X on the GPU; got {k}.")
    items = _pick(m, nnz, SPMM_ITEMS) if items is None else int(items)
    n_pieces = -(-(m + nnz) // items)
    # Y and the carries, a double per piece and column: more than A itself for a wide X
    require_gpu_unless_small(
        m * k * A.dtype.itemsize + (n_pieces * (4 + 8 * k) if m and k else 0),
        lambda: f"SpMM of a {m:,}×{A.shape[1]:,} A with {nnz:,} nonzeros by {k} columns",
        "Multiply fewer columns of X at a time.")
    Y = cupy.empty((m, k), dtype=A.dtype)
    if flag is not None:
        flag_nonfinite((A.data, X), flag)
    if m == 0 or k == 0:
        return Y
    mem, carry_row, carry_val = _carries(n_pieces, k)
    grid = (-(-n_pieces // _SPMM_PIECES), col_blocks)
    block = (32, _SPMM_PIECES)
    _function(f"mgpu_spmm_merge<{c_type(A.dtype)}, {items}>")(
        grid, block,
        (A.indptr, A.indices, A.data, X, cupy.int64(m), cupy.int64(nnz), cupy.int64(k),
         cupy.int64(n_pieces), Y, np.uint64(carry_row), np.uint64(carry_val)),
    )
    _add_carries(carry_row, carry_val, n_pieces, m, k, Y)
    del mem
    return Y


def merge_product(A: csp.csr_matrix, x: cupy.ndarray, *, flag: Flag | None = None,
                  plan: SpMVPlan | None = None) -> cupy.ndarray:
    """``A @ x`` by :func:`spmv_merge` for 1-D ``x`` (with ``plan``, if given),
    :func:`spmm_merge` for 2-D."""
    return spmv_merge(A, x, flag=flag, plan=plan) if x.ndim == 1 else spmm_merge(A, x, flag=flag)


@spmv_flagged_lookup.register(csp.spmatrix)
def spmv_flagged(A: csp.csr_matrix, x: cupy.ndarray, plan: SpMVPlan | None = None
                 ) -> tuple[cupy.ndarray, bool | None]:
    """``A @ x`` (1-D) or ``A @ X`` (2-D) by the merge-path kernels, and whether they raised
    their flag (:mod:`mgpu.backends.flags`) on NaN or infinity in A's stored values or in x
    (for 1-D x, also on a row sum that overflows: see :func:`spmv_merge`), read after the
    call's one wait for its stream; ``None`` in its place when the operands go to cuSPARSE
    (:func:`spmv_fallback`), which checks nothing and is not waited for."""
    if not spmv_is_usable_for(A, x):
        return spmv_fallback(A, x), None
    with device_flag() as flag:
        y = merge_product(A, x, flag=flag, plan=plan)
        return y, flag.raised()


def spmv_fallback(A: csp.spmatrix, x: cupy.ndarray) -> cupy.ndarray:
    """The same product by cupyx (cuSPARSE), for operands the kernels do not take."""
    return cupy.asarray(A.tocsr() @ x)


@spmv_lookup.register((cupy.ndarray, csp.spmatrix))
def _spmv_gpu(A, x: cupy.ndarray, plan: SpMVPlan | None = None) -> cupy.ndarray:
    if plan is not None:  # made for this CSR A, x 1-D: the kernels take them (spmv_plan)
        return spmv_merge(A, x, plan=plan)
    if isinstance(A, cupy.ndarray):  # dense A: cuBLAS
        return A @ x
    A = A.tocsr()
    if spmv_is_usable_for(A, x):
        return merge_product(A, x)
    logger.debug("spmv: cuSPARSE fallback for A %s %s, x %s", A.dtype, A.indptr.dtype, x.dtype)
    return spmv_fallback(A, x)
