"""The GaP workflow: Canny's Gamma-Poisson topic model on a bag-of-words corpus, every update
an SDDMM followed by an SpMM (the cuSDDMM paper's reformulation).

Counts ``s_dw ~ Poisson(Σ_k x_dk λ_wk)`` with document loadings ``x_dk ~ Gamma(α, β)`` (shape
α, scale β). The MAP updates (Canny, "GaP: a factor model for discrete data", 2004) need the
model's rates only where s is nonzero, ``ŝ = S ∘ (X Λᵀ)`` (:func:`mgpu.sddmm`), and the ratio
``Q = S / ŝ`` times a factor (:func:`mgpu.spmm`)::

    X ← (X ∘ (Q Λ) + α - 1) / (1ᵀΛ + 1/β)        Λ ← Λ ∘ (Qᵀ X) / (1ᵀX)

The Poisson log-likelihood needs no dense product either: ``Σ_nz s log ŝ - Σ_k (1ᵀX)_k (1ᵀΛ)_k
- Σ_nz log s!``; it is reported per token after every iteration.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from math import lgamma
from typing import Any

import numpy as np
import scipy.sparse as sp

import mgpu
from workflows._sparse import transpose_map

__all__ = ["Topics", "fit", "top_words"]


@dataclass
class Topics:
    """Fitted loadings X (documents × topics), topics Λ (words × topics) and the history."""

    X: Any
    L: Any
    history: list[dict[str, float]] = field(default_factory=list)


def _xp(S: Any) -> Any:
    if hasattr(S, "get"):
        import cupy

        return cupy
    return np


def fit(S: Any, topics: int = 20, *, iters: int = 50, alpha: float = 1.1, beta: float = 10.0,
        seed: int = 0, progress: Callable[[dict[str, float]], None] | None = None) -> Topics:
    """Fit GaP to a documents × words count matrix (scipy or cupyx CSR).

    Parameters
    ----------
    S : sparse matrix of shape (n_docs, n_words)
        Non-negative counts.
    topics : int
    iters : int
        Alternating updates of X and Λ (two SDDMM and two SpMM each).
    alpha, beta : float
        Gamma prior of the loadings: shape α >= 1 (keeps the MAP update non-negative), scale
        β > 0.

    Examples
    --------
    >>> S = sp.csr_matrix(np.array([[4, 3, 0, 0], [5, 2, 0, 1], [0, 0, 6, 3], [0, 1, 4, 4.]]))
    >>> t = fit(S, 2, iters=60, seed=1)
    >>> t.history[-1]["loglik_per_token"] > t.history[0]["loglik_per_token"]
    True
    """
    if topics < 1 or iters < 1 or alpha < 1 or beta <= 0:
        raise ValueError(f"topics and iters must be >= 1, alpha >= 1 and beta > 0. Got "
                         f"topics={topics}, iters={iters}, alpha={alpha}, beta={beta}.")
    xp = _xp(S)
    if xp is np:
        sparse = sp
    else:
        import cupyx.scipy.sparse as sparse
    S = S.tocsr()
    S.sum_duplicates()
    S.sort_indices()
    if S.nnz and float(S.data.min()) < 0:
        raise ValueError("The 'S' parameter of fit must hold non-negative counts.")
    dtype = S.dtype if S.dtype in (np.float32, np.float64) else np.float64
    S = S.astype(dtype)
    n_docs, n_words = S.shape
    rng = np.random.default_rng(seed)
    X = xp.asarray(rng.gamma(1.0, 1.0, (n_docs, topics)).astype(dtype))
    L = xp.asarray(rng.gamma(1.0, 1.0, (n_words, topics)).astype(dtype))
    L /= L.sum(axis=0, keepdims=True)
    X *= (S.sum() / n_docs / topics)
    pattern = S.copy()
    pattern.data[:] = 1
    t_ptr, t_ind, perm = transpose_map(S)
    host = S.get() if hasattr(S, "get") else S
    log_fact = float(sum(lgamma(v + 1.0) for v in np.asarray(host.data, dtype=np.float64)))
    tokens = float(host.data.sum())
    tiny = np.finfo(dtype).tiny
    model = Topics(X, L)
    t_start = time.perf_counter()

    def ratio(Xf: Any, Lf: Any) -> Any:
        R = mgpu.sddmm(pattern, Xf, Lf)  # the rates ŝ at the nonzeros
        R.data = S.data / xp.maximum(R.data, tiny)
        return R

    for it in range(1, iters + 1):
        t0 = time.perf_counter()
        Q = ratio(X, L)
        X *= mgpu.spmm(Q, L)
        X += alpha - 1.0
        X /= L.sum(axis=0) + 1.0 / beta
        Q = ratio(X, L)
        QT = sparse.csr_matrix((Q.data[perm], t_ind, t_ptr), shape=(n_words, n_docs))
        L *= mgpu.spmm(QT, X) / xp.maximum(X.sum(axis=0), tiny)
        rates = mgpu.sddmm(pattern, X, L)
        loglik = float((S.data.astype(xp.float64) * xp.log(xp.maximum(
            rates.data.astype(xp.float64), tiny))).sum()
            - float((X.sum(axis=0).astype(xp.float64) * L.sum(axis=0).astype(xp.float64))
                    .sum()) - log_fact)
        rec = {"iteration": it, "loglik_per_token": loglik / tokens,
               "step_s": time.perf_counter() - t0, "elapsed_s": time.perf_counter() - t_start}
        model.history.append(rec)
        if progress is not None:
            progress(rec)
    return model


def top_words(L: Any, vocab: list[str] | None, n: int = 8) -> list[list[str]]:
    """Each topic's n heaviest words (ids as strings without a vocabulary).

    >>> top_words(np.array([[0.1, 0.7], [0.9, 0.3]]), ["a", "b"], 1)
    [['b'], ['a']]
    """
    L = np.asarray(L.get() if hasattr(L, "get") else L)
    order = np.argsort(-L, axis=0, kind="stable")[:n].T
    return [[vocab[w] if vocab is not None and w < len(vocab) else str(w) for w in row]
            for row in order]


def plot(histories: dict[str, list[dict[str, float]]], path: str, title: str) -> None:
    """Log-likelihood per token against the iteration, one line per device, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for label, hist in histories.items():
        ax.plot([h["iteration"] for h in hist], [h["loglik_per_token"] for h in hist],
                label=label)
    ax.set_xlabel("iteration (2 SDDMM + 2 SpMM)")
    ax.set_ylabel("log-likelihood per token")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
