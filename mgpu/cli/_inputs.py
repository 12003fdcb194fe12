"""Reading the data a command names: files (refused with exit status 1 when unreadable),
synthetic matrices and corpora, and the folder of the real datasets."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click
import numpy as np

from mgpu.cli._errors import data_error


def data_root(data_dir: str | None) -> Path:
    """--data, else $MGPU_DATA, else ../shared/data."""
    return Path(data_dir or os.environ.get("MGPU_DATA") or Path.cwd().parent / "shared" / "data")


def load_matrix(path: str) -> Any:
    """The sparse matrix of any file mgpu.io.load reads, as scipy CSR."""
    import scipy.sparse as sp

    from mgpu import io

    try:
        data = io.load(path)
    except (ValueError, FileNotFoundError, TypeError) as exc:
        raise data_error(exc) from exc
    S = getattr(data, "matrix", data)
    return S if sp.issparse(S) else sp.csr_matrix(S)


def load_input(path: str | None, powerlaw: tuple[int, int] | None, nnz: float,
               seed: int) -> tuple[Any, str]:
    """INPUT or a --powerlaw matrix (exactly one of them), and its label."""
    if (path is None) == (powerlaw is None):
        raise click.UsageError("give either an input file (INPUT) or --powerlaw ROWSxCOLS")
    if powerlaw is not None:
        from mgpu.synthetic import powerlaw_csr

        m, n = powerlaw
        return powerlaw_csr(m, n, int(nnz), seed=seed), f"power-law {m:,} x {n:,} (seed {seed})"
    return load_matrix(path), Path(path).name


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
