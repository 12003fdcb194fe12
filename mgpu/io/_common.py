"""What every loader shares: reading plain or gzip files, text decoding, and the fast
table parse that falls back to a line-by-line walk to say exactly where a file goes wrong.
"""

from __future__ import annotations

import gzip
import io
import re
import warnings
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from mgpu.io.errors import MalformedFileError, StrPath

_GZIP_MAGIC = b"\x1f\x8b"


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
