"""Reading the data a command names: files (refused with exit status 1 when unreadable),
synthetic matrices and corpora, and the folder of the real datasets."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

import click
import numpy as np

from mgpu.cli._errors import data_error


def data_root(data_dir: str | None) -> Path:
    """--data, else $MGPU_DATA, else ../shared/data."""
    return Path(data_dir or os.environ.get("MGPU_DATA") or Path.cwd().parent / "shared" / "data")


class Input(NamedTuple):
    """A matrix read for a job, with the original ids of its rows and columns (what a job
    writes beside its results, so that they map back to the file)."""

    matrix: Any  # scipy CSR
    label: str
    row_ids: np.ndarray
    col_ids: np.ndarray
    fmt: str | None  # the format it was read as (None for a generated matrix)


# Formats whose rows and columns are the file's 1-based indices; the others' positions are
# 0-based (LDA-C lines, IDX and npz rows) or carry ids of their own.
_ONE_BASED = ("matrix-market", "docword")
_GRAPHS = ("snap", "weighted-edges", "temporal-edges")


def _format(path: str, fmt: str | None, expect: str | None) -> str:
    """``fmt``, or the format told from the content, saying on the output what was assumed
    where the content alone did not decide."""
    from mgpu import io

    if fmt is not None:
        return fmt
    try:
        found = io.sniff(path, expect=expect)
    except (ValueError, FileNotFoundError, TypeError) as exc:
        raise data_error(exc) from exc
    if found.note:
        click.echo(f"{Path(path).name}: {found.note}")
    return found.format


def read_matrix(path: str, fmt: str | None = None, expect: str | None = None,
                relabel: bool = False, dtype: Any = np.float32) -> Input:
    """The sparse matrix of any file mgpu.io.load reads, as scipy CSR, with the original ids
    of its rows and columns. ``fmt``: the --format given; ``expect``: what the job reads
    (decides between formats that read the same lines differently); ``relabel``: number an
    edge list's node ids present as 0..n-1 (else node i is id i); ``dtype``: an edge list's
    values."""
    import scipy.sparse as sp

    from mgpu import io

    fmt = _format(path, fmt, expect)
    kw = {"relabel": relabel, "return_ids": True, "dtype": dtype} if fmt in _GRAPHS else {}
    try:
        data = io.load(path, fmt=fmt, **kw)
    except (ValueError, FileNotFoundError, TypeError) as exc:
        raise data_error(exc) from exc
    if fmt in _GRAPHS:  # (adjacency, node ids)
        S, ids = data
        return Input(S, Path(path).name, ids, ids, fmt)
    S = getattr(data, "matrix", data)  # Ratings and TenX hold theirs with their ids
    S = S.tocsr() if sp.issparse(S) else sp.csr_matrix(S)  # loaders give 1-D or 2-D arrays
    if isinstance(data, io.Ratings):  # the ids are the file's users and items
        rows, cols = data.user_ids, data.item_ids
    elif isinstance(data, io.TenX):  # features x barcodes
        rows, cols = data.features[:, 0], data.barcodes
    else:
        base = 1 if fmt in _ONE_BASED else 0
        rows, cols = (np.arange(base, base + n) for n in S.shape)
    return Input(S, Path(path).name, rows, cols, fmt)


def load_matrix(path: str, fmt: str | None = None) -> Any:
    """The sparse matrix of any file mgpu.io.load reads, as scipy CSR."""
    return read_matrix(path, fmt).matrix


def read_input(path: str | None, powerlaw: tuple[int, int] | None, nnz: float, seed: int,
               fmt: str | None = None) -> Input:
    """INPUT (read as ``fmt``, or told from its content) or a --powerlaw matrix (exactly one
    of them), with its label and ids."""
    if (path is None) == (powerlaw is None):
        raise click.UsageError("give either an input file (INPUT) or --powerlaw ROWSxCOLS")
    if fmt is not None and path is None:
        raise click.UsageError("--format says how to read INPUT; --powerlaw reads no file")
    if powerlaw is not None:
        from mgpu.synthetic import powerlaw_csr

        m, n = powerlaw
        S = powerlaw_csr(m, n, int(nnz), seed=seed)
        return Input(S, f"power-law {m:,} x {n:,} (seed {seed})", np.arange(m), np.arange(n),
                     None)
    return read_matrix(path, fmt)


def load_input(path: str | None, powerlaw: tuple[int, int] | None, nnz: float,
               seed: int) -> tuple[Any, str]:
    """INPUT or a --powerlaw matrix (exactly one of them), and its label."""
    got = read_input(path, powerlaw, nnz, seed)
    return got.matrix, got.label


def load_vectors(path: str) -> Any:
    """The rows of a vectors file (any file mgpu.io.load reads): a float64 array, images
    flattened to one row each, or scipy CSR where the file holds a sparse matrix."""
    import scipy.sparse as sp

    from mgpu import io

    try:
        data = io.load(path)
    except (ValueError, FileNotFoundError, TypeError) as exc:
        raise data_error(exc) from exc
    data = getattr(data, "matrix", data)  # Ratings and TenX hold theirs with their ids
    if sp.issparse(data):
        return sp.csr_matrix(data, dtype=np.float64)
    data = np.asarray(data, dtype=np.float64)
    return data.reshape(len(data), -1) if data.ndim > 2 else data


def load_ratings(path: str) -> Any:
    """A MovieLens ratings file (``mgpu.io.load_ratings``'s result)."""
    from mgpu.io import load_ratings as load

    try:
        return load(path)
    except ValueError as exc:
        raise data_error(exc) from None


def load_corpus(input: str | None, shape: tuple[int, int], density: float,
                dense: bool = False) -> tuple[Any, str]:
    """The kNN benchmarks' data: INPUT's rows (a 10x folder: spots × genes) or a power-law
    corpus (the peer timings' generator), float64, empty rows dropped (they have no cosine
    neighbours)."""
    import scipy.sparse as sp

    from mgpu.synthetic import powerlaw_corpus

    if input is not None:
        from mgpu import io

        try:
            data = io.load(input)
        except (ValueError, FileNotFoundError, TypeError) as exc:  # a file it cannot read
            raise data_error(exc) from exc
        if hasattr(data, "matrix"):  # 10x: features × barcodes
            data = data.matrix.T
        X = data.reshape(data.shape[0], -1) if isinstance(data, np.ndarray) else data
        X = np.asarray(X, dtype=np.float64) if dense and isinstance(X, np.ndarray) else X
        X = X.toarray() if dense and sp.issparse(X) else X
        if not dense:
            X = sp.csr_matrix(X, dtype=np.float64)
        label = Path(input).name + (" (dense)" if dense else "")
    else:
        n_docs, n_terms = shape
        X = powerlaw_corpus(n_docs, n_terms, density, seed=0).astype(np.float64)
        label = f"power-law {n_docs:,}×{n_terms:,}"
    keep = np.flatnonzero(np.count_nonzero(X, axis=1) if isinstance(X, np.ndarray)
                          else np.diff(X.indptr))
    return X[keep], label


def read_words(path: str) -> list[str]:
    """One word per line, plain or gzip."""
    import gzip

    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [w.strip() for w in f if w.strip()]
