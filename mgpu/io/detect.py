"""The table of supported formats, detection of a file's format from its content, and
:func:`load`, which reads any of them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from mgpu.io._common import _FLOAT, _UINT, _peek_bytes
from mgpu.io.bow import load_docword, load_ldac
from mgpu.io.errors import StrPath
from mgpu.io.graphs import load_snap
from mgpu.io.matrix_market import load_matrix_market
from mgpu.io.ratings import load_ratings
from mgpu.io.tenx import load_10x
from mgpu.io.vectors import _idx_header_ok, load_idx, load_npz_array

logger = logging.getLogger(__name__)

__all__ = ["FORMATS", "detect_format", "load"]


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
