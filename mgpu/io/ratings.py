"""MovieLens ratings (``u.data``, ``ratings.dat``, ``ratings.csv``) into a users x items
matrix with the original ids of its rows and columns.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from mgpu.io._common import (
    _FLOAT,
    _UINT,
    _diagnose,
    _first_bad_row,
    _line_of_row,
    _LineCheck,
    _loadtxt,
    _read_text,
    _show,
    _split_header,
)
from mgpu.io.errors import MalformedFileError, StrPath

logger = logging.getLogger(__name__)

__all__ = ["Ratings", "load_ratings"]


class Ratings(NamedTuple):
    """A ratings matrix with the original ids of its rows and columns.

    Attributes
    ----------
    matrix : scipy.sparse.csr_matrix of shape (n_users, n_items), dtype float32
        Canonical CSR, one stored entry per rating (a rating of 0 is stored explicitly), so
        ``matrix.tocoo()`` gives the (user, item, rating) triplets without loss.
    user_ids : ndarray of shape (n_users,), dtype int64
        Sorted original user ids: row ``i`` is user ``user_ids[i]``.
    item_ids : ndarray of shape (n_items,), dtype int64
        Sorted original item ids: column ``j`` is item ``item_ids[j]``.
    """

    matrix: sp.csr_matrix
    user_ids: np.ndarray
    item_ids: np.ndarray


_RATINGS_DTYPE = np.dtype([("user", np.int64), ("item", np.int64), ("rating", np.float64)])


def _ratings_check(sep: str | None) -> _LineCheck:
    def check(line: str) -> tuple[str, str] | None:
        f = [s.strip() for s in line.split(sep)]
        if len(f) < 3 or not (
            _UINT.fullmatch(f[0]) and _UINT.fullmatch(f[1]) and _FLOAT.fullmatch(f[2])
        ):
            return "'user item rating ...' (two non-negative integer ids, a number)", _show(line)
        return None

    return check


def _parse_ratings(path: StrPath, text: str) -> Ratings:
    head, rest = _split_header(text, 1)
    first_line = 1
    if head and head[0].strip() and not head[0].lstrip()[:1].isdigit():
        # A header line (ratings.csv: userId,movieId,rating,timestamp[,,,,]).
        text, first_line = rest, 2
    first = next((s for s in text[: 1 << 16].split("\n") if s.strip()), "")
    if "::" in first:
        sep, kind = "::", "ratings.dat"
    elif "," in first:
        sep, kind = ",", "csv"
    else:
        sep, kind = None, "u.data"
    body = text.replace("::", "\t") if sep == "::" else text
    delim = "," if sep == "," else None
    try:
        t = _loadtxt(body, dtype=_RATINGS_DTYPE, delimiter=delim, usecols=(0, 1, 2), comments=None)
    except (ValueError, OverflowError) as exc:
        raise _diagnose(
            path,
            body,
            _ratings_check(delim),
            comments=None,
            first_line=first_line,
            fallback=("'user item rating ...' lines", str(exc)),
            delimited=delim is not None,
        ) from None
    t = t.ravel()
    user, item, rating = t["user"], t["item"], t["rating"]
    r = _first_bad_row((user < 0) | (item < 0) | ~np.isfinite(rating))
    if r is not None:
        raise MalformedFileError(
            path,
            _line_of_row(body, r, None, first_line, delim is not None),
            "non-negative integer ids and a finite rating",
            f"user={user[r]}, item={item[r]}, rating={rating[r]}",
        )
    user_ids, u = np.unique(user, return_inverse=True)
    item_ids, i = np.unique(item, return_inverse=True)
    n_users, n_items = user_ids.size, item_ids.size
    key = u.astype(np.int64) * n_items + i
    # Last occurrence of every (user, item): first occurrence in the reversed order.
    uniq, first_rev = np.unique(key[::-1], return_index=True)
    if uniq.size != key.size:
        logger.warning(
            "%s: %d (user, item) pairs are rated more than once; kept the last rating of each",
            Path(path).name,
            key.size - uniq.size,
        )
    pick = key.size - 1 - first_rev  # sorted by key, i.e. by (user, item)
    rows, cols = u[pick], i[pick]
    indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n_users), out=indptr[1:])
    idx_dtype = np.int32 if max(n_items, pick.size) < np.iinfo(np.int32).max else np.int64
    # Built from its arrays, not from COO, so a rating of 0 stays an explicit entry.
    A = sp.csr_matrix(
        (rating[pick].astype(np.float32), cols.astype(idx_dtype), indptr.astype(idx_dtype)),
        shape=(n_users, n_items),
    )
    A.has_sorted_indices = True
    logger.debug("read %s (%s): %d users x %d items, %d ratings", path, kind, *A.shape, A.nnz)
    return Ratings(A, user_ids, item_ids)


def load_ratings(path: StrPath) -> Ratings:
    """Read MovieLens ratings (``u.data``, ``ratings.dat`` or ``ratings.csv``).

    The layout is told from the first line: ``::`` separated (``ratings.dat``), comma
    separated (``ratings.csv``, header ``userId,movieId,rating,timestamp`` optional, extra
    trailing fields ignored) or whitespace separated (``u.data``, tab). Only the first
    three columns are read (user, item, rating); the timestamp is not needed.

    Parameters
    ----------
    path : str or os.PathLike
        Plain or gzip-compressed ratings file.

    Returns
    -------
    ratings : Ratings
        ``(matrix, user_ids, item_ids)``: a float32 users x items CSR over compacted ids
        (``0..n-1`` in sorted order of the original ids, which ``user_ids`` / ``item_ids``
        give back). Every rating is one stored entry, zeros included, so the triplets come
        back with ``matrix.tocoo()``. A (user, item) pair rated more than once keeps its
        **last** rating (in file order) and a warning is logged with the count.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    MalformedFileError
        On a line that is not ``user item rating ...`` with non-negative integer ids and a
        finite rating, or a truncated gzip stream.

    Examples
    --------
    >>> R = load_ratings("ratings/ml-latest-small-2016_ratings.csv.gz")  # doctest: +SKIP
    >>> R.matrix.shape, R.matrix.nnz  # doctest: +SKIP
    ((671, 9066), 100004)
    >>> coo = R.matrix.tocoo(); R.user_ids[coo.row[0]], R.item_ids[coo.col[0]]  # doctest: +SKIP
    (1, 31)
    """
    return _parse_ratings(path, _read_text(path))
