"""Bag-of-words corpora: UCI ``docword`` files and Blei's LDA-C format, and
:func:`load_bow`, which tells the two apart by content.
"""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu.io._common import (
    _UINT,
    _check_rows_fit,
    _first_bad_row,
    _line_of_row,
    _read_text,
    _show,
    _split_header,
    _uint_table,
)
from mgpu.io.errors import MalformedFileError, StrPath

logger = logging.getLogger(__name__)

__all__ = ["load_bow", "load_docword", "load_ldac"]


def _parse_docword(path: StrPath, text: str) -> sp.csr_matrix:
    head, body = _split_header(text, 3)
    header: list[int] = []
    for i, name in enumerate(("D", "W", "NNZ")):
        line = head[i] if i < len(head) else None
        if line is None or not _UINT.fullmatch(line.strip()):
            raise MalformedFileError(
                path,
                i + 1,
                f"the header count {name} (one non-negative integer)",
                "end of file" if line is None else _show(line),
            )
        header.append(int(line))
    d, w, nnz = header
    _check_rows_fit(path, 1, "document count D", d)
    layout = "'docID wordID count'"
    t = _uint_table(path, body, 3, layout, comments=None, first_line=4)
    if len(t) != nnz:
        raise MalformedFileError(path, 3, f"NNZ={nnz} {layout} lines as declared here", f"{len(t)}")
    for col, limit, what in ((0, d, "docID in 1..D"), (1, w, "wordID in 1..W")):
        r = _first_bad_row((t[:, col] < 1) | (t[:, col] > limit))
        if r is not None:
            raise MalformedFileError(
                path,
                _line_of_row(body, r, None, 4),
                f"{what} (D={d}, W={w})" if col == 0 else f"{what} (W={w})",
                f"{t[r, col]} in {' '.join(map(str, t[r]))!r}",
            )
    A = sp.csr_matrix((t[:, 2].astype(np.float32), (t[:, 0] - 1, t[:, 1] - 1)), shape=(d, w))
    A.sum_duplicates()
    return A


def load_docword(path: StrPath) -> sp.csr_matrix:
    """Read a UCI Bag-of-Words ``docword.*.txt`` file into a document x term matrix.

    The file holds three header lines ``D``, ``W``, ``NNZ`` then ``NNZ`` lines
    ``docID wordID count`` with 1-based ids.

    Parameters
    ----------
    path : str or os.PathLike
        Plain or gzip-compressed ``docword`` file.

    Returns
    -------
    A : scipy.sparse.csr_matrix of shape (D, W), dtype float32
        Documents are rows, terms columns, counts as float32 (exact up to 2**24, far above
        any per-document count; float32 is what the kernels take). A pair repeated within
        a document is summed.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    MalformedFileError
        If a header line is not one integer, a body line is not three non-negative
        integers, an id is outside ``1..D`` / ``1..W``, the number of body lines differs
        from ``NNZ``, ``D`` needs more memory for the row pointers than is available, or
        the gzip stream is truncated.

    Examples
    --------
    >>> A = load_docword("docword.kos.txt.gz")  # doctest: +SKIP
    >>> A.shape  # doctest: +SKIP
    (3430, 6906)
    """
    A = _parse_docword(path, _read_text(path))
    logger.debug("read %s: %d docs x %d terms, %d stored", path, *A.shape, A.nnz)
    return A


# One document per line: N then N pairs id:count. Digits are capped at 18 so that every
# id fits int64 (and the line is reported instead of overflowing).
_LDAC_LINE = r"[ \t]*\d{1,18}(?:[ \t]+\d{1,18}:\d{1,18})*[ \t]*\r?"
_LDAC_BAD = re.compile(rf"^(?!{_LDAC_LINE}$).*$", re.MULTILINE)


def _parse_ldac(path: StrPath, text: str, n_terms: int | None) -> sp.csr_matrix:
    # Only trailing blank lines are dropped: a blank line inside would shift every
    # following document's row and is reported instead.
    text = text.rstrip(" \t\r\n")
    layout = "'N id:count ...'"
    if not text:
        return sp.csr_matrix((0, n_terms or 0), dtype=np.float32)
    bad = _LDAC_BAD.search(text)
    if bad is not None:
        line = text.count("\n", 0, bad.start()) + 1
        found = _show(bad.group()) if bad.group().strip() else "an empty line"
        raise MalformedFileError(path, line, layout, found)
    lines = text.split("\n")
    pairs = np.fromiter((s.count(":") for s in lines), dtype=np.int64, count=len(lines))
    per_line = 1 + 2 * pairs
    try:
        with warnings.catch_warnings():
            # numpy warns (rather than raises) where it stops parsing early.
            warnings.simplefilter("error", DeprecationWarning)
            flat = np.fromstring(text.replace(":", " "), dtype=np.int64, sep=" ")
    except (DeprecationWarning, ValueError) as exc:  # pragma: no cover (regex-checked)
        raise MalformedFileError(path, None, layout, str(exc)) from None
    if flat.size != per_line.sum():  # pragma: no cover (the regex admits only digits)
        raise MalformedFileError(path, None, layout, f"{flat.size} parsable numbers")
    starts = np.cumsum(per_line) - per_line
    declared = flat[starts]
    r = _first_bad_row(declared != pairs)
    if r is not None:
        raise MalformedFileError(path, r + 1, f"{layout} with N={declared[r]} pairs", f"{pairs[r]}")
    is_pair = np.ones(flat.size, dtype=bool)
    is_pair[starts] = False
    pv = flat[is_pair].reshape(-1, 2)
    term, count = pv[:, 0], pv[:, 1]
    rows = np.repeat(np.arange(len(lines)), pairs)
    if n_terms is None:
        n_terms = int(term.max()) + 1 if term.size else 0
    else:
        k = _first_bad_row(term >= n_terms)
        if k is not None:
            raise MalformedFileError(
                path,
                int(rows[k]) + 1,
                f"term ids in 0..{n_terms - 1} (n_terms={n_terms})",
                f"{term[k]}",
            )
    A = sp.csr_matrix((count.astype(np.float32), (rows, term)), shape=(len(lines), n_terms))
    A.sum_duplicates()
    return A


def _check_n_terms(n_terms: Any, func: str) -> None:
    if n_terms is not None and (
        isinstance(n_terms, bool) or not isinstance(n_terms, (int, np.integer)) or n_terms < 0
    ):
        raise ValueError(
            f"The 'n_terms' parameter of {func} must be a non-negative int or None. "
            f"Got {n_terms!r} instead."
        )


def load_ldac(path: StrPath, n_terms: int | None = None) -> sp.csr_matrix:
    """Read a corpus in Blei's LDA-C format into a document x term matrix.

    One document per line: ``N id:count id:count ...`` with ``N`` the number of pairs and
    0-based term ids (indices into the vocabulary file).

    Parameters
    ----------
    path : str or os.PathLike
        Plain or gzip-compressed ``.dat`` file.
    n_terms : int, optional
        Vocabulary size (the number of columns). Default: largest id + 1, which is
        smaller than the vocabulary when its last terms never occur; pass the vocabulary
        length to get matching columns.

    Returns
    -------
    A : scipy.sparse.csr_matrix of shape (n_docs, n_terms), dtype float32
        Row ``i`` is line ``i + 1``; counts as float32; an id repeated within a line is
        summed. Trailing blank lines are ignored.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    MalformedFileError
        If a line does not read ``N id:count ...`` (blank lines inside included), ``N``
        differs from the number of pairs, an id is ``>= n_terms``, or the gzip stream is
        truncated.
    ValueError
        If ``n_terms`` is not a non-negative int or None.

    Examples
    --------
    >>> A = load_ldac("bow/ap.dat.gz", n_terms=10473)  # doctest: +SKIP
    >>> A.shape, A.nnz, int(A.sum())  # doctest: +SKIP
    ((2246, 10473), 302031, 435838)
    """
    _check_n_terms(n_terms, "load_ldac")
    A = _parse_ldac(path, _read_text(path), n_terms)
    logger.debug("read %s: %d docs x %d terms, %d stored", path, *A.shape, A.nnz)
    return A


def _bow_kind(text: str) -> str | None:
    lines = [s.strip() for s in text[: 1 << 16].split("\n")[:4]]
    first = next((s for s in lines if s), "")
    if ":" in first:
        return "ldac"
    if len(lines) >= 3 and all(_UINT.fullmatch(s) for s in lines[:3]):
        return "docword"
    if _UINT.fullmatch(first):
        return "ldac"  # a corpus whose first document is empty ("0")
    return None


def load_bow(path: StrPath, *, n_terms: int | None = None) -> sp.csr_matrix:
    """Read a bag-of-words corpus, UCI ``docword`` or LDA-C, telling them apart by content.

    A file whose first three lines are single integers is ``docword`` (:func:`load_docword`);
    one whose first line holds ``id:count`` pairs is LDA-C (:func:`load_ldac`).

    Parameters
    ----------
    path : str or os.PathLike
        Plain or gzip-compressed corpus.
    n_terms : int, optional
        Passed to :func:`load_ldac`; for ``docword`` it must equal the header's ``W``.

    Returns
    -------
    A : scipy.sparse.csr_matrix of shape (n_docs, n_terms), dtype float32
        Documents are rows, terms columns.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    MalformedFileError
        As the chosen loader raises.
    ValueError
        If the file is neither format, ``n_terms`` is not a non-negative int or None, or
        it contradicts a docword header.

    Examples
    --------
    >>> load_bow("bow/ap.dat.gz").shape  # doctest: +SKIP
    (2246, 10473)
    """
    _check_n_terms(n_terms, "load_bow")
    text = _read_text(path)
    kind = _bow_kind(text)
    if kind is None:
        raise ValueError(
            f"{Path(path).name}: cannot tell the bag-of-words format; expected UCI docword "
            "(three header lines D, W, NNZ then 'docID wordID count') or LDA-C "
            "('N id:count id:count ...' per document)."
        )
    logger.debug("%s: bag-of-words format %s", path, kind)
    if kind == "ldac":
        return _parse_ldac(path, text, n_terms)
    A = _parse_docword(path, text)
    if n_terms is not None and n_terms != A.shape[1]:
        raise ValueError(
            f"n_terms={n_terms} contradicts the docword header of {Path(path).name} "
            f"(W={A.shape[1]})."
        )
    return A
