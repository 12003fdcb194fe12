"""A user's own dask arrays, whatever their chunking, made into what an op takes.

mgpu's ops take any 2-D dask array: chunks of scipy or cupyx sparse matrices (``csr_array``
or ``csr_matrix``, any format) or dense numpy/cupy chunks, cut by rows, by columns, in a
grid or in one chunk. An op that works on row tiles (SpMV, kNN, the models) re-cuts an array
that is also cut by columns into row tiles of about equal nonzeros (nnz prefix sums,
:func:`mgpu.partition.split_counts`); that takes one pass over the array to count each row's
nonzeros, and says so at DEBUG. Everything else stays lazy: the chunks are converted to
CSR (sparse chunks only, so that dense input keeps its dense kernels) in the graph,
on the workers.

Arrays made by :func:`mgpu.from_scipy` (or persisted) are already placed and are taken as
they are (:func:`is_placed`).
"""
from __future__ import annotations

import logging
import uuid
from typing import Any

import dask.array as da
import numpy as np
import scipy.sparse as sp
from dask.core import flatten

from mgpu.backends import is_sparse, sparse_module, to_host
from mgpu.ops.validation import check_array
from mgpu.partition import split_counts

logger = logging.getLogger(__name__)

__all__ = ["check_dask_input", "csr_chunks", "gather_ratings", "is_placed", "is_sparse_array",
           "one_chunk", "row_chunks", "row_nnz", "row_tiles"]


def check_dask_input(x: Any, name: str, func: str) -> None:
    """Refuse a dask array an op cannot take, before any task is submitted: not 2-D, values
    that are not real numbers, or chunk sizes that are not known."""
    check_array(x, name, func, accept_dask=True)
    if any(np.isnan(c).any() for c in (np.array(x.chunks[0], float),
                                       np.array(x.chunks[1], float))):
        raise ValueError(f"The '{name}' parameter of {func} has unknown chunk sizes; call "
                         f"{name}.compute_chunk_sizes() first.")


def is_placed(x: da.Array) -> bool:
    """Whether every chunk of x is a future of its own key (:func:`mgpu.from_scipy`, or
    ``client.persist``): data on the workers, not a graph still to run."""
    from distributed import Future

    graph = x.__dask_graph__()
    return all(isinstance(graph.get(k), Future) and graph[k].key == k
               for k in flatten(x.__dask_keys__()))


def is_sparse_array(x: da.Array) -> bool:
    """Whether a dask array's chunks are sparse matrices (by its ``_meta``)."""
    return bool(is_sparse(x._meta))


def _csr(block: Any) -> Any:
    """A chunk as CSR of its device and kind: scipy ``csr_array`` for a scipy sparse array,
    scipy ``csr_matrix`` for a scipy matrix or a numpy chunk, cupyx CSR for CuPy data.
    Duplicate entries of a CSR chunk are kept, so that each op treats them as it does on one
    device (SDDMM refuses them, SpMV sums them)."""
    if isinstance(block, sp.sparray):
        return sp.csr_array(block)
    return sparse_module(block).csr_matrix(block)


def csr_chunks(x: da.Array) -> da.Array:
    """x with every chunk CSR (:func:`_csr`), lazily; dense chunks included."""
    # a fresh name per call: Dask fuses these tasks into others differently from graph to
    # graph, and one key computed with two specs is what its scheduler warns of
    return x.map_blocks(_csr, dtype=x.dtype, meta=_csr(x._meta[:0, :0]),
                        name=f"mgpu-csr-chunks-{uuid.uuid4().hex}")


def _normal(x: da.Array) -> da.Array:
    """Sparse chunks as CSR, dense chunks as they are."""
    return csr_chunks(x) if is_sparse_array(x) else x


def _row_counts(block: Any) -> np.ndarray:
    """Each row's nonzeros in one chunk, as a column (numpy, from either device)."""
    counts = np.diff(to_host(_csr(block).indptr)) if is_sparse(block) \
        else to_host((block != 0).sum(axis=1))
    return np.asarray(counts, dtype=np.int64).reshape(-1, 1)


def row_nnz(x: da.Array) -> np.ndarray:
    """Each row's nonzeros over all its column chunks (computed: one pass over x)."""
    per_block = x.map_blocks(_row_counts, dtype=np.int64,
                             chunks=(x.chunks[0], (1,) * x.numblocks[1]),
                             meta=np.empty((0, 0), dtype=np.int64),
                             name=f"mgpu-row-nnz-{uuid.uuid4().hex}")
    return np.asarray(per_block.sum(axis=1).compute(), dtype=np.int64)


def row_tiles(x: da.Array, func: str, parts: int | None = None) -> da.Array:
    """x as row tiles (one chunk across the columns), sparse chunks as CSR.

    A placed array already cut by rows (:func:`mgpu.from_scipy`) is taken as it is. An
    array cut by rows only keeps its cut. An array also cut by columns is re-cut into
    ``parts`` row tiles (default: as many as it had chunks) at nnz prefix sums, which
    counts its rows' nonzeros now (one pass); the rest stays lazy.
    """
    if x.numblocks[1] == 1:
        return x if is_placed(x) else _normal(x)
    x = _normal(x)
    n = int(x.shape[0])
    parts = max(1, min(parts or x.npartitions, n))
    bounds = split_counts(row_nnz(x), parts)
    sizes = tuple(int(s) for s in np.diff(bounds) if s > 0) or (n,)
    logger.debug("%s: re-cutting a %d x %d dask array of %s chunks into %d row tiles at nnz "
                 "prefix sums (rows per tile %s)", func, x.shape[0], x.shape[1],
                 x.numblocks, len(sizes), list(sizes))
    return _normal(x.rechunk((sizes, (int(x.shape[1]),))))


def row_chunks(x: da.Array, func: str) -> da.Array:
    """x with one chunk across the columns and its own row chunks (queries streamed by
    rows need no balance), sparse chunks as CSR, lazily."""
    if x.numblocks[1] != 1:
        logger.debug("%s: joining the %d column chunks of a dask array", func, x.numblocks[1])
        x = x.rechunk({1: -1})
    return _normal(x)


def one_chunk(x: da.Array, func: str) -> da.Array:
    """x as a single chunk (what an op needs whole: a kNN index queried by chunks of
    queries, the graph of Jaccard weights, the Y of pairwise distances), lazily."""
    if x.numblocks != (1, 1):
        logger.debug("%s: gathering a dask array of %s chunks into one chunk", func,
                     x.numblocks)
        x = x.rechunk(x.shape)
    return _normal(x)


def gather_ratings(R: da.Array, name: str) -> sp.csr_matrix:
    """A dask array of ratings (sparse or dense chunks, any chunking) as one scipy CSR
    matrix, for :class:`mgpu.MatrixFactorization`, whose planner divides all the ratings
    into blocks on the client. Dense chunks rate the pairs of their nonzeros."""
    check_dask_input(R, name, "MatrixFactorization.fit")
    logger.debug("MatrixFactorization.fit: computing a dask array of %s chunks of ratings",
                 R.numblocks)
    return sp.csr_matrix(to_host(one_chunk(R, "MatrixFactorization.fit").compute()))
