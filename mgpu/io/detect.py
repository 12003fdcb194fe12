"""The table of supported formats, detection of a file's format from its content, and
:func:`load`, which reads any of them.

Detection never guesses between formats that read the same lines differently: ``u v w``
lines are a weighted edge list to a graph (one numbering of the nodes) and ``user item
rating`` to a ratings matrix (users and items numbered apart), and nothing in the lines tells
which. Such a file is read as the caller expects (``expect="graph"``: the job reads graphs),
as its name says when it carries a MovieLens name (``u.data``, ``*ratings*``), and refused
otherwise with an :class:`AmbiguousFormatError` that says how to choose (``fmt=``).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from mgpu.io._common import _FLOAT, _UINT, _peek_bytes
from mgpu.io.bow import load_docword, load_ldac
from mgpu.io.errors import AmbiguousFormatError, StrPath
from mgpu.io.graphs import load_edges, load_snap
from mgpu.io.matrix_market import load_matrix_market
from mgpu.io.ratings import load_ratings
from mgpu.io.tenx import load_10x
from mgpu.io.vectors import _idx_header_ok, load_idx, load_npz_array

logger = logging.getLogger(__name__)

__all__ = ["FORMATS", "KINDS", "Sniffed", "detect_format", "load", "sniff"]


class _Format(NamedTuple):
    description: str
    loader: Callable[..., Any]
    kind: str  # what a job reads it as: graph, ratings, corpus, matrix, dense


FORMATS: dict[str, _Format] = {
    "matrix-market": _Format("Matrix Market (.mtx, .mtx.gz)", load_matrix_market, "matrix"),
    "10x": _Format(
        "10x Genomics folder (matrix.mtx[.gz] + features.tsv/genes.tsv + barcodes.tsv)",
        load_10x,
        "matrix",
    ),
    "idx": _Format("IDX (MNIST *-ubyte[.gz])", load_idx, "dense"),
    "npz": _Format("NumPy .npz/.npy", load_npz_array, "dense"),
    "ratings": _Format("MovieLens ratings (u.data, ratings.dat, ratings.csv)", load_ratings,
                       "ratings"),
    "docword": _Format("UCI bag-of-words (docword.*.txt)", load_docword, "corpus"),
    "ldac": _Format("LDA-C corpus (N id:count ...)", load_ldac, "corpus"),
    "snap": _Format("SNAP edge list ('u v' lines, # comments)", load_snap, "graph"),
    "weighted-edges": _Format("edge list with weights ('u v weight [time]' lines)", load_edges,
                              "graph"),
    "temporal-edges": _Format("temporal edge list ('u v time' lines; the times ignored)",
                              functools.partial(load_edges, values="time"), "graph"),
}

# What a caller may expect (``expect=``): the kinds of the formats.
KINDS: tuple[str, ...] = tuple(sorted({f.kind for f in FORMATS.values()}))

# Names that say MovieLens ratings (u.data, u1.base, ua.test, ratings.csv, ...).
_RATINGS_NAME = re.compile(r"^u[\dab]?\.(data|base|test)$|rating", re.IGNORECASE)
# Header words that name the columns of ratings, or of an edge list (third column a time).
_RATINGS_WORDS = re.compile(r"user|item|movie|rating|product|book|customer", re.IGNORECASE)
_GRAPH_WORDS = re.compile(r"source|target|\bsrc|\bdst|\bfrom|\bto\b|node|edge|weight",
                          re.IGNORECASE)
_TIME_WORD = re.compile(r"^(t|time|timestamp|date|unixtime)$", re.IGNORECASE)


class Sniffed(NamedTuple):
    """What :func:`sniff` found.

    Attributes
    ----------
    format : str
        A key of ``FORMATS``.
    note : str or None
        What was assumed, for the user to read (``"read as weighted-edges: ..."``), where the
        content alone did not decide; None where it did.
    """

    format: str
    note: str | None


class _Guess(NamedTuple):
    candidates: tuple[str, ...]
    why: str  # what the lines look like, for messages
    columns: int = 0


def _supported() -> str:
    return "; ".join(f"{k}: {f.description}" for k, f in FORMATS.items())


def _fields(line: str) -> list[str]:
    """A data line's fields, comma or whitespace separated, trailing empty fields dropped."""
    f = [t.strip() for t in line.split(",")] if "," in line else line.split()
    while f and not f[-1]:
        f.pop()
    return f


def _mm_body(rows: list[str], complete: bool) -> bool:
    """Whether ``rows`` read as a Matrix Market coordinate file without its banner: a size
    line ``m n nnz`` then ``i j [value]`` lines inside ``1..m`` x ``1..n``, ``nnz`` of them
    (at most ``nnz`` where only the head of the file was read)."""
    size = rows[0].split()
    if len(size) != 3 or not all(_UINT.fullmatch(t) for t in size):
        return False
    m, n, nnz = (int(t) for t in size)
    for row in rows[1:]:
        f = row.split()
        if not (2 <= len(f) <= 4 and _UINT.fullmatch(f[0]) and _UINT.fullmatch(f[1])
                and 1 <= int(f[0]) <= m and 1 <= int(f[1]) <= n):
            return False
    return len(rows) - 1 == nnz if complete else len(rows) - 1 <= nnz


def _bow(data: list[str], complete: bool) -> _Guess | None:
    """UCI docword (three single counts, then 'doc word count' lines) or LDA-C (every line
    'N id:count ...', an empty document '0'); both where the lines are '0', '0', '0' (an
    empty docword corpus, or three empty documents)."""
    first = data[0]
    if ":" not in first and not _UINT.fullmatch(first):
        return None
    docword = len(data) >= 3 and all(_UINT.fullmatch(s) for s in data[:3])
    ldac = all(s == "0" or ":" in s for s in data)
    if docword and ldac and complete and data == ["0", "0", "0"]:
        return _Guess(("docword", "ldac"), "three lines '0'")
    if docword and not (ldac and len(data) > 3):
        return _Guess(("docword",), "three header counts")
    if ldac or ":" in first:
        return _Guess(("ldac",), "'N id:count' lines")
    return None


def _sniff_text(path: Path, head: bytes) -> _Guess | None:
    text = head.decode("utf-8", "replace").lstrip("\ufeff")
    lines = text.split("\n")
    complete = len(head) < 1 << 16
    if not complete:
        lines = lines[:-1]  # the peek may end mid-line
    stripped = [s.strip() for s in lines if s.strip()]
    percent = bool(stripped) and stripped[0].startswith("%")
    data = [s for s in stripped if not s.startswith(("#", "%") if percent else "#")]
    if not data:
        return None
    first, fields = data[0], data[0].split()
    if _mm_body(data, complete):
        raise AmbiguousFormatError(
            path, ("ratings", "weighted-edges"),
            f"its first line {first!r} and the {len(data) - 1} lines after it look like a "
            "Matrix Market file without its '%%MatrixMarket matrix coordinate ...' banner",
            "A Matrix Market file needs its banner: add '%%MatrixMarket matrix coordinate "
            "real general' (or integer, pattern) as its first line.")
    if percent:
        return None  # '%' comments and no size line: nothing here reads it
    if "::" in first:
        return _Guess(("ratings",), "'::' separated")
    bow = _bow(data, complete)
    if bow is not None:
        return bow
    if len(fields) == 2 and all(_UINT.fullmatch(t) for t in fields):
        return _Guess(("snap",), "'u v' lines")
    header = None
    if not first[:1].isdigit():  # a line of column names, as ratings.csv has
        header, first = first, data[1] if len(data) > 1 else ""
    f = _fields(first)
    columns_ok = len(f) >= 3 and bool(_UINT.fullmatch(f[0]) and _UINT.fullmatch(f[1])) \
        and all(_FLOAT.fullmatch(t) for t in f[2:])
    if header is not None and _RATINGS_WORDS.search(header):
        return _Guess(("ratings",), f"a header {header!r}")
    if header is not None and _GRAPH_WORDS.search(header) and columns_ok:
        names = _fields(header)
        timed = len(f) == 3 and len(names) == 3 and _TIME_WORD.fullmatch(names[2])
        return _Guess(("temporal-edges" if timed else "weighted-edges",),
                      f"a header {header!r}", len(f))
    if not columns_ok or len(f) > 4:
        return None
    if len(first.split(",") if "," in first else first.split()) != len(f):
        return _Guess(("ratings",), "trailing empty fields")  # only ratings reads those
    return _Guess(("ratings", "weighted-edges"), f"{len(f)} numbers each", len(f))


_PLURAL = {"graph": "graphs", "corpus": "corpora", "matrix": "matrices", "dense": "arrays"}


def _what(fmt: str, columns: int) -> str:
    if fmt == "weighted-edges":
        return (f"an edge list with weights, {columns} columns: u v weight"
                + (", the fourth ignored" if columns == 4 else ""))
    if fmt == "temporal-edges":
        return "an edge list with times, ignored: every edge stored once with 1"
    return "user item rating, users and items numbered apart"


def _decide(path: Path, guess: _Guess, expect: str | None) -> Sniffed:
    """One format of ``guess``'s candidates: the only one, the one of the kind the caller
    expects, the one the file's name says; else the refusal. Edge lists with a third column
    always get a note: the lines cannot tell a weight from a time."""
    cands, fmt = guess.candidates, guess.candidates[0]
    why = ""
    if len(cands) > 1:
        by_kind = [c for c in cands if FORMATS[c].kind == expect]
        if len(by_kind) == 1:
            fmt, why = by_kind[0], f" as the job reads {_PLURAL.get(expect, expect)}"
        elif "ratings" in cands and _RATINGS_NAME.search(path.name.removesuffix(".gz")):
            fmt, why = "ratings", " by its name"
        else:
            raise AmbiguousFormatError(
                path, cands, f"its lines hold {guess.why}",
                "'temporal-edges' reads an edge list's third column as a time.")
    elif fmt not in ("weighted-edges", "temporal-edges"):
        return Sniffed(fmt, None)
    others = [c for c in cands if c != fmt] + ["temporal-edges"] * (fmt == "weighted-edges")
    also = f"; --format {' or '.join(others)} reads it otherwise" if others else ""
    return Sniffed(fmt, f"read as {fmt} ({_what(fmt, guess.columns or 3)}){why}{also}")


def sniff(path: StrPath, *, expect: str | None = None) -> Sniffed:
    """Tell the format of a file or folder from its content, and what was assumed.

    Parameters
    ----------
    path : str or os.PathLike
        A file (plain or gzip) or a 10x folder.
    expect : str, optional
        What the caller reads, one of ``KINDS`` (``"graph"``, ``"ratings"``, ...): decides
        between formats that read the same lines differently (``u v w`` lines are a weighted
        edge list with ``expect="graph"``, ratings with ``expect="ratings"``).

    Returns
    -------
    sniffed : Sniffed
        ``(format, note)``: a key of ``FORMATS``, and what was assumed where the content
        alone did not decide (None where it did).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    AmbiguousFormatError
        If the lines read as several formats and neither ``expect`` nor a MovieLens file
        name decides, or look like a Matrix Market file without its banner.
    ValueError
        If the content matches no supported format (the message lists them), or ``expect``
        is not one of ``KINDS``.

    Examples
    --------
    >>> sniff("graphs/bitcoin-otc.txt", expect="graph")  # doctest: +SKIP
    Sniffed(format='weighted-edges', note='read as weighted-edges: an edge list with ...')
    """
    if expect is not None and expect not in KINDS:
        raise ValueError(f"The 'expect' parameter of sniff must be one of {list(KINDS)} or "
                         f"None. Got {expect!r} instead.")
    p = Path(path)
    if p.is_dir():
        if any((p / n).is_file() for n in ("matrix.mtx", "matrix.mtx.gz")):
            return Sniffed("10x", None)
        raise ValueError(
            f"{p}: a folder, but not a 10x matrix folder (no matrix.mtx[.gz]). "
            f"Supported formats: {_supported()}."
        )
    head = _peek_bytes(p)
    if head.lstrip()[:14].lower() == b"%%matrixmarket":
        return Sniffed("matrix-market", None)
    if head[:6] == b"\x93NUMPY" or head[:4] == b"PK\x03\x04":
        return Sniffed("npz", None)
    if _idx_header_ok(head[:4]):
        return Sniffed("idx", None)
    guess = _sniff_text(p, head) if b"\0" not in head[:4096] else None
    if guess is None:
        raise ValueError(
            f"{p.name}: cannot tell its format from the content. Supported formats: "
            f"{_supported()}. Pass fmt= to load() (--format on the command line) to choose one."
        )
    return _decide(p, guess, expect)


def detect_format(path: StrPath, *, expect: str | None = None) -> str:
    """Tell the format of a file or folder from its content (not its name).

    The name decides only between formats whose lines the content cannot tell apart, and
    only for MovieLens names (``u.data``, ``*ratings*``); see :func:`sniff`, which also says
    what was assumed.

    Parameters
    ----------
    path : str or os.PathLike
        A file (plain or gzip) or a 10x folder.
    expect : str, optional
        What the caller reads, one of ``KINDS``: decides between formats that read the same
        lines differently (see :func:`sniff`).

    Returns
    -------
    fmt : str
        A key of ``FORMATS``.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    AmbiguousFormatError
        If the lines read as several formats (``u v w``: ratings or a weighted edge list)
        and neither ``expect`` nor the name decides; the message says how to choose.
    ValueError
        If the content matches no supported format (the message lists them).

    Examples
    --------
    >>> detect_format("graphs/email-Enron.txt.gz")  # doctest: +SKIP
    'snap'
    """
    return sniff(path, expect=expect).format


def load(path: StrPath, *, fmt: str | None = None, expect: str | None = None, **kw: Any) -> Any:
    """Load any supported file or folder, detecting its format from the content.

    Parameters
    ----------
    path : str or os.PathLike
        A file of any format in ``FORMATS`` (plain or gzip) or a 10x folder.
    fmt : str, optional
        A key of ``FORMATS`` to skip detection; the way to read a file whose lines read as
        several formats (``"weighted-edges"``, ``"temporal-edges"`` or ``"ratings"`` for
        ``u v w`` lines).
    expect : str, optional
        What the caller reads, one of ``KINDS`` (``"graph"``, ...), deciding between formats
        that read the same lines differently (see :func:`sniff`).
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
    AmbiguousFormatError
        If the lines read as several formats and nothing decides (pass ``fmt=``).
    ValueError
        If the format cannot be told or ``fmt`` is unknown (the message lists the
        supported formats); a :class:`MalformedFileError` from the loader.

    Examples
    --------
    >>> A = load("matrices/memplus.mtx.gz")  # doctest: +SKIP
    >>> A.shape  # doctest: +SKIP
    (17758, 17758)
    >>> A = load("graphs/weighted.txt", fmt="weighted-edges", relabel=True)  # doctest: +SKIP
    """
    if fmt is None:
        found = sniff(path, expect=expect)
        fmt = found.format
        logger.info("%s: detected format %r (%s)", path, fmt, FORMATS[fmt].description)
        if found.note:
            logger.warning("%s: %s", Path(path).name, found.note)
    elif fmt not in FORMATS:
        raise ValueError(
            f"The 'fmt' parameter of load must be one of {sorted(FORMATS)}. Got {fmt!r} instead."
        )
    return FORMATS[fmt].loader(path, **kw)
