"""Synthetic sparse matrices shaped like the real ones (power-law rows and columns)."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp

__all__ = ["band_csr", "clustered_rows", "powerlaw_corpus", "powerlaw_csr", "topic_tfidf"]


def _inverse_cdf(cdf: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``np.searchsorted(cdf, u, side="right")`` in chunks on all cores: random probes miss
    the cache on every step, and numpy lets go of the GIL while it searches. The same result
    as the one call."""
    out = np.empty(u.shape, dtype=np.intp)
    step = 1 << 20
    if u.size <= step:
        out[:] = np.searchsorted(cdf, u, side="right")
        return out

    def search(s: int) -> None:
        out[s:s + step] = np.searchsorted(cdf, u[s:s + step], side="right")

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(search, range(0, u.size, step)))
    return out


def powerlaw_csr(
    n_rows: int,
    n_cols: int,
    nnz: int,
    *,
    row_exponent: float = 0.6,
    col_exponent: float = 0.8,
    dtype: np.dtype | type = np.float32,
    seed: int | None = 0,
) -> sp.csr_matrix:
    """A random CSR matrix with Zipf-like row and column degrees (bag-of-words, ratings).

    Row ``i`` is drawn with weight ``(i + 1) ** -row_exponent`` and column ``j`` with
    ``(j + 1) ** -col_exponent``; repeated (row, column) draws are merged, so the result has
    somewhat fewer than ``nnz`` nonzeros. Values are uniform in [0.5, 1.5), never zero.

    Parameters
    ----------
    n_rows, n_cols : int
        Shape.
    nnz : int
        Number of (row, column) draws.
    row_exponent, col_exponent : float
        Skew of the row and column degrees (0 is uniform).
    dtype : dtype, default=float32
    seed : int, optional

    Returns
    -------
    scipy.sparse.csr_matrix of shape (n_rows, n_cols)
        Canonical (sorted indices, no duplicates).

    Examples
    --------
    >>> S = powerlaw_csr(1000, 500, 20_000, seed=0)
    >>> S.shape, S.nnz <= 20_000, S.has_canonical_format
    ((1000, 500), True, True)
    """
    for name, v in (("n_rows", n_rows), ("n_cols", n_cols)):
        if v < 1:
            raise ValueError(f"The '{name}' parameter of powerlaw_csr must be >= 1. Got {v}.")
    if nnz < 0:
        raise ValueError(f"The 'nnz' parameter of powerlaw_csr must be >= 0. Got {nnz}.")
    rng = np.random.default_rng(seed)
    rw = 1.0 / np.arange(1, n_rows + 1, dtype=np.float64) ** row_exponent
    cw = 1.0 / np.arange(1, n_cols + 1, dtype=np.float64) ** col_exponent
    # Inverse-CDF sampling: cheaper than rng.choice(p=...) for tens of millions of draws.
    rows = _inverse_cdf(np.cumsum(rw / rw.sum()), rng.random(nnz))
    cols = _inverse_cdf(np.cumsum(cw / cw.sum()), rng.random(nnz))
    np.minimum(rows, n_rows - 1, out=rows)
    np.minimum(cols, n_cols - 1, out=cols)
    # sort and drop repeats: np.unique's hashing path is many times slower at this size
    key = np.sort(rows.astype(np.int64) * n_cols + cols)
    key = key[np.r_[True, key[1:] != key[:-1]]] if key.size else key
    r, c = key // n_cols, key % n_cols
    vals = (rng.random(key.size) + 0.5).astype(dtype)
    idx_dtype = np.int32 if max(n_rows, n_cols, key.size) < np.iinfo(np.int32).max else np.int64
    indptr = np.zeros(n_rows + 1, dtype=idx_dtype)
    np.cumsum(np.bincount(r, minlength=n_rows), out=indptr[1:])
    S = sp.csr_matrix((vals, c.astype(idx_dtype), indptr), shape=(n_rows, n_cols))
    S.has_canonical_format = True
    return S


def band_csr(n: int, width: int, *, dtype: np.dtype | type = np.float32,
             seed: int | None = 0) -> sp.csr_matrix:
    """An n x n CSR band of ``width`` diagonals centred on the main one (a regular matrix:
    every row but the first and last few has ``width`` neighbouring columns).

    Values are uniform in [0.5, 1.5).

    Examples
    --------
    >>> B = band_csr(6, 3)
    >>> B.nnz, np.diff(B.indptr).tolist()
    (16, [2, 3, 3, 3, 3, 2])
    """
    if n < 1 or width < 1:
        raise ValueError(f"band_csr needs n >= 1 and width >= 1. Got n={n}, width={width}.")
    offsets = np.arange(width) - (width - 1) // 2
    offsets = offsets[np.abs(offsets) < n]
    B = sp.diags([np.ones(n - abs(int(o))) for o in offsets], offsets, shape=(n, n),
                 format="csr", dtype=np.float64)
    B.sort_indices()
    B.data = np.random.default_rng(seed).uniform(0.5, 1.5, B.nnz)
    return B.astype(dtype)


def powerlaw_corpus(n_docs: int, n_terms: int, density: float, *, seed: int | None = 0
                    ) -> sp.csr_matrix:
    """A bag-of-words-like count matrix: Zipf-like document lengths (exponent 0.3) and term
    frequencies (exponent 1.0), counts 1 to 4 summed over repeated draws, float32.

    The shape of the kNN benchmark corpora (100,000 × 50,000 at 0.2% is the peer-timing one).

    Examples
    --------
    >>> X = powerlaw_corpus(1000, 300, 0.01, seed=0)
    >>> X.shape, X.nnz <= 3000, X.dtype.name, bool((X.data >= 1).all())
    ((1000, 300), True, 'float32', True)
    """
    if n_docs < 1 or n_terms < 1:
        raise ValueError(f"The corpus must have at least one document and one term. Got "
                         f"{n_docs} × {n_terms}.")
    if not 0 <= density <= 1:
        raise ValueError(f"The 'density' parameter of powerlaw_corpus must be in [0, 1]. Got "
                         f"{density}.")
    rng = np.random.default_rng(seed)
    nnz = int(n_docs * n_terms * density)
    dw = np.cumsum(1.0 / np.arange(1, n_docs + 1, dtype=np.float64) ** 0.3)
    tw = np.cumsum(1.0 / np.arange(1, n_terms + 1, dtype=np.float64) ** 1.0)
    r = np.minimum(_inverse_cdf(dw / dw[-1], rng.random(nnz)), n_docs - 1)
    c = np.minimum(_inverse_cdf(tw / tw[-1], rng.random(nnz)), n_terms - 1)
    X = sp.csr_matrix((rng.integers(1, 5, nnz).astype(np.float32), (r, c)),
                      shape=(n_docs, n_terms))
    X.sum_duplicates()
    X.sort_indices()
    return X


def planted_ratings(n_users: int, n_items: int, n_ratings: int, *, rank: int = 16,
                    noise: float = 0.5, seed: int | None = 0) -> sp.coo_matrix:
    """Ratings drawn from a planted low-rank model, at Zipf-like user and item degrees.

    The (user, item) pattern is :func:`powerlaw_csr`'s (user exponent 0.35, item exponent
    0.45, about the skew of Netflix's ratings); each rating is ``3 + u·v + ε`` with ``u`` and
    ``v`` of ``rank`` entries drawn so that ``u·v`` has standard deviation 1, and ``ε`` normal
    with standard deviation ``noise``: a model with enough factors can reach a test RMSE near
    ``noise`` and no lower, so "time to an RMSE of 1.2·noise" measures training speed.

    Examples
    --------
    >>> R = planted_ratings(2000, 500, 50_000, noise=0.5, seed=0)
    >>> R.shape, R.nnz <= 50_000, 2.5 < float(R.data.mean()) < 3.5
    ((2000, 500), True, True)
    """
    if rank < 1 or noise < 0:
        raise ValueError(f"planted_ratings needs rank >= 1 and noise >= 0. Got rank={rank}, "
                         f"noise={noise}.")
    S = powerlaw_csr(n_users, n_items, n_ratings, row_exponent=0.35, col_exponent=0.45,
                     dtype=np.float64, seed=seed).tocoo()
    rng = np.random.default_rng(None if seed is None else seed + 1)
    scale = rank ** -0.25
    U = rng.standard_normal((n_users, rank)) * scale
    V = rng.standard_normal((n_items, rank)) * scale
    vals = noise * rng.standard_normal(S.nnz)
    step = 1 << 22  # u·v in slices: whole, U[S.row] alone is 12.8 GB at 1e8 ratings
    for a in range(0, S.nnz, step):
        b = slice(a, a + step)
        vals[b] = 3.0 + np.einsum("nk,nk->n", U[S.row[b]], V[S.col[b]]) + vals[b]
    return sp.coo_matrix((vals, (S.row, S.col)), shape=S.shape)


def topic_tfidf(n_docs: int, n_terms: int, *, topics: int = 100, words: int = 60,
                seed: int | None = 0) -> sp.csr_matrix:
    """TF-IDF rows of a corpus with topics: each document draws about ``words`` terms
    (lognormal lengths), four in five from its topic's Zipf-like term distribution (exponent
    1.1 over the topic's own random order of the terms), the rest from the corpus's common
    one; counts weighted by smoothed inverse document frequency (scikit-learn's
    ``TfidfTransformer``), rows of unit length, float32. Neighbours are documents of the
    same topic that share its frequent terms: the structure a real corpus has and a
    uniformly random one lacks.

    Examples
    --------
    >>> X = topic_tfidf(500, 2000, topics=10, words=30, seed=0)
    >>> X.shape, X.dtype.name, bool(np.allclose(sp.linalg.norm(X, axis=1), 1))
    ((500, 2000), 'float32', True)
    """
    if n_docs < 1 or n_terms < 1 or topics < 1 or words < 1:
        raise ValueError("topic_tfidf needs at least one document, term, topic and word a "
                         f"document. Got {n_docs}, {n_terms}, {topics}, {words}.")
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.lognormal(np.log(words), 0.5, n_docs)).astype(np.int64)
    doc = np.repeat(np.arange(n_docs), lengths)
    cdf = np.cumsum(1.0 / np.arange(1, n_terms + 1, dtype=np.float64) ** 1.1)
    rank = np.minimum(_inverse_cdf(cdf / cdf[-1], rng.random(doc.size)), n_terms - 1)
    order = np.stack([rng.permutation(n_terms) for _ in range(topics)]).astype(np.int32)
    topic = rng.integers(0, topics, n_docs)[doc]
    common = rng.random(doc.size) < 0.2
    term = np.where(common, rank, order[topic, rank])
    X = sp.csr_matrix((np.ones(doc.size, dtype=np.float32), (doc, term)),
                      shape=(n_docs, n_terms))
    X.sum_duplicates()
    df = np.bincount(X.indices, minlength=n_terms)
    X.data *= (np.log((1.0 + n_docs) / (1.0 + df)) + 1.0).astype(np.float32)[X.indices]
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    X.data /= np.repeat(np.where(norms > 0, norms, 1.0), np.diff(X.indptr)).astype(np.float32)
    return X


def clustered_rows(n: int, d: int, *, centres: int = 100, seed: int | None = 0) -> np.ndarray:
    """Dense rows around ``centres`` random centres (standard normal, times 4), each a
    centre plus standard normal noise, float64: a vector set whose neighbours lie in their
    own cluster, as embeddings' do, where uniformly random rows have no structure to find.

    Examples
    --------
    >>> clustered_rows(1000, 8, centres=5).shape
    (1000, 8)
    """
    if n < 0 or d < 1 or centres < 1:
        raise ValueError("clustered_rows needs n >= 0 rows, at least one column and one "
                         f"centre. Got {n}, {d}, {centres}.")
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centres, d)) * 4
    return c[rng.integers(0, centres, n)] + rng.standard_normal((n, d))
