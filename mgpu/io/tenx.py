"""10x Genomics feature-barcode matrix folders (``matrix.mtx``, ``features.tsv``,
``barcodes.tsv``, each plain or gzip).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from mgpu.io._common import _read_bytes, _read_text, _show
from mgpu.io.errors import MalformedFileError, StrPath
from mgpu.io.matrix_market import _mm_from_bytes

logger = logging.getLogger(__name__)

__all__ = ["TenX", "load_10x"]


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
