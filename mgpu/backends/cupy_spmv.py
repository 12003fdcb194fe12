"""GPU merge-path SpMV and SpMM (``kernels/spmv.cu``), registered on ``spmv_lookup``.

Imported lazily with the rest of the CuPy backend. The kernels take cupyx CSR (int32
indices) in float32 or float64 with x of the same dtype; anything else goes to cuSPARSE
through cupyx's own ``A @ x``, the tested fallback.
"""
from __future__ import annotations

import logging

import cupy
import cupyx.scipy.sparse as csp

from mgpu.backends import spmv_lookup
from mgpu.backends.instances import INSTANCES, SPMV_ITEMS
from mgpu.backends.loader import c_type, get_function

logger = logging.getLogger(__name__)

__all__ = ["spmm_merge", "spmv_fallback", "spmv_is_usable_for", "spmv_items", "spmv_merge"]

_SPMV = "spmv.cu"
_THREADS = 256  # SpMV: pieces per block (a multiple of 32: the kernel shuffles across lanes)
_SPMM_PIECES = 8  # SpMM: pieces per block, each a warp over 32 columns of X
_FULL_WAVES = 4  # below this many pieces per resident thread, smaller pieces pay off


def spmv_is_usable_for(A: csp.csr_matrix, x: cupy.ndarray) -> bool:
    """Whether the merge-path kernels take these operands (dtypes they are instantiated for,
    32-bit indices, row-major x, int32 carry rows)."""
    return (
        A.format == "csr"
        and A.dtype.name in ("float32", "float64")
        and x.dtype == A.dtype
        and x.ndim in (1, 2)
        and x.flags.c_contiguous
        and A.indptr.dtype.name == "int32"
        and A.indices.dtype.name == "int32"
        and A.shape[0] < 2**31 - 1
    )


def spmv_items(m: int, nnz: int) -> int:
    """Merge items per piece: the larger instantiation once the merge fills the device
    ``_FULL_WAVES`` times over with it, the smaller otherwise (more pieces, more threads)."""
    dev = cupy.cuda.Device()
    resident = dev.attributes["MultiProcessorCount"] * dev.attributes["MaxThreadsPerMultiProcessor"]
    small, large = min(SPMV_ITEMS), max(SPMV_ITEMS)
    return large if (m + nnz) >= _FULL_WAVES * resident * large else small


def _function(expression: str):
    return get_function(_SPMV, expression, INSTANCES[_SPMV])


def _carries(n_pieces: int, k: int) -> tuple[cupy.ndarray, cupy.ndarray]:
    shape = (n_pieces,) if k == 0 else (n_pieces, k)
    return cupy.empty(n_pieces, dtype=cupy.int32), cupy.empty(shape, dtype=cupy.float64)


def _add_carries(carry_row: cupy.ndarray, carry_val: cupy.ndarray, n_pieces: int, m: int,
                 k: int, out: cupy.ndarray) -> None:
    """The fix-up: gather each cut row's carries at its first piece, in double (pass 1),
    then add the total to the row once (pass 2)."""
    n, m64, k64 = cupy.int64(n_pieces), cupy.int64(m), cupy.int64(k)
    if k == 1 and out.ndim == 1:
        _function("mgpu_spmv_carries")((-(-n_pieces // _THREADS),), (_THREADS,),
                                       (carry_row, carry_val, n, m64))
    else:
        _function("mgpu_spmm_carries")((-(-(n_pieces * k) // _THREADS),), (_THREADS,),
                                       (carry_row, carry_val, n, m64, k64))
    _function(f"mgpu_carry_apply<{c_type(out.dtype)}>")(
        (-(-(n_pieces * k) // _THREADS),), (_THREADS,), (carry_row, carry_val, n, m64, k64, out))


def spmv_merge(A: csp.csr_matrix, x: cupy.ndarray, *, items: int | None = None) -> cupy.ndarray:
    """``A @ x`` for 1-D ``x`` by ``mgpu_spmv_merge`` and the carry passes.

    Operands must pass :func:`spmv_is_usable_for`; ``items`` (one of ``SPMV_ITEMS``)
    defaults to :func:`spmv_items`.
    """
    m = int(A.shape[0])
    nnz = int(A.nnz)  # cupyx keeps data of length indptr[-1]: no device sync
    y = cupy.empty(m, dtype=A.dtype)
    if m == 0:
        return y
    items = spmv_items(m, nnz) if items is None else int(items)
    t = c_type(A.dtype)
    n_pieces = -(-(m + nnz) // items)
    carry_row, carry_val = _carries(n_pieces, 0)
    blocks = -(-n_pieces // _THREADS)
    _function(f"mgpu_spmv_merge<{t}, {items}>")(
        (blocks,), (_THREADS,),
        (A.indptr, A.indices, A.data, x, cupy.int64(m), cupy.int64(nnz), cupy.int64(n_pieces),
         y, carry_row, carry_val),
    )
    _add_carries(carry_row, carry_val, n_pieces, m, 1, y)
    return y


def spmm_merge(A: csp.csr_matrix, X: cupy.ndarray, *, items: int | None = None) -> cupy.ndarray:
    """``A @ X`` for row-major 2-D ``X`` by ``mgpu_spmm_merge`` and the carry passes:
    each piece is walked by one warp per block of 32 columns of X."""
    m, k = int(A.shape[0]), int(X.shape[1])
    nnz = int(A.nnz)  # cupyx keeps data of length indptr[-1]: no device sync
    Y = cupy.empty((m, k), dtype=A.dtype)
    if m == 0 or k == 0:
        return Y
    items = spmv_items(m, nnz) if items is None else int(items)
    t = c_type(A.dtype)
    n_pieces = -(-(m + nnz) // items)
    carry_row, carry_val = _carries(n_pieces, k)
    col_blocks = -(-k // 32)
    if col_blocks > 65535:
        raise ValueError(f"spmm takes at most {65535 * 32} columns of X on the GPU; got {k}.")
    grid = (-(-n_pieces // _SPMM_PIECES), col_blocks)
    block = (32, _SPMM_PIECES)
    _function(f"mgpu_spmm_merge<{t}, {items}>")(
        grid, block,
        (A.indptr, A.indices, A.data, X, cupy.int64(m), cupy.int64(nnz), cupy.int64(k),
         cupy.int64(n_pieces), Y, carry_row, carry_val),
    )
    _add_carries(carry_row, carry_val, n_pieces, m, k, Y)
    return Y


def spmv_fallback(A: csp.spmatrix, x: cupy.ndarray) -> cupy.ndarray:
    """The same product by cupyx (cuSPARSE), for operands the kernels do not take."""
    return cupy.asarray(A.tocsr() @ x)


@spmv_lookup.register((cupy.ndarray, csp.spmatrix))
def _spmv_gpu(A, x: cupy.ndarray) -> cupy.ndarray:
    if isinstance(A, cupy.ndarray):  # dense A: cuBLAS
        return A @ x
    A = A.tocsr()
    if spmv_is_usable_for(A, x):
        return spmv_merge(A, x) if x.ndim == 1 else spmm_merge(A, x)
    logger.debug("spmv: cuSPARSE fallback for A %s %s, x %s", A.dtype, A.indptr.dtype, x.dtype)
    return spmv_fallback(A, x)
