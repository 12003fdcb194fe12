"""Loaders for the sparse and dense datasets mgpu runs on, into scipy CSR or numpy arrays.

Every loader reads plain or gzip-compressed files (recognised by the gzip magic bytes, not
the name), parses the whole text at once with numpy (``np.loadtxt`` / ``np.fromstring``)
and only walks the file line by line after that fast path has failed, to say exactly where
and why: a :class:`MalformedFileError` names the file, the 1-based line number (counting
every line the file has, comments and headers included), what was expected and what was
found. Binary formats (IDX, ``.npz``) say the byte offset instead.

Formats (``FORMATS`` lists them; :func:`load` detects them from the content):

=================  ==============================================  ==========================
format             files                                           loader
=================  ==============================================  ==========================
``matrix-market``  ``*.mtx``, ``*.mtx.gz``                         :func:`load_matrix_market`
``10x``            folder with ``matrix.mtx[.gz]``, ``features``/   :func:`load_10x`
                   ``genes.tsv[.gz]``, ``barcodes.tsv[.gz]``
``idx``            MNIST-style ``*-ubyte[.gz]``                    :func:`load_idx`
``npz``            ``*.npz`` / ``*.npy`` (never unpickled)          :func:`load_npz_array`
``ratings``        MovieLens ``u.data``, ``ratings.dat``,          :func:`load_ratings`
                   ``ratings.csv``
``docword``        UCI ``docword.*.txt[.gz]``                      :func:`load_docword`
``ldac``           Blei's LDA-C ``*.dat`` (``N id:count ...``)     :func:`load_ldac`
``snap``           SNAP edge lists ``*.txt[.gz]``                  :func:`load_snap`
=================  ==============================================  ==========================

This module imports neither CuPy nor Dask: it produces host data that the caller moves.
"""

from __future__ import annotations

import functools
import gzip
import inspect
import io
import logging
import os
import re
import tokenize
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, NamedTuple, overload

import numpy as np
import scipy.io
import scipy.sparse as sp
from numpy.typing import DTypeLike

logger = logging.getLogger(__name__)

StrPath = str | os.PathLike[str]

__all__ = [
    "FORMATS",
    "MalformedFileError",
    "Ratings",
    "TenX",
    "detect_format",
    "load",
    "load_10x",
    "load_bow",
    "load_docword",
    "load_idx",
    "load_ldac",
    "load_matrix_market",
    "load_npz_array",
    "load_ratings",
    "load_snap",
]

_GZIP_MAGIC = b"\x1f\x8b"
# Beyond this a node id is almost surely a hash, not an index: refuse before allocating
# an indptr of that length (scipy's int32 indices stop here anyway).
_MAX_DENSE_ID = np.iinfo(np.int32).max - 1


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------


class MalformedFileError(ValueError):
    """A file that does not follow its format.

    The message reads ``"<file name> line <n>: expected <what>, found <what>"`` (``line``
    becomes ``byte <offset>`` for binary formats, and is left out when no single line is
    at fault). The parts are also kept as attributes.

    Parameters
    ----------
    path : str or os.PathLike
        The file at fault; the message shows its name, ``path`` keeps it whole.
    line : int or None
        1-based line number, counting every line of the (decompressed) file.
    expected : str
        What the format requires there.
    found : str
        What the file holds instead.
    byte : int or None, default=None
        Byte offset (decompressed) for binary formats, used when ``line`` is None.

    Examples
    --------
    >>> str(MalformedFileError("data/ap.dat", 17, "'N id:count ...' with N=12 pairs", "11"))
    "ap.dat line 17: expected 'N id:count ...' with N=12 pairs, found 11"
    """

    def __init__(
        self,
        path: StrPath,
        line: int | None,
        expected: str,
        found: str,
        *,
        byte: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.line = line
        self.byte = byte
        self.expected = expected
        self.found = found
        where = self.path.name
        if line is not None:
            where += f" line {line}"
        elif byte is not None:
            where += f" byte {byte}"
        super().__init__(f"{where}: expected {expected}, found {found}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its parts, so that it crosses a process boundary (a Dask worker).
        return (
            functools.partial(type(self), byte=self.byte),
            (self.path, self.line, self.expected, self.found),
        )


def _show(line: str, limit: int = 60) -> str:
    """A line as it appears in messages: quoted, without its line end, cut to ``limit``."""
    line = line.rstrip("\r\n")
    if len(line) > limit:
        line = line[: limit - 3] + "..."
    return repr(line)


# --------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------


def _read_bytes(path: StrPath) -> bytes:
    """The whole file, gunzipped when it starts with the gzip magic bytes."""
    p = Path(path)
    with p.open("rb") as f:  # FileNotFoundError names the path
        raw = f.read()
    if raw[:2] != _GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise MalformedFileError(
            p, None, "a complete gzip stream", f"a truncated or corrupt one ({exc})"
        ) from None


def _peek_bytes(path: StrPath, n: int = 1 << 16) -> bytes:
    """The first ``n`` (decompressed) bytes, for format detection."""
    p = Path(path)
    with p.open("rb") as f:
        head = f.read(2)
        f.seek(0)
        if head != _GZIP_MAGIC:
            return f.read(n)
        try:
            with gzip.GzipFile(fileobj=f) as g:
                return g.read(n)
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise MalformedFileError(
                p, None, "a complete gzip stream", f"a truncated or corrupt one ({exc})"
            ) from None


def _decode(path: StrPath, data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise MalformedFileError(
            path, line, "UTF-8 text", f"byte 0x{data[exc.start]:02x}"
        ) from None
    if "\r" in text:
        # CRLF -> LF keeps every line number; loadtxt's delimited mode would otherwise
        # read the CR into the last field.
        text = text.replace("\r\n", "\n")
    # A spreadsheet's byte-order mark must not become part of the first field.
    return text[1:] if text.startswith("\ufeff") else text


def _read_text(path: StrPath) -> str:
    return _decode(path, _read_bytes(path))


def _split_header(text: str, n: int) -> tuple[list[str], str]:
    """The first ``n`` lines and the rest of the text (which starts on line ``n + 1``)."""
    head: list[str] = []
    pos = 0
    for _ in range(n):
        end = text.find("\n", pos)
        if end < 0:
            if pos < len(text):  # a last line without its newline
                head.append(text[pos:])
            pos = len(text)
            break
        head.append(text[pos:end])
        pos = end + 1
    return head, text[pos:]


# --------------------------------------------------------------------------------------
# Fast table parsing with exact diagnostics on failure
# --------------------------------------------------------------------------------------

# check(line_without_comment) -> None when fine, else (expected, found)
_LineCheck = Callable[[str], "tuple[str, str] | None"]


def _data_lines(
    text: str, comments: str | None, first_line: int, delimited: bool = False
) -> Iterator[tuple[int, str]]:
    """(line number, line with comment cut) for every line np.loadtxt reads as a row.

    loadtxt skips empty lines, and whitespace-only ones too unless a delimiter is set.
    """
    for i, line in enumerate(text.split("\n")):
        if comments is not None:
            line = line.split(comments, 1)[0]
        if line if delimited else line.strip():
            yield first_line + i, line


def _diagnose(
    path: StrPath,
    text: str,
    check: _LineCheck,
    *,
    comments: str | None,
    first_line: int,
    fallback: tuple[str, str],
    delimited: bool = False,
) -> MalformedFileError:
    """The error for the first line that fails ``check`` (``fallback`` if none does)."""
    for lineno, line in _data_lines(text, comments, first_line, delimited):
        bad = check(line)
        if bad is not None:
            return MalformedFileError(path, lineno, *bad)
    return MalformedFileError(path, None, *fallback)


def _line_of_row(
    text: str, row: int, comments: str | None, first_line: int, delimited: bool = False
) -> int:
    """File line number of data row ``row`` (0-based, blank and comment lines skipped)."""
    for k, (lineno, _) in enumerate(_data_lines(text, comments, first_line, delimited)):
        if k == row:
            return lineno
    raise AssertionError("row beyond the data")  # pragma: no cover


def _loadtxt(text: str, **kw: Any) -> np.ndarray:
    with warnings.catch_warnings():
        # An empty body is a valid (empty) table here, not a warning.
        warnings.filterwarnings("ignore", message=".*[Ee]mpty input.*")
        warnings.filterwarnings("ignore", message=".*input contained no data.*")
        return np.loadtxt(io.StringIO(text), ndmin=2, **kw)


_UINT = re.compile(r"\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|nan)", re.IGNORECASE)


def _int_columns_check(ncols: int, layout: str) -> _LineCheck:
    def check(line: str) -> tuple[str, str] | None:
        tokens = line.split()
        if len(tokens) != ncols or not all(_UINT.fullmatch(t) for t in tokens):
            return f"{layout} ({ncols} non-negative integers)", _show(line)
        return None

    return check


def _uint_table(
    path: StrPath, text: str, ncols: int, layout: str, *, comments: str | None, first_line: int
) -> np.ndarray:
    """An (m, ncols) int64 table of non-negative integers, whitespace separated."""
    check = _int_columns_check(ncols, layout)
    try:
        table = _loadtxt(text, dtype=np.int64, comments=comments)
    except (ValueError, OverflowError) as exc:
        raise _diagnose(
            path,
            text,
            check,
            comments=comments,
            first_line=first_line,
            fallback=(layout, str(exc)),
        ) from None
    if table.size == 0:
        return np.empty((0, ncols), dtype=np.int64)
    if table.shape[1] != ncols:
        raise _diagnose(
            path,
            text,
            check,
            comments=comments,
            first_line=first_line,
            fallback=(f"{ncols} columns", f"{table.shape[1]}"),
        )
    neg = np.flatnonzero((table < 0).any(axis=1))
    if neg.size:
        line = _line_of_row(text, int(neg[0]), comments, first_line)
        row = " ".join(map(str, table[neg[0]]))
        raise MalformedFileError(path, line, f"{layout} (non-negative integers)", repr(row))
    return table


def _gib(nbytes: int) -> str:
    """A byte count in GiB, or MiB below one GiB."""
    if nbytes < 2**30:
        return f"{nbytes / 2**20:,.1f} MiB"
    return f"{nbytes / 2**30:,.1f} GiB"


def _check_rows_fit(path: StrPath, line: int | None, what: str, rows: int) -> None:
    """Refuse a declared row count whose CSR row pointers alone (int64) would not fit in the
    memory available now: a corrupt or hostile header, refused before numpy is asked for
    the array."""
    import psutil

    need = 8 * (int(rows) + 1)
    avail = int(psutil.virtual_memory().available)
    if need > avail:
        raise MalformedFileError(
            path, line, f"a {what} whose row pointers fit in the {_gib(avail)} of memory "
            "available", f"{int(rows):,} ({_gib(need)} of row pointers)")


def _first_bad_row(mask: np.ndarray) -> int | None:
    bad = np.flatnonzero(mask)
    return int(bad[0]) if bad.size else None


# --------------------------------------------------------------------------------------
# Matrix Market
# --------------------------------------------------------------------------------------

_MM_LINE = re.compile(r"^Line (\d+):\s*(.*)$", re.DOTALL)
# scipy >= 1.17 takes spmatrix= and newer releases warn when it is left to its default (which
# turns to sparse arrays in 1.20); the loader converts to csr_matrix either way
_MMREAD_KW = ({"spmatrix": True}
              if "spmatrix" in inspect.signature(scipy.io.mmread).parameters else {})


_LEFT_TO_SCIPY = 1 << 26  # bytes: declared entries below this are allocated and then checked


def _mm_check_sizes(path: StrPath, data: bytes) -> None:
    """Refuse a size line that declares more than the file can hold, before scipy allocates
    for it: more entries than the bytes after the size line can spell (an entry of a
    coordinate file takes at least 4 bytes, ``"1 1\\n"``, a value of an array file 2), or
    more rows than memory can index. Lines the check cannot read are left to scipy."""
    end = data.find(b"\n")
    banner = data[:end if end >= 0 else len(data)].lower().split()
    line = 1
    while end >= 0:  # the size line: the first after the banner that is not a comment
        start, end = end + 1, data.find(b"\n", end + 1)
        line += 1
        text = data[start:end if end >= 0 else len(data)].strip()
        if text and not text.startswith(b"%"):
            break
    else:
        return
    try:
        sizes = [int(v) for v in text.split()]
    except ValueError:
        return
    if len(sizes) < 2 or min(sizes) < 0:
        return
    rest = len(data) - end - 1 if end >= 0 else 0
    rows, cols = sizes[0], sizes[1]
    if b"coordinate" in banner and len(sizes) == 3:
        stored, per = sizes[2], 4
    elif b"array" in banner and len(sizes) == 2:
        symmetric = any(w in banner for w in (b"symmetric", b"skew-symmetric", b"hermitian"))
        stored, per = (rows * cols) // (2 if symmetric else 1), 2
    else:
        return
    # small declarations are left to scipy, whose message names the truncated line
    if stored > rest // per + 1 and 16 * stored > _LEFT_TO_SCIPY:
        raise MalformedFileError(
            path, line, f"a size line whose {stored:,} entries fit in the {rest:,} bytes that "
            "follow it", _show(text.decode("utf-8", "replace")))
    _check_rows_fit(path, line, "row count", rows)


def _mm_from_bytes(path: StrPath, data: bytes) -> sp.csr_matrix:
    if not data.lstrip()[:14].lower().startswith(b"%%matrixmarket"):
        first = data.split(b"\n", 1)[0].decode("utf-8", "replace")
        raise MalformedFileError(path, 1, "a '%%MatrixMarket matrix ...' banner", _show(first))
    _mm_check_sizes(path, data)
    try:
        m = scipy.io.mmread(io.BytesIO(data), **_MMREAD_KW)
    except (ValueError, OverflowError) as exc:
        msg = str(exc)
        hit = _MM_LINE.match(msg)
        if hit:
            raise MalformedFileError(
                path, int(hit.group(1)), "a valid Matrix Market line", hit.group(2)
            ) from None
        raise MalformedFileError(path, None, "a valid Matrix Market file", msg) from None
    return sp.csr_matrix(m)


def load_matrix_market(path: StrPath) -> sp.csr_matrix:
    """Read a Matrix Market file (plain or gzip) into CSR.

    Parameters
    ----------
    path : str or os.PathLike
        A ``.mtx`` or ``.mtx.gz`` file (gzip is recognised by its magic bytes).

    Returns
    -------
    A : scipy.sparse.csr_matrix of shape (n_rows, n_cols)
        ``symmetric`` / ``skew-symmetric`` / ``hermitian`` files come back expanded (both
        triangles stored). Values keep the file's field: ``real`` -> float64, ``integer``
        -> int64 (counts stay exact; cast with ``A.astype(np.float32)`` where needed),
        ``complex`` -> complex128, ``pattern`` -> float64 ones. Duplicate coordinates are
        summed (CSR conversion). An ``array`` (dense) file is converted to CSR as well,
        dropping its zeros.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    MalformedFileError
        On a missing banner, a bad header or entry (with scipy's line number), a count
        that does not match the size line, a size line declaring more entries than the
        rest of the file can hold or more rows than the memory available can index
        (refused before anything is allocated), or a truncated gzip stream.

    Examples
    --------
    >>> A = load_matrix_market("matrices/bcsstk13.mtx.gz")  # doctest: +SKIP
    >>> A.shape, A.nnz  # doctest: +SKIP
    ((2003, 2003), 83883)
    """
    A = _mm_from_bytes(path, _read_bytes(path))
    logger.debug("read %s: %d x %d, %d stored (%s)", path, *A.shape, A.nnz, A.dtype)
    return A


# --------------------------------------------------------------------------------------
# SNAP edge lists
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# Bag of words
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# Ratings
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# 10x Genomics
# --------------------------------------------------------------------------------------


class TenX(NamedTuple):
    """A 10x Genomics feature-barcode matrix.

    Attributes
    ----------
    matrix : scipy.sparse.csr_matrix of shape (n_features, n_barcodes)
        Genes (features) are rows, barcodes columns, as in ``matrix.mtx``; integer counts
        stay int64 (see :func:`load_matrix_market`).
    features : ndarray of str, shape (n_features, n_columns)
        The tab-separated columns of ``features.tsv``: id, symbol, feature type (two
        columns for an older ``genes.tsv``).
    barcodes : ndarray of str, shape (n_barcodes,)
    """

    matrix: sp.csr_matrix
    features: np.ndarray
    barcodes: np.ndarray


def _find(folder: Path, stems: tuple[str, ...]) -> Path:
    for stem in stems:
        for name in (stem, stem + ".gz"):
            if (folder / name).is_file():
                return folder / name
    raise FileNotFoundError(
        f"{folder}: no {' or '.join(s + '[.gz]' for s in stems)} (expected a 10x "
        "feature-barcode matrix folder)"
    )


def _tsv_lines(path: Path) -> list[list[str]]:
    text = _read_text(path).rstrip("\r\n")
    rows = [s.rstrip("\r").split("\t") for s in text.split("\n")] if text else []
    for k, r in enumerate(rows):
        if len(r) != len(rows[0]) or not r[0]:
            raise MalformedFileError(
                path,
                k + 1,
                f"{len(rows[0])} tab-separated fields with a non-empty first",
                _show("\t".join(r)),
            )
    return rows


def _mm_size_line(data: bytes) -> int:
    """Line number of a Matrix Market size line (the first not starting with %)."""
    for k, line in enumerate(data[: 1 << 16].split(b"\n")):
        if not line.lstrip().startswith(b"%") and line.strip():
            return k + 1
    return 1


def load_10x(folder: StrPath) -> TenX:
    """Read a 10x Genomics ``filtered_feature_bc_matrix`` folder.

    Parameters
    ----------
    folder : str or os.PathLike
        Folder holding ``matrix.mtx[.gz]``, ``features.tsv[.gz]`` (or the older
        ``genes.tsv[.gz]``) and ``barcodes.tsv[.gz]``.

    Returns
    -------
    tenx : TenX
        ``(matrix, features, barcodes)``; the matrix has one row per feature line and one
        column per barcode line. Comment lines such as ``%metadata_json`` are skipped.

    Raises
    ------
    FileNotFoundError
        If the folder or one of the three files is missing.
    MalformedFileError
        If the matrix shape differs from the number of feature / barcode lines (reported
        at the matrix's size line), a tsv line has another number of fields than the
        first, or any file is malformed or truncated.

    Examples
    --------
    >>> t = load_10x("singlecell/visium_mouse_spaceranger3")  # doctest: +SKIP
    >>> t.matrix.shape, t.features[0, 1]  # doctest: +SKIP
    ((19465, 2898), 'Xkr4')
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder (expected a 10x matrix folder)")
    mpath = _find(folder, ("matrix.mtx",))
    fpath = _find(folder, ("features.tsv", "genes.tsv"))
    bpath = _find(folder, ("barcodes.tsv",))
    data = _read_bytes(mpath)
    A = _mm_from_bytes(mpath, data)
    features = _tsv_lines(fpath)
    barcodes = _tsv_lines(bpath)
    for axis, rows, p in ((0, features, fpath), (1, barcodes, bpath)):
        if A.shape[axis] != len(rows):
            what = "rows" if axis == 0 else "columns"
            raise MalformedFileError(
                mpath,
                _mm_size_line(data),
                f"{len(rows)} {what} (one per line of {p.name})",
                f"{A.shape[axis]}",
            )
    ncol = len(features[0]) if features else 1
    feats = np.array(features, dtype=str).reshape(len(features), ncol)
    bcs = np.array([r[0] for r in barcodes], dtype=str)
    logger.debug("read %s: %d features x %d barcodes, %d stored", folder, *A.shape, A.nnz)
    return TenX(A, feats, bcs)


# --------------------------------------------------------------------------------------
# Dense vectors
# --------------------------------------------------------------------------------------

# IDX type codes (third magic byte); all multi-byte types are big-endian.
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _idx_header_ok(head: bytes) -> bool:
    return (
        len(head) >= 4
        and head[0] == 0
        and head[1] == 0
        and head[2] in IDX_DTYPES
        and (1 <= head[3] <= 8)
    )


def load_idx(path: StrPath, *, flatten: bool = True) -> np.ndarray:
    """Read an IDX file (the MNIST format), plain or gzip.

    The header is two zero bytes, a type byte (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C
    int32, 0x0D float32, 0x0E float64), the number of dimensions, then one big-endian
    uint32 per dimension; the payload is the big-endian array. MNIST labels have magic
    0x00000801 (1-D uint8), images 0x00000803 (n x 28 x 28 uint8).

    Parameters
    ----------
    path : str or os.PathLike
        IDX file (``*-ubyte`` or ``*-ubyte.gz``).
    flatten : bool, default=True
        Return arrays of three or more dimensions as ``(n, prod(rest))`` (images as rows of
        784 pixels, what the distance code takes); ``False`` keeps the file's shape.

    Returns
    -------
    X : ndarray
        Native byte order, the file's type (uint8 for MNIST), shape ``(n,)`` for labels,
        ``(n, rows * cols)`` for images (``(n, rows, cols)`` with ``flatten=False``).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    MalformedFileError
        On a bad magic number, a header shorter than its dimensions, a payload shorter or
        longer than the dimensions say, or a truncated gzip stream.

    Examples
    --------
    >>> X = load_idx("vectors/mnist_t10k-images-idx3-ubyte.gz")  # doctest: +SKIP
    >>> X.shape, X.dtype  # doctest: +SKIP
    ((10000, 784), dtype('uint8'))
    """
    data = _read_bytes(path)
    if not _idx_header_ok(data[:4]):
        raise MalformedFileError(
            path,
            None,
            "an IDX magic number 0x0000TTDD (T in 08 09 0B 0C 0D 0E, D >= 1)",
            f"0x{data[:4].hex()}" if len(data) >= 4 else f"{len(data)} bytes",
            byte=0,
        )
    dt, ndim = IDX_DTYPES[data[2]], data[3]
    hdr = 4 + 4 * ndim
    if len(data) < hdr:
        raise MalformedFileError(
            path,
            None,
            f"{ndim} big-endian uint32 dimensions",
            f"{len(data) - 4} bytes",
            byte=4,
        )
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    need = int(np.prod(dims, dtype=np.int64)) * dt.itemsize
    have = len(data) - hdr
    if have != need:
        shape = " x ".join(map(str, dims))
        raise MalformedFileError(
            path, None, f"{need} bytes of {dt.name} data ({shape})", f"{have}", byte=hdr
        )
    X = np.frombuffer(data, dtype=dt, offset=hdr).reshape(dims)
    X = X.astype(dt.newbyteorder("="), copy=True)  # writable, native order
    if flatten and X.ndim > 2:
        X = X.reshape(X.shape[0], -1)
    logger.debug("read %s: %s %s", path, X.shape, X.dtype)
    return X


def load_npz_array(path: StrPath, key: str = "arr_0") -> np.ndarray:
    """Read one array from a NumPy ``.npz`` archive (or a ``.npy`` file), never unpickling.

    Parameters
    ----------
    path : str or os.PathLike
        ``.npz`` archive (``np.savez`` / ``np.savez_compressed``) or ``.npy`` file.
    key : str, default="arr_0"
        Name of the array in the archive (ignored for ``.npy``).

    Returns
    -------
    X : ndarray
        The array as stored (KMNIST images: (10000, 28, 28) uint8).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    KeyError
        If the archive has no array ``key`` (the message lists those it has).
    MalformedFileError
        If the file is not an npz/npy file, is truncated, or holds an object array (which
        would need unpickling: refused, ``allow_pickle`` stays False).

    Examples
    --------
    >>> load_npz_array("vectors/kmnist-test-labels.npz").shape  # doctest: +SKIP
    (10000,)
    """
    p = Path(path)
    expected = "a NumPy .npz/.npy file without object arrays"
    with p.open("rb") as f:  # FileNotFoundError names the path
        try:
            obj = np.load(f, allow_pickle=False)
            if isinstance(obj, np.ndarray):
                return obj
            with obj:
                if key not in obj.files:
                    raise KeyError(f"{p.name} has no array {key!r}; it holds {sorted(obj.files)}")
                return obj[key]
        except (zipfile.BadZipFile, EOFError, OSError, zlib.error) as exc:
            raise MalformedFileError(p, None, expected, f"unreadable data ({exc})") from None
        except (ValueError, SyntaxError, tokenize.TokenError) as exc:
            # numpy refusing pickles, or a bad npy header: numpy parses the header's dict
            # with the tokenizer, which raises its own error on an unbalanced bracket
            raise MalformedFileError(p, None, expected, f"a bad header ({exc})"
                                     if not isinstance(exc, ValueError) else str(exc)) from None


# --------------------------------------------------------------------------------------
# Detection
# --------------------------------------------------------------------------------------


class _Format(NamedTuple):
    description: str
    loader: Callable[..., Any]


FORMATS: dict[str, _Format] = {
    "matrix-market": _Format("Matrix Market (.mtx, .mtx.gz)", load_matrix_market),
    "10x": _Format(
        "10x Genomics folder (matrix.mtx[.gz] + features.tsv/genes.tsv + barcodes.tsv)",
        load_10x,
    ),
    "idx": _Format("IDX (MNIST *-ubyte[.gz])", load_idx),
    "npz": _Format("NumPy .npz/.npy", load_npz_array),
    "ratings": _Format("MovieLens ratings (u.data, ratings.dat, ratings.csv)", load_ratings),
    "docword": _Format("UCI bag-of-words (docword.*.txt)", load_docword),
    "ldac": _Format("LDA-C corpus (N id:count ...)", load_ldac),
    "snap": _Format("SNAP edge list ('u v' lines, # comments)", load_snap),
}


def _supported() -> str:
    return "; ".join(f"{k}: {f.description}" for k, f in FORMATS.items())


def _sniff_text(head: bytes) -> str | None:
    text = head.decode("utf-8", "replace").lstrip("\ufeff")
    lines = text.split("\n")
    if len(head) == 1 << 16:
        lines = lines[:-1]  # the peek may end mid-line
    data = [s.strip() for s in lines if s.strip() and not s.lstrip().startswith("#")]
    if not data:
        return None
    first, fields = data[0], data[0].split()
    if "::" in first or "," in first:
        return "ratings"
    if ":" in first:
        return "ldac"
    if len(data) >= 3 and all(_UINT.fullmatch(s) for s in data[:3]):
        return "docword"
    if len(fields) == 2 and all(_UINT.fullmatch(t) for t in fields):
        return "snap"
    if len(fields) in (3, 4) and all(_FLOAT.fullmatch(t) for t in fields):
        return "ratings"
    return None


def detect_format(path: StrPath) -> str:
    """Tell the format of a file or folder from its content (not its name).

    Parameters
    ----------
    path : str or os.PathLike
        A file (plain or gzip) or a 10x folder.

    Returns
    -------
    fmt : str
        A key of ``FORMATS``.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the content matches no supported format (the message lists them).

    Examples
    --------
    >>> detect_format("graphs/email-Enron.txt.gz")  # doctest: +SKIP
    'snap'
    """
    p = Path(path)
    if p.is_dir():
        if any((p / n).is_file() for n in ("matrix.mtx", "matrix.mtx.gz")):
            return "10x"
        raise ValueError(
            f"{p}: a folder, but not a 10x matrix folder (no matrix.mtx[.gz]). "
            f"Supported formats: {_supported()}."
        )
    head = _peek_bytes(p)
    if head.lstrip()[:14].lower() == b"%%matrixmarket":
        return "matrix-market"
    if head[:6] == b"\x93NUMPY" or head[:4] == b"PK\x03\x04":
        return "npz"
    if _idx_header_ok(head[:4]):
        return "idx"
    fmt = _sniff_text(head) if b"\0" not in head[:4096] else None
    if fmt is None:
        raise ValueError(
            f"{p.name}: cannot tell its format from the content. Supported formats: "
            f"{_supported()}. Pass fmt= to load() to choose one."
        )
    return fmt


def load(path: StrPath, *, fmt: str | None = None, **kw: Any) -> Any:
    """Load any supported file or folder, detecting its format from the content.

    Parameters
    ----------
    path : str or os.PathLike
        A file of any format in ``FORMATS`` (plain or gzip) or a 10x folder.
    fmt : str, optional
        A key of ``FORMATS`` to skip detection.
    **kw
        Passed to the format's loader (e.g. ``symmetric=True`` for ``snap``).

    Returns
    -------
    data : scipy.sparse.csr_matrix, ndarray, Ratings or TenX
        What the format's loader returns.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the format cannot be told or ``fmt`` is unknown (the message lists the
        supported formats); a :class:`MalformedFileError` from the loader.

    Examples
    --------
    >>> A = load("matrices/memplus.mtx.gz")  # doctest: +SKIP
    >>> A.shape  # doctest: +SKIP
    (17758, 17758)
    """
    if fmt is None:
        fmt = detect_format(path)
        logger.info("%s: detected format %r (%s)", path, fmt, FORMATS[fmt].description)
    elif fmt not in FORMATS:
        raise ValueError(
            f"The 'fmt' parameter of load must be one of {sorted(FORMATS)}. Got {fmt!r} instead."
        )
    return FORMATS[fmt].loader(path, **kw)
