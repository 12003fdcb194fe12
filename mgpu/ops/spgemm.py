"""Sparse × sparse: the product ``A @ B`` (SpGEMM, optionally masked) and the sum
``alpha·A + beta·B`` (SpAdd), on one CPU (numba, all cores) or one GPU.

Results are canonical CSR: each row's columns sorted, no duplicates, and no stored zeros (a
sum that comes out exactly 0 is left out, as scipy's own product and sum leave it out), so
the pattern is scipy's. Unsorted indices and duplicates in the operands are taken
(duplicates add up, as in scipy's arithmetic). NaN and infinity among the stored values are
refused: they would spread over whole rows of the result.
"""
from __future__ import annotations

from numbers import Real
from typing import Any

import numpy as np

from mgpu.backends import (csr_sound_lookup, csr_well_formed, is_gpu_array, spadd_lookup,
                           spgemm_lookup)
from mgpu.ops.routes import route
from mgpu.ops.spmv import check_same_device
from mgpu.ops.validation import (Boolean, Interval, canonical_csr, check_array, check_param,
                                 first_nonfinite, float_dtype, is_dask_array, is_sparse,
                                 same_kind)

__all__ = ["check_csr_values", "check_mask", "check_sparse_pair", "spadd", "spgemm",
           "spgemm_local"]

_KINDS = "a scipy or cupyx sparse matrix"


def _sparse_operand(X: Any, name: str, func: str, dask: bool) -> None:
    # is_gpu_array: a dense CuPy operand, named only in the hint
    dense = isinstance(X, np.ndarray) or (is_gpu_array(X) and not is_sparse(X))
    hint = "; for a dense operand use mgpu.spmm (sparse × dense) or A @ X" if dense else ""
    check_array(X, name, func, accept_dense=False, accept_dask=dask,
                kinds=_KINDS + (", or a dask array of CSR row tiles (mgpu.from_scipy)"
                                if dask else ""), kinds_hint=hint)


def _finite(X: Any, name: str, func: str, row0: int = 0) -> None:
    at = first_nonfinite(X)
    if at is not None:
        raise ValueError(f"The '{name}' parameter of {func} holds NaN or infinity (first at "
                         f"row {row0 + int(at[0])}, column {int(at[1])}); it would spread over "
                         "the rows of the result. Clean it first.")


def check_csr_values(X: Any, name: str, func: str, row0: int = 0) -> None:
    """Refuse a CSR operand whose index arrays are out of range or order, or whose stored
    values hold NaN or infinity (one look; on the GPU one wait). ``row0``: where X's rows
    start in the matrix the refusal names (a row tile's first row)."""
    if not csr_sound_lookup(X):
        _structure(X, name, func)
        _finite(X, name, func, row0)


def check_sparse_pair(A: Any, B: Any, func: str, *, product: bool) -> tuple[Any, Any]:
    """A and B as CSR of one device in their common float dtype (float32 only where both
    are float32), refusing dense or mismatched operands and NaN or infinity. ``product``:
    A's columns must match B's rows (else their shapes must be equal)."""
    _sparse_operand(A, "A", func, False)
    _sparse_operand(B, "B", func, False)
    check_same_device(A, B, "B", func)
    if product and A.shape[1] != B.shape[0]:
        raise ValueError(f"The 'B' parameter of {func} must have A.shape[1] = {A.shape[1]} "
                         f"rows (one per column of A). Got shape {tuple(B.shape)} instead, "
                         f"with A of shape {tuple(A.shape)}.")
    if not product and A.shape != B.shape:
        raise ValueError(f"The 'B' parameter of {func} must have A's shape {tuple(A.shape)}. "
                         f"Got shape {tuple(B.shape)} instead.")
    dt = float_dtype(np.result_type(A.dtype, B.dtype))
    A, B = A.tocsr(), B.tocsr()
    if A.dtype != dt:
        A = A.astype(dt)
    if B.dtype != dt:
        B = B.astype(dt)
    # one look at the values and the index arrays of both (on the GPU one launch each and
    # one wait); what is wrong, and where, is found only for a refusal. The kernels index
    # B's rows by A's columns and their tables by B's columns: an index out of range would
    # read or write outside the arrays.
    if not csr_sound_lookup(A, B):
        check_csr_values(A, "A", func)
        check_csr_values(B, "B", func)
    return A, B


def _structure(X: Any, name: str, func: str) -> None:
    """Refuse a CSR X whose index arrays are not consistent, saying what is wrong."""
    if not bool(csr_well_formed(X)):
        raise ValueError(
            f"The '{name}' parameter of {func} is not a well-formed CSR matrix of shape "
            f"{tuple(X.shape)}: its row pointers must run from 0 to nnz without decreasing "
            f"and its column indices lie in [0, {X.shape[1]}). Rebuild it, or check it with "
            "scipy's X.check_format(full_check=True).")


def check_mask(mask: Any, shape: tuple[int, int], A: Any, func: str) -> Any:
    """The mask as canonical CSR on A's device (its values are not used), refusing one of
    another shape or device, or one with stored zeros (whose meaning would be a guess)."""
    _sparse_operand(mask, "mask", func, False)
    check_same_device(A, mask, "mask", func)
    if getattr(mask, "format", None) == "csr":
        _structure(mask, "mask", func)
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"The 'mask' parameter of {func} must have the result's shape "
                         f"{tuple(shape)} (A.shape[0], B.shape[1]). Got shape "
                         f"{tuple(mask.shape)} instead.")
    M = canonical_csr(mask)
    if M.nnz and not bool((M.data != 0).all()):
        raise ValueError(
            f"The 'mask' parameter of {func} holds stored zeros, so its pattern is ambiguous "
            "(are they in it or not?). Call mask.eliminate_zeros() to leave them out, or set "
            "mask.data[:] = 1 to keep them.")
    return M


def spgemm_local(A: Any, B: Any, mask: Any = None, to_host: bool = False) -> Any:
    """The product of checked CSR operands of one device (:func:`check_sparse_pair`), and
    a checked mask or None; a CSR of that device (scipy with ``to_host``)."""
    return spgemm_lookup(A, B, mask, to_host)


def spgemm(A: Any, B: Any, *, mask: Any = None, to_host: bool = False) -> Any:
    """Sparse matrix times sparse matrix, ``C = A @ B``, or only at ``mask``'s positions.

    On the GPU, row by row in two passes over the intermediate products (each handed out
    to threads in equal shares, the merge-path scheme of Dalton et al.): the first counts
    each row of C, so that C's size is known before it is made, and the scratch memory of
    either pass is used in batches that fit what the device has. On the CPU, Gustavson's
    row-by-row product on every core, rows shared out by their work.

    Parameters
    ----------
    A : {sparse matrix} of shape (n_rows, n_inner)
        scipy or cupyx sparse matrix (any format; CSR is used as it is), or a dask array
        of CSR row tiles (``mgpu.from_scipy``): the product then runs tile by tile on the
        cluster.
    B : {sparse matrix} of shape (n_inner, n_cols)
        On A's device.
    mask : {sparse matrix} of shape (n_rows, n_cols), optional
        Compute C only at the stored positions of ``mask`` (its values are not used; stored
        zeros are refused as ambiguous): C then holds A @ B where mask has an entry and a
        product lands. What triangle counting and similarity joins need, at a fraction of
        the work when the mask is sparse.
    to_host : bool, default=False
        GPU only: return C as a scipy CSR, computed in row blocks that each fit the device
        and copied to the host in turn, for a C too large for the device (or for CuPy's
        32-bit indices). Without it such a C is refused before the numeric pass.

    Returns
    -------
    C : {sparse matrix} of shape (n_rows, n_cols)
        Canonical CSR (sorted columns, no duplicates, no stored zeros) of A's kind: scipy
        in, scipy out (a ``csr_array`` for scipy sparse arrays); cupyx in, cupyx out
        (scipy with ``to_host``). float32 only where A and B both are, else float64.

    Raises
    ------
    TypeError
        A, B or mask is not a sparse matrix (dense operands: use ``mgpu.spmm``).
    ValueError
        Shapes that do not match, operands on different devices, NaN or infinity among
        the stored values, a mask with stored zeros.
    mgpu.DeviceMemoryError
        C does not fit the GPU (the message gives both sizes); before the numeric pass.

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> A = sp.csr_matrix(np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]]))
    >>> C = spgemm(A, A.T)
    >>> C.toarray()
    array([[5., 0.],
           [0., 9.]])
    >>> spgemm(A, A.T, mask=sp.identity(2, format="csr")).nnz
    2
    """
    func = "spgemm"
    check_param(to_host, "to_host", func, Boolean())
    if is_dask_array(A):
        return route(func)(A, B, mask=mask, to_host=to_host)
    like = A
    A, B = check_sparse_pair(A, B, func, product=True)
    M = None if mask is None else check_mask(mask, (A.shape[0], B.shape[1]), A, func)
    return same_kind(spgemm_local(A, B, M, to_host), like)


def spadd(A: Any, B: Any, *, alpha: float = 1.0, beta: float = 1.0) -> Any:
    """Sparse plus sparse: ``C = alpha * A + beta * B``.

    On the GPU, a merge of the two matrices' entries in (row, column) order (each entry's
    place found by a binary search in the other matrix, merge path's parallel merge); on
    the CPU, a merge of each pair of rows on every core.

    Parameters
    ----------
    A, B : {sparse matrix} of shape (n_rows, n_cols)
        scipy or cupyx sparse matrices of one shape, on one device.
    alpha, beta : float, default=1.0
        Finite scale factors (applied in the result's dtype).

    Returns
    -------
    C : {sparse matrix} of shape (n_rows, n_cols)
        Canonical CSR of A's kind (sorted columns, no duplicates, no stored zeros: entries
        that cancel exactly are left out, as scipy leaves them out). float32 only where A
        and B both are, else float64.

    Raises
    ------
    TypeError
        A or B is not a sparse matrix.
    ValueError
        Different shapes or devices, NaN or infinity in A, B, alpha or beta.

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> A = sp.csr_matrix(np.array([[1.0, 0.0], [0.0, 2.0]]))
    >>> spadd(A, sp.identity(2, format="csr"), beta=-1.0).toarray()
    array([[0., 0.],
           [0., 1.]])
    """
    func = "spadd"
    for name, v in (("alpha", alpha), ("beta", beta)):
        check_param(v, name, func, Interval(Real, None, None))
        if not np.isfinite(v):
            raise ValueError(f"The '{name}' parameter of {func} must be a finite real number. "
                             f"Got {v!r} instead.")
    if is_dask_array(A) or is_dask_array(B):
        raise TypeError(f"{func} takes scipy or cupyx sparse matrices, not dask arrays: "
                        "gather the tiles first (mgpu.gather).")
    like = A
    A, B = check_sparse_pair(A, B, func, product=False)
    return same_kind(spadd_lookup(A, B, float(alpha), float(beta)), like)
