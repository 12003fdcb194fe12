"""Matrix Market files (``*.mtx``, ``*.mtx.gz``), read by scipy into CSR after a check of
the size line that refuses a declaration the file or the memory cannot hold.
"""

from __future__ import annotations

import inspect
import io
import logging
import re

import scipy.io
import scipy.sparse as sp

from mgpu.io._common import _check_rows_fit, _read_bytes, _show
from mgpu.io.errors import MalformedFileError, StrPath

logger = logging.getLogger(__name__)

__all__ = ["load_matrix_market"]


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
