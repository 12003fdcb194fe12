"""Edge lists into an adjacency matrix: SNAP's ``u v`` lines (:func:`load_snap`) and edge
lists with a third column, weights or times (:func:`load_edges`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal, overload

import numpy as np
import scipy.sparse as sp
from numpy.typing import DTypeLike

from mgpu.io._common import (
    _FLOAT,
    _LineCheck,
    _UINT,
    _diagnose,
    _first_bad_row,
    _gib,
    _line_of_row,
    _loadtxt,
    _read_text,
    _show,
    _uint_table,
)
from mgpu.io.errors import MalformedFileError, StrPath

logger = logging.getLogger(__name__)

__all__ = ["EDGE_VALUES", "load_edges", "load_snap"]


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
    u, v, ids = _number(path, edges[:, 0], edges[:, 1], relabel)
    A = _adjacency(u, v, None, ids.size, symmetric=symmetric, self_loops=self_loops, dtype=dtype)
    logger.debug("read %s: %d nodes, %d edge lines, %d stored", path, ids.size, len(edges), A.nnz)
    return (A, ids) if return_ids else A


def _number(path: StrPath, u: np.ndarray, v: np.ndarray, relabel: bool
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows and columns of the edges ``u -> v`` and the original id of every node: the ids
    present compacted to ``0..n-1`` (``relabel``), or id ``i`` as node ``i``."""
    if relabel:
        ids = np.unique(np.concatenate([u, v]))
        return np.searchsorted(ids, u), np.searchsorted(ids, v), ids
    n = int(max(u.max(), v.max())) + 1 if u.size else 0
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
    return u, v, np.arange(n, dtype=np.int64)


def _adjacency(u: np.ndarray, v: np.ndarray, w: np.ndarray | None, n: int, *,
               symmetric: bool, self_loops: bool, dtype: DTypeLike) -> sp.csr_matrix:
    """Canonical CSR of the edges ``u -> v``: value 1 where ``w`` is None (an edge repeated is
    one edge), else the edge's weight, the last one in file order where an edge repeats (a
    weight of 0 is stored)."""
    if not self_loops:
        keep = u != v
        u, v, w = u[keep], v[keep], None if w is None else w[keep]
    if symmetric:
        u, v = np.concatenate([u, v]), np.concatenate([v, u])
        w = None if w is None else np.concatenate([w, w])
    if w is None:
        A = sp.csr_matrix((np.ones(u.size, dtype=dtype), (u, v)), shape=(n, n))
        A.sum_duplicates()
        A.data[:] = 1  # duplicates were summed: a repeated edge is still one edge
        return A
    key = u.astype(np.int64) * max(n, 1) + v
    # Last occurrence of every (u, v): first occurrence in the reversed order; sorted by key.
    _, first_rev = np.unique(key[::-1], return_index=True)
    pick = key.size - 1 - first_rev
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(u[pick], minlength=n), out=indptr[1:])
    idx = np.int32 if max(n, pick.size) < np.iinfo(np.int32).max else np.int64
    # Built from its arrays, not from COO, so a weight of 0 stays an explicit entry.
    A = sp.csr_matrix((w[pick].astype(dtype), v[pick].astype(idx), indptr.astype(idx)),
                      shape=(n, n))
    A.has_sorted_indices = True
    return A


# What the third column of an edge list holds: the value stored for its edge, and the layout
# named in messages.
EDGE_VALUES: dict[str, str] = {
    "weight": "'u v weight [time]' (the weight stored, a fourth column ignored)",
    "time": "'u v time' (the time ignored, every edge stored once as 1)",
}


def _edges_check(sep: str | None, ncols: int, layout: str) -> _LineCheck:
    def check(line: str) -> tuple[str, str] | None:
        f = [s.strip() for s in line.split(sep)]
        if len(f) != ncols or not (_UINT.fullmatch(f[0]) and _UINT.fullmatch(f[1])
                                   and all(_FLOAT.fullmatch(t) for t in f[2:])):
            return f"{layout} ({ncols} columns: two non-negative integer ids, numbers)", \
                _show(line)
        return None

    return check


def _drop_header(text: str) -> str:
    """``text`` without a header line of column names (the first line that is neither blank
    nor a comment, if it does not start with a digit); its line end stays, and with it
    every line's number."""
    pos = 0
    while pos < len(text):
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        line = text[pos:end].split("#", 1)[0].strip()
        if line:
            return text if line[:1].isdigit() else text[:pos] + text[end:]
        pos = end + 1
    return text


def _parse_edges(path: StrPath, text: str, values: str
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(u, v, third column)`` of an edge list: ``#`` comments, one header line of words
    allowed, whitespace or comma separated (told from the first data line)."""
    text = _drop_header(text)
    first_line = 1
    first = next((s.split("#", 1)[0] for s in text[: 1 << 16].split("\n")
                  if s.split("#", 1)[0].strip()), "")
    sep = "," if "," in first else None
    ncols = len(first.split(sep)) if first else 3
    layout = EDGE_VALUES[values].split(" (")[0]
    if values == "time":
        ncols = 3
    elif ncols not in (3, 4):
        ncols = 3 if ncols < 3 else 4
    names = ("u", "v", "x", "y")[:ncols]
    dtype = np.dtype([(n, np.int64 if n in "uv" else np.float64) for n in names])
    check = _edges_check(sep, ncols, layout)
    try:
        t = _loadtxt(text, dtype=dtype, delimiter=sep, comments="#").ravel()
    except (ValueError, OverflowError) as exc:
        raise _diagnose(path, text, check, comments="#", first_line=first_line,
                        fallback=(layout, str(exc)), delimited=sep is not None) from None
    u, v, x = t["u"], t["v"], t["x"]
    r = _first_bad_row((u < 0) | (v < 0) | ~np.isfinite(x))
    if r is not None:
        raise MalformedFileError(path, _line_of_row(text, r, "#", first_line, sep is not None),
                                 f"{layout} with non-negative integer ids and a finite "
                                 f"{values}", f"u={u[r]}, v={v[r]}, {values}={x[r]}")
    return u, v, x


def load_edges(
    path: StrPath,
    *,
    values: str = "weight",
    symmetric: bool = False,
    self_loops: bool = True,
    relabel: bool = False,
    return_ids: bool = False,
    dtype: DTypeLike = np.float32,
) -> sp.csr_matrix | tuple[sp.csr_matrix, np.ndarray]:
    """Read an edge list whose third column holds a weight or a time into an n x n adjacency.

    ``u v weight`` lines (a fourth column, often a time, ignored) or SNAP's temporal
    networks' ``u v time`` lines, whitespace or comma separated; ``#`` starts a comment
    wherever it is, and the first line may name the columns (``source target weight``).
    Row ``u`` column ``v`` holds the edge's weight, or 1 for a time.

    Parameters
    ----------
    path : str or os.PathLike
        Plain or gzip-compressed edge list.
    values : {"weight", "time"}, default="weight"
        What the third column holds. ``"weight"``: stored as the edge's value; an edge
        listed more than once keeps its **last** weight (a warning gives the count), a weight
        of 0 is stored. ``"time"``: ignored (mgpu's graph operations take no times), every
        edge stored once with value 1, as :func:`load_snap` stores it.
    symmetric : bool, default=False
        Also store ``v u`` for every ``u v`` (treat the graph as undirected).
    self_loops : bool, default=True
        Keep ``u u`` lines; ``False`` drops them from the matrix (the node stays).
    relabel : bool, default=False
        Compact the ids present to ``0..n-1`` in sorted order; otherwise node ``i`` is id
        ``i`` (as :func:`load_snap`).
    return_ids : bool, default=False
        Also return ``ids``: ``ids[i]`` is node ``i``'s id in the file.
    dtype : dtype, default=np.float32
        dtype of the stored values.

    Returns
    -------
    A : scipy.sparse.csr_matrix of shape (n_nodes, n_nodes)
        Canonical CSR (sorted indices, no duplicates).
    ids : ndarray of shape (n_nodes,), dtype int64
        Only with ``return_ids=True``.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    MalformedFileError
        On a line that is not two non-negative integer ids and finite numbers, a line with
        another number of columns than the first (3 or 4 for weights, 3 for times), or a
        truncated gzip stream.
    ValueError
        If ``values`` is not ``"weight"`` or ``"time"``, or ``relabel=False`` and an id is
        too large for a dense numbering.

    Examples
    --------
    >>> A, ids = load_edges("graphs/weighted.txt", relabel=True, return_ids=True)  # doctest: +SKIP
    >>> A = load_edges("graphs/sx-mathoverflow.txt.gz", values="time")  # doctest: +SKIP
    """
    if values not in EDGE_VALUES:
        raise ValueError(f"The 'values' parameter of load_edges must be one of "
                         f"{sorted(EDGE_VALUES)}. Got {values!r} instead.")
    u, v, x = _parse_edges(path, _read_text(path), values)
    u, v, ids = _number(path, u, v, relabel)
    w = x if values == "weight" else None
    if w is not None:
        n_pairs = np.unique(u.astype(np.int64) * max(ids.size, 1) + v).size
        if n_pairs != u.size:
            logger.warning("%s: %d edges are listed more than once; kept the last weight of "
                           "each", Path(path).name, u.size - n_pairs)
    A = _adjacency(u, v, w, ids.size, symmetric=symmetric, self_loops=self_loops, dtype=dtype)
    logger.debug("read %s (%s): %d nodes, %d edge lines, %d stored", path, values, ids.size,
                 u.size, A.nnz)
    return (A, ids) if return_ids else A
