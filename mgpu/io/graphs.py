"""SNAP edge lists (``u v`` per line, ``#`` comments) into an adjacency matrix.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal, overload

import numpy as np
import scipy.sparse as sp
from numpy.typing import DTypeLike

from mgpu.io._common import _gib, _read_text, _uint_table
from mgpu.io.errors import StrPath

logger = logging.getLogger(__name__)

__all__ = ["load_snap"]


# Beyond this a node id is almost surely a hash, not an index: refuse before allocating
# an indptr of that length (scipy's int32 indices stop here anyway).
_MAX_DENSE_ID = np.iinfo(np.int32).max - 1


def _parse_snap(path: StrPath, text: str) -> np.ndarray:
    return _uint_table(path, text, 2, "an edge 'u v'", comments="#", first_line=1)


@overload
def load_snap(
    path: StrPath,
    *,
    symmetric: bool = ...,
    self_loops: bool = ...,
    relabel: bool = ...,
    return_ids: Literal[False] = ...,
    dtype: DTypeLike = ...,
) -> sp.csr_matrix: ...


@overload
def load_snap(
    path: StrPath,
    *,
    symmetric: bool = ...,
    self_loops: bool = ...,
    relabel: bool = ...,
    return_ids: Literal[True],
    dtype: DTypeLike = ...,
) -> tuple[sp.csr_matrix, np.ndarray]: ...


def load_snap(
    path: StrPath,
    *,
    symmetric: bool = False,
    self_loops: bool = True,
    relabel: bool = False,
    return_ids: bool = False,
    dtype: DTypeLike = np.float32,
) -> sp.csr_matrix | tuple[sp.csr_matrix, np.ndarray]:
    """Read a SNAP edge list (``u v`` per line) into an n x n adjacency matrix.

    Lines starting with ``#`` are comments wherever they are (``#`` after an edge also ends
    it); tabs or spaces separate the ids; LF or CRLF line ends; the last line may lack its
    newline. Row ``u`` column ``v`` holds 1 for every edge ``u v``.

    Parameters
    ----------
    path : str or os.PathLike
        Plain or gzip-compressed edge list.
    symmetric : bool, default=False
        Also store ``v u`` for every ``u v`` (treat the graph as undirected).
    self_loops : bool, default=True
        Keep ``u u`` lines; ``False`` drops them from the matrix (the node stays).
    relabel : bool, default=False
        Compact the ids present in the file (as source or target, self loops included) to
        ``0..n-1`` in sorted order. Otherwise node ``i`` is id ``i`` and
        ``n = max id + 1`` (ids absent from the file are empty rows).
    return_ids : bool, default=False
        Also return ``ids``, the original id of every row: ``ids[i]`` is node ``i``'s id
        in the file (``np.arange(n)`` when ``relabel=False``). This is how the original
        ids are recovered after ``relabel=True``.
    dtype : dtype, default=np.float32
        dtype of the stored values.

    Returns
    -------
    A : scipy.sparse.csr_matrix of shape (n_nodes, n_nodes)
        Canonical CSR (sorted indices, no duplicates): a repeated edge is stored once with
        value 1.
    ids : ndarray of shape (n_nodes,), dtype int64
        Only with ``return_ids=True``.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    MalformedFileError
        On a line that is not two non-negative integers (negative, non-integer, missing
        or extra fields), or a truncated gzip stream.
    ValueError
        If ``relabel=False`` and an id is too large for a dense numbering (the message
        suggests ``relabel=True``).

    Examples
    --------
    >>> A = load_snap("graphs/facebook_combined.txt.gz", symmetric=True)  # doctest: +SKIP
    >>> A.shape, A.nnz  # doctest: +SKIP
    ((4039, 4039), 176468)
    >>> path = "graphs/ca-HepPh.txt.gz"
    >>> A, ids = load_snap(path, relabel=True, return_ids=True)  # doctest: +SKIP
    >>> A.shape[0], ids[:3]  # doctest: +SKIP
    (12008, array([ 1, 24, 31]))
    """
    edges = _parse_snap(path, _read_text(path))
    u, v = edges[:, 0], edges[:, 1]
    if relabel:
        ids = np.unique(np.concatenate([u, v]))
        u, v = np.searchsorted(ids, u), np.searchsorted(ids, v)
        n = ids.size
    else:
        n = int(edges.max()) + 1 if edges.size else 0
        if n - 1 > _MAX_DENSE_ID:
            raise ValueError(
                f"{Path(path).name}: node id {n - 1} would need a {n}-row adjacency matrix; "
                "pass relabel=True to number the ids present as 0..n-1."
            )
        import psutil

        need, avail = 16 * (n + 1), int(psutil.virtual_memory().available)
        if need > avail:  # the ids and the row pointers, before numpy is asked for them
            raise ValueError(
                f"{Path(path).name}: node id {n - 1} would need {_gib(need)} for a {n}-row "
                f"adjacency matrix's ids and row pointers, more than the {_gib(avail)} "
                "available; pass relabel=True to number the ids present as 0..n-1."
            )
        ids = np.arange(n, dtype=np.int64)
    if not self_loops:
        keep = u != v
        u, v = u[keep], v[keep]
    if symmetric:
        u, v = np.concatenate([u, v]), np.concatenate([v, u])
    A = sp.csr_matrix((np.ones(u.size, dtype=dtype), (u, v)), shape=(n, n))
    A.sum_duplicates()
    A.data[:] = 1  # duplicates were summed: a repeated edge is still one edge
    logger.debug("read %s: %d nodes, %d edge lines, %d stored", path, n, len(edges), A.nnz)
    return (A, ids) if return_ids else A
