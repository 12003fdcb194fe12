"""Sparse matrix times dense vector (SpMV) or dense matrix (SpMM) on one CPU or GPU.

Both run the merge-path scheme (:mod:`mgpu.backends.numpy_spmv` on the CPU,
``kernels/spmv.cu`` on the GPU): the rows and nonzeros of A are shared out in equal pieces,
so a few very long rows or many empty rows do not unbalance the work.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from mgpu.backends import (
    array_module,
    is_gpu_array,
    spmv_flagged_lookup,
    spmv_lookup,
    spmv_plan_lookup,
    spmv_takes_as_is_lookup,
)
from mgpu.backends.sddmm_plan import pattern_key
from mgpu.backends.spmv_plan import SpMVPlan
from mgpu.ops.validation import (Boolean, check_array, check_param, first_nonfinite,
                                 is_dask_array, is_sparse)

__all__ = [
    "check_dense_finite",
    "check_dense_operand",
    "check_sparse_operand",
    "check_spmv_plan",
    "spmm",
    "spmv",
    "spmv_checked",
    "spmv_dtype",
    "spmv_local",
    "spmv_plan",
]


def spmv_dtype(a_dtype: Any, x_dtype: Any) -> np.dtype:
    """The result dtype: numpy's promotion of A's and x's, float64 unless that is float32 or
    float64 (integers and booleans compute in float64).

    Examples
    --------
    >>> spmv_dtype(np.float32, np.float32), spmv_dtype(np.float32, np.float64)
    (dtype('float32'), dtype('float64'))
    >>> spmv_dtype(np.int64, np.float32), spmv_dtype(bool, np.int8)
    (dtype('float64'), dtype('float64'))
    """
    dt = np.result_type(np.dtype(a_dtype), np.dtype(x_dtype))
    return dt if dt in (np.dtype(np.float32), np.dtype(np.float64)) else np.dtype(np.float64)


def check_sparse_shape(A: Any, func: str) -> None:
    """Refuse an A that is not a sparse matrix (or dask array of them), not 2-D, or complex."""
    # is_gpu_array: a dense CuPy A, named only in the hint
    dense = isinstance(A, np.ndarray) or (is_gpu_array(A) and not is_sparse(A))
    check_array(A, "A", func, accept_dense=False, accept_dask=True,
                kinds="a scipy or cupyx sparse matrix, or a dask array of CSR row tiles "
                      "(mgpu.from_scipy)",
                kinds_hint="; for a dense A use A @ x" if dense else "")


def check_sparse_operand(A: Any, func: str) -> Any:
    """A as CSR (scipy or cupyx), refusing NaN or infinity among its stored values."""
    check_sparse_shape(A, func)
    A = A.tocsr()
    at = first_nonfinite(A)
    if at is not None:
        raise ValueError(
            f"The 'A' parameter of {func} holds NaN or infinity (first at row {at[0]}, "
            f"column {at[1]}); it would spread over the whole row of the result. Clean A "
            "first."
        )
    return A


def check_dense_operand(x: Any, n: int, name: str, func: str, ndim: int, *,
                        finite: bool = True) -> None:
    """Refuse an x that is not a dense numpy/cupy array of ``ndim`` dimensions with ``n``
    entries (rows) along its first axis, or (with ``finite``) that holds NaN or infinity."""
    got = getattr(x, "ndim", None)
    hint = f"; use mgpu.{'spmm' if ndim == 1 else 'spmv'} for a {got}-D operand" \
        if got in (1, 2) else ""
    check_array(x, name, func, accept_sparse=False, ndim=ndim,
                kinds="a dense numpy or cupy array", ndim_hint=hint)
    if x.shape[0] != n:
        what = "length" if ndim == 1 else "number of rows"
        raise ValueError(
            f"The '{name}' parameter of {func} must have {what} A.shape[1] = {n} (one "
            f"{'entry' if ndim == 1 else 'row'} per column of A). Got {what} {x.shape[0]} "
            "instead."
        )
    if finite:
        check_dense_finite(x, name, func, ndim)


def check_dense_finite(x: Any, name: str, func: str, ndim: int) -> None:
    """Refuse a dense x holding NaN or infinity, naming the first place."""
    where = first_nonfinite(x)
    if where is not None:
        at = f"index {where[0]}" if ndim == 1 else f"row {where[0]}, column {where[1]}"
        raise ValueError(f"The '{name}' parameter of {func} holds NaN or infinity (first at "
                         f"{at}). Clean it first.")


def check_same_device(A: Any, x: Any, name: str, func: str) -> None:
    """Refuse operands on different devices (scipy with cupy, cupyx with numpy)."""
    a_gpu, x_gpu = is_gpu_array(A), is_gpu_array(x)  # the refusal names each one's device
    if a_gpu != x_gpu:
        def where(v: Any, gpu: bool) -> str:
            return f"on the {'GPU' if gpu else 'CPU'} ({type(v).__name__})"

        raise ValueError(
            f"The operands of {func} must be on one device. Got A {where(A, a_gpu)} and "
            f"{name} {where(x, x_gpu)}. Move them with cupy.asarray / "
            "cupyx.scipy.sparse.csr_matrix or cupy.asnumpy / .get()."
        )


def _promote(A: Any, x: Any) -> tuple[Any, Any]:
    """A and a C-ordered x in the result dtype (:func:`spmv_dtype`), on A's device."""
    dt = spmv_dtype(A.dtype, x.dtype)
    if A.dtype != dt:
        A = A.astype(dt)
    return A, array_module(A).ascontiguousarray(x, dtype=dt)


def spmv_local(A: Any, x: Any, plan: SpMVPlan | None = None) -> Any:
    """The kernel call on already-validated CSR A and dense x (1-D or 2-D) of one device;
    with a ``plan`` (checked against A, x 1-D), the merge-path SpMV with it."""
    A, x = _promote(A, x)
    return spmv_lookup(A, x, plan=plan)


def spmv_checked(A: Any, x: Any, name: str, func: str, check_finite: bool = True,
                 plan: SpMVPlan | None = None) -> Any:
    """The kernel call on CSR A and dense x (1-D or 2-D) of one device whose shapes and
    types are checked, refusing NaN or infinity among A's stored values or in x.

    On the CPU the values are checked first. On the GPU the merge-path kernels flag such
    values as they work (SpMV: every value of x, and every row's sum, which a NaN or
    infinity of A always makes non-finite; SpMM: every value of A and X), in a flag of
    pinned host memory (:mod:`mgpu.backends.flags`) read after the call's one wait for its
    stream; only a raised flag runs the checks that name the place (the result, a new
    array, is dropped). Without ``check_finite`` the values are not looked at and nothing
    waits for the device.
    """
    A = A.tocsr()
    if not check_finite:
        return spmv_local(A, x, plan)
    # Where the values are checked differs by device (before the product on the CPU, by the
    # kernels while they work on the GPU), and so does the order of the checks.
    if not is_gpu_array(A):
        check_dense_finite(x, name, func, x.ndim)  # x first, then A, on both devices
        return spmv_local(check_sparse_operand(A, func), x, plan)
    return _gpu_checked(*_promote(A, x), name, func, plan)


def _gpu_checked(A: Any, x: Any, name: str, func: str, plan: SpMVPlan | None = None) -> Any:
    """The GPU half of :func:`spmv_checked`, for operands in the result dtype."""
    y, flagged = spmv_flagged_lookup(A, x, plan)  # flagged: read after the call's one wait
    if flagged is not False:  # raised, or cuSPARSE ran without looking
        check_dense_finite(x, name, func, x.ndim)
        check_sparse_operand(A, func)
        # Nothing found: SpMV's kernel flags a row whose sum is not finite, which a sum that
        # overflows also is (y holds it, as scipy's would); SpMM's flags only the values.
        if flagged and x.ndim == 2:
            raise RuntimeError(f"{func}: the GPU kernels flagged NaN or infinity that the "
                               "checks of the operands did not find.")
    return y


def check_spmv_plan(plan: Any, A: Any) -> None:
    """Refuse a plan that :func:`spmv_plan` did not make for this very A on its device."""
    if not isinstance(plan, SpMVPlan):
        raise TypeError(f"The 'plan' parameter of spmv must come from mgpu.spmv_plan. Got "
                        f"{type(plan).__name__} instead.")
    gpu = is_gpu_array(A)  # the plan's device against A's
    if (plan.device == "gpu") != gpu:
        raise ValueError(f"The 'plan' parameter of spmv was made for the "
                         f"{plan.device.upper()}, but A is on the {'GPU' if gpu else 'CPU'}.")
    if getattr(A, "format", None) != "csr" or plan.pattern != pattern_key(A):
        if getattr(A, "format", None) != "csr":
            got = f"A in {A.format!r} format"
        elif (tuple(A.shape), int(A.nnz)) == (plan.shape, plan.nnz):
            got = "an A of that shape and size whose index arrays are other arrays (a copy?)"
        else:
            got = f"A {tuple(A.shape)} with {int(A.nnz)} nonzeros"
        raise ValueError(
            f"The 'plan' parameter of spmv was made for another A ({plan.shape} with "
            f"{plan.nnz} nonzeros); got {got}. Make the plan with mgpu.spmv_plan(A) on this "
            "very A, in CSR form, and pass that same matrix (a plan holds where A's rows "
            "fall in the merge)."
        )


def spmv_plan(A: Any) -> SpMVPlan:
    """Where :func:`spmv`'s merge path cuts A, found once for many products with it.

    Each call of :func:`spmv` cuts the merge of A's row ends and nonzeros into equal pieces
    and searches where each starts. An iterative method (power iteration, PageRank, a
    Krylov solver) multiplies the same A many times: pass ``plan=spmv_plan(A)`` and the
    searches are done here, once. On the GPU, when at least one row in 16 of A is empty
    (graphs whose vertex ids are sparse, the sinks of a directed graph), the plan also
    leaves the empty rows out of the merge: the kernel then zeroes them, a read and a
    write each instead of a merge item, so a product's time follows A's nonzeros.

    Parameters
    ----------
    A : sparse CSR matrix of shape (n_rows, n_cols)
        scipy (CPU) or cupyx (GPU) CSR, the very matrix later passed to :func:`spmv` (the
        plan is tied to its index arrays).

    Returns
    -------
    plan : SpMVPlan
        ``plan.describe()`` says what it holds. On the GPU it holds about 8 bytes per piece
        and, when compacted, 8 bytes per row of A on the device.

    Raises
    ------
    TypeError
        If A is not a scipy or cupyx sparse matrix (a dask A is planned per tile), or is
        complex.
    ValueError
        If A is not in CSR form or not 2-D.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp
    >>> A = sp.csr_matrix(np.array([[1.0, 0.0, 2.0], [0.0, 0.0, 0.0], [0.0, 3.0, 0.0]]))
    >>> plan = spmv_plan(A)
    >>> plan.device, plan.empty_rows
    ('cpu', 1)
    >>> spmv(A, np.array([1.0, 2.0, 3.0]), plan=plan)
    array([7., 0., 6.])
    """
    if is_dask_array(A):
        raise TypeError("The 'A' parameter of spmv_plan must be one scipy or cupyx matrix; a "
                        "distributed A is cut per tile on its worker.")
    check_sparse_shape(A, "spmv_plan")
    if A.format != "csr":
        raise ValueError(f"The 'A' parameter of spmv_plan must be in CSR form (the plan is "
                         f"tied to its index arrays). Got {A.format!r}; plan A.tocsr() and "
                         "pass that same matrix to spmv.")
    return dataclasses.replace(spmv_plan_lookup(A), pattern=pattern_key(A))


def _planned_for(plan: Any, A: Any) -> bool:
    """Whether ``plan`` was made by :func:`spmv_plan` for this very CSR A on its device: then
    A passed spmv_plan's checks and its pattern is the plan's, so a call with its own plan
    skips them and the rest of :func:`check_spmv_plan`."""
    return (type(plan) is SpMVPlan and getattr(A, "format", None) == "csr"  # the plan's device
            and (plan.device == "gpu") == is_gpu_array(A) and plan.pattern == pattern_key(A))


def _one_device(A: Any, x: Any, name: str, func: str, ndim: int, check_finite: bool,
                plan: SpMVPlan | None = None) -> Any:
    if plan is not None and not _planned_for(plan, A):  # else nothing more to check of A
        if is_dask_array(A):
            raise TypeError(f"The 'plan' parameter of {func} is for one matrix on one device; "
                            "a dask A is cut per tile on its worker. Leave plan out.")
        check_sparse_shape(A, func)
        check_spmv_plan(plan, A)
    if spmv_takes_as_is_lookup(A, x, ndim):  # passes every check but the values'
        if check_finite:
            return _gpu_checked(A, x, name, func, plan)
        return spmv_lookup(A, x, plan=plan)
    if is_dask_array(A):
        raise TypeError(f"mgpu.ops.{func} runs on one device; for a dask array A use "
                        f"mgpu.{func}, which runs the distributed version.")
    check_sparse_shape(A, func)
    check_dense_operand(x, A.shape[1], name, func, ndim, finite=False)
    check_same_device(A, x, name, func)
    return spmv_checked(A, x, name, func, bool(check_finite), plan)


def spmv(A: Any, x: Any, *, check_finite: bool = True, plan: SpMVPlan | None = None) -> Any:
    """Sparse matrix times dense vector, ``y = A @ x``, by merge path on one CPU or GPU.

    Parameters
    ----------
    A : sparse matrix of shape (n_rows, n_cols)
        scipy (CPU) or cupyx (GPU) sparse matrix, any format (converted to CSR); duplicate
        entries are summed, as in scipy.
    x : ndarray of shape (n_cols,)
        numpy with a scipy A, cupy with a cupyx A.
    check_finite : bool, default=True
        Refuse NaN or infinity among A's stored values or anywhere in x, also in entries of
        x that no stored value of A reads (as scipy.linalg's ``check_finite``). On the CPU
        the values are checked before the product. On the GPU the product's kernel checks
        them while it runs (x's values, and every row's sum, which a NaN or infinity of A
        always makes non-finite) and raises a flag in pinned host memory; the call waits
        once, for its stream, and reads the flag with the result (no copy back); only a
        raised flag makes the host look for the first bad place and refuse. A row sum that
        overflows raises the flag too; with no NaN or infinity found, y is returned as
        scipy would give it. ``False`` skips the check and the wait, for operands known to
        be finite (a loop over checked data): NaN or infinity then spread into the rows of
        y that touch them.
    plan : SpMVPlan, optional
        From :func:`spmv_plan` on this very A: where the merge is cut, found once for many
        products (and, on the GPU, A's empty rows left out of it).

    Returns
    -------
    y : ndarray of shape (n_rows,)
        numpy for CPU input, cupy for GPU input. Its dtype is numpy's promotion of A's and
        x's (float32 only when both are float32 or smaller floats), float64 for integers.

    Raises
    ------
    TypeError
        If A is not sparse, x is not a dense array, or either is complex.
    ValueError
        If A is not 2-D, x is not 1-D or its length is not ``A.shape[1]``, the operands are on
        different devices, (with ``check_finite``) either holds NaN or infinity (the
        message gives where), or ``plan`` was made for another matrix or device.

    See Also
    --------
    spmm : the same product with a 2-D dense X.
    spmv_plan : the merge cut once, for many products with one A.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp
    >>> A = sp.csr_matrix(np.array([[1.0, 0.0, 2.0], [0.0, 0.0, 0.0], [0.0, 3.0, 0.0]]))
    >>> spmv(A, np.array([1.0, 2.0, 3.0]))
    array([7., 0., 6.])
    """
    if check_finite is not True and check_finite is not False:  # else nothing to check
        check_param(check_finite, "check_finite", "spmv", Boolean())
    return _one_device(A, x, "x", "spmv", 1, check_finite, plan)


def spmm(A: Any, X: Any, *, check_finite: bool = True) -> Any:
    """Sparse matrix times dense matrix, ``Y = A @ X``, by merge path on one CPU or GPU.

    Each piece of A's merge path is applied to every column of X (on the GPU, one warp per
    piece and block of 32 columns), so A's indices are read once per column block.

    Parameters
    ----------
    A : sparse matrix of shape (n_rows, n_cols)
        scipy (CPU) or cupyx (GPU) sparse matrix, any format.
    X : ndarray of shape (n_cols, n_vectors)
        numpy with a scipy A, cupy with a cupyx A; any memory order.
    check_finite : bool, default=True
        As in :func:`spmv`; on the GPU one launch beside the product checks every value of
        A and X for the flag.

    Returns
    -------
    Y : ndarray of shape (n_rows, n_vectors)
        C-ordered; numpy for CPU input, cupy for GPU input; dtype as in :func:`spmv`.

    Raises
    ------
    TypeError, ValueError
        As :func:`spmv`, with X 2-D and ``X.shape[0] == A.shape[1]``.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp
    >>> A = sp.csr_matrix(np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]]))
    >>> spmm(A, np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    array([[3., 2.],
           [0., 3.]])
    """
    if check_finite is not True and check_finite is not False:  # else nothing to check
        check_param(check_finite, "check_finite", "spmm", Boolean())
    return _one_device(A, X, "X", "spmm", 2, check_finite)
