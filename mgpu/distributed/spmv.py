"""Distributed SpMV/SpMM over a dask array of CSR row tiles, and the public ``mgpu.spmv`` and
``mgpu.spmm``.

A is cut into row tiles at nnz prefix sums (``mgpu.from_scipy(A, parts, axis=0)``) and
stays on the workers; x is put on one worker a call (in a task the scheduler keeps, so a lost
worker's copy is made again) and fetched by the others, and each tile computes its rows of the
result with the one-device merge path.
"""
from __future__ import annotations

import logging
import uuid
from typing import Any

import dask.array as da
from dask.base import tokenize

from mgpu.backends import array_module, on_device_of
from mgpu.distributed.cluster import current_client
from mgpu.distributed.collection import place_as
from mgpu.distributed.inputs import check_dask_input, csr_chunks, is_sparse_array, row_tiles
from mgpu.ops.validation import Boolean, check_array, check_param, is_dask_array
from mgpu.ops.spmv import (
    check_dense_operand,
    check_sparse_shape,
    spmv_checked,
    spmv_dtype,
)
from mgpu.ops.spmv import spmm as spmm_one_device
from mgpu.ops.spmv import spmv as spmv_one_device

logger = logging.getLogger(__name__)

__all__ = ["spmm", "spmv"]

_X = "mgpu-spmv-x-"


def _spmv_block(A: Any, x: Any, op_name: str, check_finite: bool = True) -> Any:
    """One row tile: refuse NaN/inf in it (only the worker sees its values) unless told not
    to, move x to the tile's device, run the merge path."""
    # j (A's columns) is contracted, so blockwise hands A and x over as one-block lists;
    # taking the blocks (not concatenate=True) keeps x the object the worker holds.
    A = A[0] if isinstance(A, list) else A
    x = x[0] if isinstance(x, list) else x
    x = on_device_of(x, A)
    return spmv_checked(A, x, "x" if x.ndim == 1 else "X", op_name, check_finite)


def _broadcast(x: Any, client: Any) -> da.Array:
    """x as a one-chunk dask array, put on a worker when there is a cluster, from which the
    others fetch it.

    x is held by a task (:func:`mgpu.distributed.collection.place_as`), not scattered to every
    worker: Dask's memory manager drops the extra copies of scattered data, and a broadcast
    scatter waits forever for a worker lost while it runs, so a lost worker would either
    lose x for good or hang the call. x changes between calls of an iterative method: a
    fresh name, not a hash of its values.
    """
    name = f"{_X}{uuid.uuid4().hex}"
    chunks = tuple((s,) for s in x.shape)
    if client is None:
        return da.from_array(x, chunks=chunks, asarray=False, name=name)
    key = (name,) + (0,) * x.ndim
    return da.Array({key: place_as(client, key, x)}, name, chunks=chunks, dtype=x.dtype,
                    meta=x[:0])


def check_dask_operand(x: da.Array, n: int, name: str, func: str, ndim: int) -> None:
    """Refuse a dask x or X whose kind or shape is wrong, before any task is submitted (its
    values are checked by the tiles' tasks)."""
    check_array(x, name, func, accept_sparse=False, accept_dask=True, ndim=ndim,
                kinds=f"a {ndim}-D numpy or cupy array, or a dask array of them")
    if x.shape[0] != n:
        raise ValueError(f"The '{name}' parameter of {func} must have {n} rows, A's number of "
                         f"columns. Got shape {tuple(x.shape)} instead.")


def _one_chunk(x: da.Array) -> da.Array:
    """A dask x as one chunk (every tile reads all of it), lazily."""
    return x.rechunk(x.shape) if any(len(c) > 1 for c in x.chunks) else x


def _distributed(A: da.Array, x: Any, name: str, func: str, ndim: int,
                 check_finite: bool) -> da.Array:
    check_sparse_shape(A, func)
    check_dask_input(A, "A", func)
    A = row_tiles(A, func)  # a user's array re-cut into row tiles if need be
    if not is_sparse_array(A):  # dense chunks: the product of their CSR (A's nonzeros)
        A = csr_chunks(A)
    if is_dask_array(x):  # one chunk every tile reads, made in the graph, checked per tile
        check_dask_operand(x, A.shape[1], name, func, ndim)
    else:
        check_dense_operand(x, A.shape[1], name, func, ndim, finite=check_finite)
    client = current_client()
    x_d = _one_chunk(x) if is_dask_array(x) else _broadcast(x, client)
    dt = spmv_dtype(A.dtype, x.dtype)
    meta = array_module(A._meta).empty((0,) * ndim, dtype=dt)
    logger.debug("%s: %d row tiles of A %s, x %s", func, A.numblocks[0], A.shape, x.shape)
    out_ind, x_ind = ("i", "j") if ndim == 1 else ("ik", "jk")
    return da.blockwise(
        _spmv_block, out_ind,
        A, "ij", x_d, x_ind,
        op_name=func,
        check_finite=check_finite,
        concatenate=False,
        dtype=dt,
        meta=meta,
        name=f"mgpu-{func}-" + tokenize(A, x_d),
    )


def spmv(A: Any, x: Any, *, check_finite: bool = True, plan: Any = None) -> Any:
    """Sparse matrix times dense vector ``y = A @ x`` on one device or across a cluster.

    Parameters
    ----------
    A : sparse matrix of shape (n_rows, n_cols), or a dask array
        scipy or cupyx (one device, see :func:`mgpu.ops.spmv`), or a dask array: made by
        ``mgpu.from_scipy(A, parts, axis=0)`` (it stays on the workers), or your own, of
        sparse or dense chunks; one cut by columns too is re-cut into row tiles at nnz
        prefix sums (which counts its rows' nonzeros now).
    x : ndarray of shape (n_cols,), or a dask array
        numpy or cupy: with a dask A it is checked here and sent once to the cluster (to one
        worker, from which the others fetch it); on a GPU tile a host x is copied to the
        device. A dask x is read whole by every tile and checked by their tasks.
    check_finite : bool, default=True
        Refuse NaN or infinity in A's stored values and in x; ``False`` skips the check (and,
        on a GPU, the wait for it) for operands known to be finite, as in
        :func:`mgpu.ops.spmv`.
    plan : SpMVPlan, optional
        From :func:`mgpu.spmv_plan` on this very one-device A, for many products with it
        (see :func:`mgpu.ops.spmv`); not for a dask A.

    Returns
    -------
    y : ndarray of shape (n_rows,), or dask array
        For a dask A, a **dask array** chunked like A's rows (numpy chunks for CPU tiles,
        cupy for GPU tiles): call ``.compute()`` for the numpy result. Otherwise numpy for
        CPU input and cupy for GPU input. dtype: numpy's promotion of A's and x's, float64
        unless that is float32 or float64.

    Raises
    ------
    TypeError, ValueError
        As :func:`mgpu.ops.spmv`, before any task is submitted, for everything that can be
        seen without computing: kinds, shapes, NaN/inf in a numpy/cupy x. NaN or infinity
        in a tile of a dask A fails that tile's task with the same message. (NaN and
        infinity only with ``check_finite``.)

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp
    >>> from mgpu.distributed import from_scipy
    >>> A = sp.random(300, 50, density=0.05, format="csr", random_state=0)
    >>> x = np.arange(50.0)
    >>> tiles = from_scipy(A, 3, axis=0)
    >>> y = spmv(tiles, x)
    >>> y.chunks == (tiles.chunks[0],), np.allclose(y.compute(), A @ x)
    (True, True)
    """
    check_param(check_finite, "check_finite", "spmv", Boolean())
    if not is_dask_array(A) or plan is not None:  # a dask A with a plan: refused there
        return spmv_one_device(A, x, check_finite=check_finite, plan=plan)
    return _distributed(A, x, "x", "spmv", 1, bool(check_finite))


def spmm(A: Any, X: Any, *, check_finite: bool = True) -> Any:
    """Sparse matrix times dense matrix ``Y = A @ X`` on one device or across a cluster.

    Parameters
    ----------
    A : sparse matrix of shape (n_rows, n_cols), or a dask array of CSR row tiles
        As in :func:`spmv`.
    X : ndarray of shape (n_cols, n_vectors), or a dask array
        As x in :func:`spmv`.
    check_finite : bool, default=True
        As in :func:`spmv`.

    Returns
    -------
    Y : ndarray of shape (n_rows, n_vectors), or dask array
        For a dask A, a dask array chunked like A's rows and one chunk of columns;
        otherwise numpy (CPU) or cupy (GPU). dtype as in :func:`spmv`.

    Raises
    ------
    TypeError, ValueError
        As :func:`spmv`, with X 2-D and ``X.shape[0] == A.shape[1]``.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp
    >>> from mgpu.distributed import from_scipy
    >>> A = sp.random(200, 40, density=0.1, format="csr", random_state=1)
    >>> X = np.ones((40, 3))
    >>> Y = spmm(from_scipy(A, 4, axis=0), X)
    >>> Y.shape, np.allclose(Y.compute(), A @ X)
    ((200, 3), True)
    """
    check_param(check_finite, "check_finite", "spmm", Boolean())
    if not is_dask_array(A):
        return spmm_one_device(A, X, check_finite=check_finite)
    return _distributed(A, X, "X", "spmm", 2, bool(check_finite))
