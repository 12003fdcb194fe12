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
from workflows._sparse import Transposer

__all__ = ["Topics", "fit", "fit_distributed", "top_words"]


@dataclass
class Topics:
    """Fitted loadings X (documents × topics), topics Λ (words × topics) and the history."""

    X: Any
    L: Any
    history: list[dict[str, float]] = field(default_factory=list)
    # fit_distributed: each row tile's worker, rows and nonzeros, in document order
    tiles: list[dict[str, Any]] = field(default_factory=list)


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
    _check_params(topics, iters, alpha, beta)
    tile = _Tile.of(S)
    X, L = _start(tile.S, topics, seed)
    xp = _xp(tile.S)
    X, L = xp.asarray(X), xp.asarray(L)
    log_fact, tokens = _constants(tile.S)
    tiny = np.finfo(tile.S.dtype).tiny
    model = Topics(X, L)
    t_start = time.perf_counter()
    for it in range(1, iters + 1):
        t0 = time.perf_counter()
        X = tile.update_loadings(X, L, alpha, beta, tiny, tile.rates(X, L))
        part, xs = tile.topic_parts(X, L, tiny)
        L = L * part / xp.maximum(xs, tiny)
        ll, xsum = tile.loglik_parts(tile.rates(X, L), X, tiny)
        loglik = ll - float((xsum * L.sum(axis=0).astype(xp.float64)).sum()) - log_fact
        rec = {"iteration": it, "loglik_per_token": loglik / tokens,
               "step_s": time.perf_counter() - t0, "elapsed_s": time.perf_counter() - t_start}
        model.history.append(rec)
        if progress is not None:
            progress(rec)
    model.X, model.L = X, L
    return model


def _check_params(topics: int, iters: int, alpha: float, beta: float) -> None:
    if topics < 1 or iters < 1 or alpha < 1 or beta <= 0:
        raise ValueError(f"topics and iters must be >= 1, alpha >= 1 and beta > 0. Got "
                         f"topics={topics}, iters={iters}, alpha={alpha}, beta={beta}.")


def _canonical(S: Any) -> Any:
    """S as float CSR with sorted, summed entries, refusing negative counts."""
    S = S.tocsr()
    S.sum_duplicates()
    S.sort_indices()
    if S.nnz and float(S.data.min()) < 0:
        raise ValueError("The 'S' parameter of fit must hold non-negative counts.")
    dtype = S.dtype if S.dtype in (np.float32, np.float64) else np.float64
    return S.astype(dtype)


def _start(S: Any, topics: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The starting loadings and topics (numpy), the same for every device and split."""
    n_docs, n_words = S.shape
    rng = np.random.default_rng(seed)
    X = rng.gamma(1.0, 1.0, (n_docs, topics)).astype(S.dtype)
    L = rng.gamma(1.0, 1.0, (n_words, topics)).astype(S.dtype)
    L /= L.sum(axis=0, keepdims=True)
    X *= float(S.sum()) / n_docs / topics
    return X, L


def _constants(S: Any) -> tuple[float, float]:
    """Σ log s! over the nonzero counts, and the number of tokens."""
    host = S.get() if hasattr(S, "get") else S
    data = np.asarray(host.data, dtype=np.float64)
    return float(sum(lgamma(v + 1.0) for v in data)), float(data.sum())


@dataclass
class _Tile:
    """Documents (rows) of the corpus with what the updates need: the counts and the map
    that transposes a matrix of their pattern by one gather."""

    S: Any
    transpose: Transposer

    @classmethod
    def of(cls, S: Any) -> _Tile:
        S = _canonical(S)
        return cls(S, Transposer.of(S))

    def rates(self, X: Any, L: Any) -> Any:
        """ŝ = S's pattern ∘ (X Λᵀ): the Poisson rates at the nonzero counts (SDDMM)."""
        return mgpu.sddmm(self.S, X, L, hadamard=False)

    def _ratio(self, R: Any, tiny: float) -> Any:
        R.data = self.S.data / _xp(self.S).maximum(R.data, tiny)
        return R

    def update_loadings(self, X: Any, L: Any, alpha: float, beta: float, tiny: float,
                        R: Any) -> Any:
        """X ← (X ∘ ((S / ŝ) Λ) + α − 1) / (1ᵀΛ + 1/β), given ŝ = ``R``."""
        X = X * mgpu.spmm(self._ratio(R, tiny), L)
        X += alpha - 1.0
        X /= L.sum(axis=0) + 1.0 / beta
        return X

    def topic_parts(self, X: Any, L: Any, tiny: float) -> tuple[Any, Any]:
        """(S / ŝ)ᵀ X and 1ᵀX for these documents: the sums behind Λ's update."""
        Q = self._ratio(self.rates(X, L), tiny)
        return mgpu.spmm(self.transpose(Q.data), X), X.sum(axis=0)

    def loglik_parts(self, R: Any, X: Any, tiny: float) -> tuple[float, Any]:
        """Σ s log ŝ over these documents (given ŝ = ``R``) and 1ᵀX, in float64."""
        xp = _xp(self.S)
        ll = float((self.S.data.astype(xp.float64)
                    * xp.log(xp.maximum(R.data.astype(xp.float64), tiny))).sum())
        return ll, X.sum(axis=0).astype(xp.float64)


# ------------------------------------------------------------------- across a cluster


def _tile_task(S: Any) -> _Tile:
    return _Tile.of(S)


def _on_device_of(tile: _Tile, X: Any) -> Any:
    """X on the tile's device (a host piece sent to a GPU worker crosses once)."""
    if _xp(tile.S) is np:
        return X
    import cupy

    return cupy.asarray(X)


def _step_task(tile: _Tile, X: Any, L: Any, update: bool, alpha: float, beta: float,
               tiny: float) -> tuple[Any, tuple]:
    """One round on one tile: the log-likelihood sums of the current state, then (unless this
    is the last round) the loadings' update and this tile's share of the topics' update."""
    X, L = _on_device_of(tile, X), _on_device_of(tile, L)
    R = tile.rates(X, L)
    ll, xsum = tile.loglik_parts(R, X, tiny)
    parts: tuple = (ll, xsum)
    if update:
        X = tile.update_loadings(X, L, alpha, beta, tiny, R)
        parts += tile.topic_parts(X, L, tiny)
    from mgpu.backends import synchronize

    return synchronize(X), parts


def _reduce_task(L: Any, tiny: float, *parts: tuple) -> tuple[Any, float, Any]:
    """Sum the tiles' shares: (Λ updated, or None in the last round; Σ s log ŝ; the
    Σ_k (1ᵀX)_k (1ᵀΛ)_k term of the log-likelihood)."""
    ll = sum(p[0] for p in parts)
    xsum = sum(_host(p[1]) for p in parts)
    penalty = float((xsum * _host(L.sum(axis=0)).astype(np.float64)).sum())
    L_next = None
    if len(parts[0]) == 4:
        part = parts[0][2]
        xs = parts[0][3]
        for p in parts[1:]:
            part = part + _on_device_of_array(part, p[2])
            xs = xs + _on_device_of_array(xs, p[3])
        L = _on_device_of_array(part, L)
        L_next = L * part / _xp_of(part).maximum(xs, tiny)
    return L_next, ll, penalty


def _host(a: Any) -> np.ndarray:
    return np.asarray(a.get() if hasattr(a, "get") else a)


def _xp_of(a: Any) -> Any:
    if hasattr(a, "get"):
        import cupy

        return cupy
    return np


def _on_device_of_array(like: Any, a: Any) -> Any:
    return _xp_of(like).asarray(a)


def fit_distributed(S: sp.spmatrix, topics: int = 20, *, parts: int | None = None,
                    client: Any = None, iters: int = 50, alpha: float = 1.1, beta: float = 10.0,
                    seed: int = 0, progress: Callable[[dict[str, float]], None] | None = None
                    ) -> Topics:
    """:func:`fit` with the documents cut into row tiles of equal nnz on a cluster's workers.

    Each tile and its loadings X stay on their worker (its GPU on GPU workers); per iteration
    only the topics Λ (words × topics) move: each tile returns its share of Λ's update, one
    task sums them, and the new Λ goes to every tile. The log-likelihood of an iteration is
    summed in the next round, from the same rates that start that round's update, so one
    round per iteration suffices; the result equals :func:`fit` up to rounding.

    ``step_s`` in the history is the time between consecutive iterations as the client sees
    them finish. Returns numpy X and Λ.
    """
    from collections import deque

    import uuid

    from mgpu.backends import is_gpu_array
    from mgpu.distributed import from_scipy
    from mgpu.distributed.cluster import current_client, result, task_placement
    from mgpu.distributed.collection import block_futures, place_as

    _check_params(topics, iters, alpha, beta)
    if not sp.issparse(S):
        raise TypeError(f"The 'S' parameter of fit_distributed must be a scipy sparse matrix. "
                        f"Got {type(S).__name__} instead.")
    S = _canonical(S)
    X0, L0 = _start(S, topics, seed)
    log_fact, tokens = _constants(S)
    tiny = float(np.finfo(S.dtype).tiny)
    client = client or current_client()
    if client is None:
        raise ValueError("fit_distributed runs on a cluster: call mgpu.connect() first.")
    Sd = from_scipy(S, parts, axis=0, client=client)
    blocks = block_futures(Sd, client)
    where = client.who_has(list(blocks.values()))
    bounds = np.concatenate([[0], np.cumsum(Sd.chunks[0])]).astype(np.int64)
    # as in workflows.als.train_distributed: work where the tiles are, starting data held by
    # tasks, so that a lost worker costs time, not results
    gpu_tiles = is_gpu_array(Sd._meta)
    run = uuid.uuid4().hex
    model = Topics(None, None)
    tiles, X = [], []
    for i in range(Sd.numblocks[0]):
        fut = blocks[(i, 0)]
        holders = list(where.get(fut.key, ()))[:1]
        pin = task_placement(holders, gpu_tiles)
        tiles.append((client.submit(_tile_task, fut, pure=False, **pin), pin))
        X.append(place_as(client, f"mgpu-gap-X0-{run}-{i}", X0[bounds[i]:bounds[i + 1]],
                          workers=holders))
        model.tiles.append({"worker": (holders or [None])[0],
                            "rows": int(bounds[i + 1] - bounds[i]),
                            "nnz": int(S.indptr[bounds[i + 1]] - S.indptr[bounds[i]])})
    L = place_as(client, f"mgpu-gap-L0-{run}", L0)
    t_start = last = time.perf_counter()
    pending: deque = deque()
    for r in range(1, iters + 2):
        update = r <= iters
        steps = [client.submit(_step_task, t, x, L, update, alpha, beta, tiny, pure=False,
                               **pin) for (t, pin), x in zip(tiles, X)]
        X = [client.submit(_first, st, pure=False, **pin) for st, (_, pin) in zip(steps, tiles)]
        shares = [client.submit(_second, st, pure=False, **pin)
                  for st, (_, pin) in zip(steps, tiles)]
        red = client.submit(_reduce_task, L, tiny, *shares, pure=False)
        if update:
            L = client.submit(_first, red, pure=False)
        if r >= 2:  # the client fetches the two sums alone, not Λ with them
            pending.append((r - 1, client.submit(_sums, red, pure=False)))
        while pending and (len(pending) > 1 or not update):
            it, fut = pending.popleft()
            ll, penalty = result(fut, f"GaP iteration {it}", client)
            now = time.perf_counter()
            rec = {"iteration": it, "loglik_per_token": (ll - penalty - log_fact) / tokens,
                   "step_s": now - last, "elapsed_s": now - t_start}
            last = now
            model.history.append(rec)
            if progress is not None:
                progress(rec)
    model.X = np.vstack([_host(result(x, "GaP's final factors", client)) for x in X])
    model.L = _host(result(L, "GaP's final factors", client))
    return model


def scaling(S: sp.spmatrix, topics: int, iters: int, workers: tuple[int, ...], *,
            gpus: bool | None = None, progress: Callable[[str], None] | None = None
            ) -> list[dict[str, Any]]:
    """Per-iteration time of GaP on one device and on clusters of 1, 2, 4, … workers.

    One run: :func:`fit` on one device (the GPU when ``gpus`` or GPUs are visible), then
    :func:`fit_distributed` with one row tile per worker on embedded clusters of each size.
    The median iteration leaves out the first two (compilation, tuning). Every run starts
    from the same state, so the log-likelihood must agree across them up to rounding.
    """
    from mgpu.distributed import connect, visible_gpus

    use_gpus = visible_gpus() > 0 if gpus is None else gpus
    rows: list[dict[str, Any]] = []

    def record(label: Any, kind: str, model: Topics) -> None:
        steps = [h["step_s"] for h in model.history[2:]] or [model.history[-1]["step_s"]]
        row = {"workers": label, "kind": kind, "topics": topics, "iters": iters,
               "n_docs": S.shape[0], "n_words": S.shape[1], "nnz": int(S.nnz),
               "median_step_s": float(np.median(steps)),
               "loglik_per_token": model.history[-1]["loglik_per_token"]}
        cluster = [r for r in rows if isinstance(r["workers"], int)]
        if isinstance(label, int):
            row["speedup"] = cluster[0]["median_step_s"] / row["median_step_s"] if cluster \
                else 1.0
        if rows:
            row["loglik_diff"] = abs(row["loglik_per_token"] - rows[0]["loglik_per_token"])
        rows.append(row)
        if progress is not None:
            progress(f"{label} {kind}: {row['median_step_s'] * 1e3:.1f} ms per iteration, "
                     f"log-likelihood per token {row['loglik_per_token']:.6f}")

    data = S.astype(np.float32)
    if use_gpus:
        import cupyx.scipy.sparse as csp

        record("one device, no cluster", "GPU", fit(csp.csr_matrix(data), topics, iters=iters))
    else:
        record("one device, no cluster", "CPU", fit(data, topics, iters=iters))
    for n in workers:
        with connect(n_workers=n, gpus=gpus) as client:
            record(n, "GPU" if use_gpus else "CPU",
                   fit_distributed(data, topics, parts=n, client=client, iters=iters))
    return rows


def scaling_markdown(rows: list[dict[str, Any]], label: str) -> str:
    head = ("| corpus | topics | workers | median ms per iteration | speedup vs 1 worker | "
            "log-likelihood per token | difference to one device |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {label} | {r['topics']} | {r['workers']} {r['kind']} | "
                     f"{r['median_step_s'] * 1e3:.2f} | "
                     + (f"{r['speedup']:.2f}× | " if "speedup" in r else "– | ")
                     + f"{r['loglik_per_token']:.6f} | "
                     + (f"{r['loglik_diff']:.1e} |" if "loglik_diff" in r else "– |"))
    return "\n".join(lines)


def _first(pair: tuple) -> Any:
    return pair[0]


def _second(pair: tuple) -> Any:
    return pair[1]


def _sums(reduced: tuple) -> tuple[float, float]:
    """The log-likelihood's two sums of a round's reduce, without its Λ."""
    return reduced[1], reduced[2]


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
