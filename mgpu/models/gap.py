"""Canny's Gamma-Poisson (GaP) topic model of a bag-of-words corpus, every update an SDDMM
followed by an SpMM (the cuSDDMM paper's reformulation).

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
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu import config
from mgpu.backends import array_module, on_device_of, synchronize, to_host
from mgpu.distributed.cluster import CLIENT, workers_now
from mgpu.distributed.collection import gpu_workers
from mgpu.distributed.spmd import spmd
from mgpu.distributed.tiles import RowTiles, check_scipy_or_tiles
from mgpu.models._gap_steps import (
    OVERFLOW,
    Alone,
    Setup,
    Tile,
    canonical_counts,
    check_finite_loglik,
    check_total,
    iterate,
    loglik_constants,
    rank_fit,
    starting_state,
)
from mgpu.ops.validation import (
    Interval,
    IsCallable,
    check_array,
    check_param,
    is_dask_array,
)

__all__ = ["GaP"]


class GaP:
    """Canny's Gamma-Poisson topic model, fitted by MAP updates of SDDMM + SpMM.

    The same class fits on one device (a scipy or cupyx matrix: the CPU or that GPU) and on
    a cluster (a dask array of row tiles, or ``client=``/``parts=``): the documents are cut
    into row tiles of equal nnz, each tile and its loadings stay on their worker (its GPU
    on GPU workers), and per iteration only the topics Λ move. On a cluster of GPU workers
    alone, or of CPU workers alone, the whole fit is one SPMD job (:func:`mgpu.spmd`: a
    task per worker, Λ's update summed between them by NCCL on GPUs), checkpointed every
    ``mgpu.spmd.checkpoint-every`` iterations and resumed from there when a worker is lost;
    a cluster that mixes GPU and CPU workers runs one Dask round per iteration. All give
    the same numbers up to rounding (the cluster paths the same bits as each other).

    Parameters
    ----------
    topics : int, default=20
    iters : int, default=50
        Alternating updates of X and Λ (two SDDMM and two SpMM each).
    alpha, beta : float, default=1.1, 10.0
        Gamma prior of the loadings: shape α >= 1 (keeps the MAP update non-negative), scale
        β > 0.
    seed : int, default=0
        The starting loadings and topics; the same for every device and split.

    Attributes
    ----------
    X_ : array of shape (n_docs, topics)
        The documents' loadings (numpy after a cluster fit, else S's array type).
    L_ : array of shape (n_words, topics)
        The topics Λ (each column a distribution over the words, up to its scale).
    history_ : list of dict
        Per iteration: ``iteration``, ``loglik_per_token``, ``step_s``, ``elapsed_s``.
    tiles_ : list of dict
        After a cluster fit, each row tile's ``worker``, ``rows`` and ``nnz`` in document
        order; empty after a fit on one device.

    Examples
    --------
    >>> S = sp.csr_matrix(np.array([[4, 3, 0, 0], [5, 2, 0, 1], [0, 0, 6, 3], [0, 1, 4, 4.]]))
    >>> model = GaP(topics=2, iters=60, seed=1).fit(S)
    >>> h = model.history_
    >>> h[-1]["loglik_per_token"] > h[0]["loglik_per_token"]
    True
    >>> model.transform(S).argmax(axis=1).tolist() == model.X_.argmax(axis=1).tolist()
    True
    """

    def __init__(self, topics: int = 20, *, iters: int = 50, alpha: float = 1.1,
                 beta: float = 10.0, seed: int = 0) -> None:
        self.topics = topics
        self.iters = iters
        self.alpha = alpha
        self.beta = beta
        self.seed = seed

    def fit(self, S: Any, *, client: Any = None, parts: int | None = None,
            progress: Callable[[dict[str, float]], None] | None = None) -> GaP:
        """Fit to a documents × words count matrix.

        Parameters
        ----------
        S : {sparse matrix, dask array} of shape (n_docs, n_words)
            Non-negative counts. A scipy or cupyx matrix fits on its own device; a dask
            array of CSR row tiles (:func:`mgpu.from_scipy`) fits on the cluster, its tiles
            where they are; a scipy matrix with ``client`` or ``parts`` is cut into tiles
            first.
        client : distributed.Client, optional
            The cluster (default: the current one, for a dask array or with ``parts``).
        parts : int, optional
            Row tiles of a scipy matrix (default: one per worker).
        progress : callable, optional
            Called with each iteration's record (that of ``history_``) as it arrives, once
            per iteration and in order, in the thread that called fit.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            For the parameters above out of range, negative counts, counts whose total
            overflows their dtype, or a cluster fit without a cluster.
        FloatingPointError
            When an update overflows S's dtype (the log-likelihood is NaN or infinite); its
            factors are not kept.
        TypeError
            For a dense matrix, or a cupyx matrix on a cluster.
        """
        _check_params(self.topics, self.iters, self.alpha, self.beta, self.seed)
        check_param(client, "client", "GaP.fit", [CLIENT, None])
        check_param(parts, "parts", "GaP.fit", [Interval(Integral, 1, None), None])
        check_param(progress, "progress", "GaP.fit", [IsCallable(), None])
        if client is not None or parts is not None or is_dask_array(S):
            check_scipy_or_tiles(S, "S", "GaP.fit on a cluster", ensure_all_finite=True)
            self._fit_tiles(S, client, parts, progress)
        else:
            check_array(S, "S", "GaP.fit", accept_dense=False, ensure_all_finite=True,
                        kinds="a scipy or cupyx sparse matrix, or a dask array of row tiles")
            self._fit_local(S, progress)
        return self

    def _fit_local(self, S: Any, progress: Callable[[dict[str, float]], None] | None) -> None:
        tile = Tile.of(S)
        X, L = starting_state(tile.S.shape, tile.S.dtype, float(tile.S.sum()), self.topics,
                              self.seed)
        xp = array_module(tile.S)
        log_fact, tokens = loglik_constants(tile.S)
        setup = Setup(self.iters, self.alpha, self.beta, log_fact, tokens, 0)
        X, L, history = iterate(Alone(progress), [tile], [xp.asarray(X)], xp.asarray(L),
                                setup, [])
        self.X_, self.L_, self.history_, self.tiles_ = X[0], L, history, []

    def _fit_tiles(self, S: Any, client: Any, parts: int | None,
                   progress: Callable[[dict[str, float]], None] | None) -> None:
        """The documents in row tiles on the cluster's workers, each tile and its loadings
        X on its worker (its GPU on GPU workers).

        When every tile is on a worker of one kind (all GPU workers or all CPU workers), the
        fit is one SPMD job (:func:`mgpu.spmd`): a task per worker runs every iteration on
        its tiles, Λ's update summed between the workers by an all-reduce (NCCL between
        GPUs), the client waiting once. Its records come from rank 0's loop (``step_s`` is
        that loop's time of an iteration); every ``mgpu.spmd.checkpoint-every`` iterations
        (and at the start) the tiles' state is checkpointed, and a fit whose worker is lost
        goes on from the last checkpoint on the workers that remain, with the same numbers
        (:func:`~mgpu.models._gap_steps.tile_sum`). A cluster that mixes GPU and CPU
        workers keeps one Dask round per iteration (:meth:`_fit_rounds`). X_ and L_ are
        numpy.
        """
        tiles, corpus = _place(S, client, parts)
        # the client draws a seed the ranks share: seed=None must not mean one per rank
        seed = self.seed if self.seed is not None else _fresh_seed()
        start = (corpus.shape, corpus.dtype, corpus.total, self.topics, seed)
        setup = Setup(self.iters, self.alpha, self.beta, corpus.log_fact, corpus.tokens,
                      int(config.get("spmd.checkpoint-every")))
        if _one_kind(tiles):
            out = spmd(rank_fit, tiles, args=(start, setup, len(tiles)),
                       client=tiles.client, name="gap",
                       progress=None if progress is None else _in_order(progress))
            X = {i: x for rank in out for i, x in rank["X"].items()}
            self.X_ = np.vstack([X[i] for i in range(len(tiles))])
            self.L_, self.history_ = out[0]["L"], out[0]["history"]
        else:
            self._fit_rounds(tiles, start, setup, corpus.dtype, progress)
        self.tiles_ = tiles.describe()

    def _fit_rounds(self, tiles: RowTiles, start: tuple[Any, ...], setup: Setup,
                    dtype: np.dtype, progress: Callable[[dict[str, float]], None] | None
                    ) -> None:
        """The fit as one Dask round per iteration (a cluster of GPU and CPU workers).

        Per iteration only the topics Λ (words × topics) move: each tile returns its share of
        Λ's update, one task sums them, and the new Λ goes to every tile. The log-likelihood
        of an iteration is summed in the next round, from the same rates that start that
        round's update, so one round per iteration suffices. ``step_s`` in the history is
        the time between consecutive iterations as the client sees them finish.
        """
        iters, alpha, beta = self.iters, self.alpha, self.beta
        X0, L0 = starting_state(*start)
        tiny = float(np.finfo(dtype).tiny)
        history: list[dict[str, float]] = []
        state = tiles.map(_tile_task, tiles.blocks)
        X = tiles.hold("X0", [X0[tiles.rows(i)] for i in range(len(tiles))])
        L = tiles.share("L0", L0)
        t_start = last = time.perf_counter()
        pending: deque = deque()
        for r in range(1, iters + 2):
            update = r <= iters
            steps = tiles.map(_step_task, state, X, args=(L, update, alpha, beta, tiny))
            X = tiles.map(_first, steps)
            shares = tiles.map(_second, steps)
            red = tiles.submit(_reduce_task, L, tiny, *shares)
            if update:
                L = tiles.submit(_first, red)
            if r >= 2:  # the client fetches the two sums alone, not Λ with them
                pending.append((r - 1, tiles.submit(_sums, red)))
            while pending and (len(pending) > 1 or not update):
                it, fut = pending.popleft()
                ll, penalty = tiles.result(fut, f"GaP iteration {it}")
                loglik = ll - penalty - setup.log_fact
                check_finite_loglik(loglik, it, dtype)
                now = time.perf_counter()
                rec = {"iteration": it, "loglik_per_token": loglik / setup.tokens,
                       "step_s": now - last, "elapsed_s": now - t_start}
                last = now
                history.append(rec)
                if progress is not None:
                    progress(rec)
        self.X_ = np.vstack([to_host(tiles.result(x, "GaP's final factors")) for x in X])
        self.L_ = to_host(tiles.result(L, "GaP's final factors"))
        self.history_ = history

    def transform(self, S: Any, *, iters: int | None = None) -> Any:
        """The loadings of documents under the fitted topics (Λ kept fixed).

        Starts as :meth:`fit` starts (from ``seed``) and runs ``iters`` (default: the
        model's) updates of the loadings alone, each one SDDMM and one SpMM.

        Parameters
        ----------
        S : {scipy, cupyx} sparse matrix of shape (n_docs, n_words)
            Counts over the fitted vocabulary.
        iters : int, optional

        Returns
        -------
        X : array of shape (n_docs, topics), on S's device
        """
        L = getattr(self, "L_", None)
        if L is None:
            raise ValueError("This GaP is not fitted yet: call fit first.")
        check_array(S, "S", "GaP.transform", accept_dense=False, ensure_all_finite=True)
        if S.shape[1] != L.shape[0]:
            raise ValueError(f"The 'S' parameter of GaP.transform must have the fitted "
                             f"{L.shape[0]} words as columns. Got {S.shape[1]} instead.")
        if iters is not None:
            check_param(iters, "iters", "GaP.transform", Interval(Integral, 1, None),
                        _RANGES)
        iters = self.iters if iters is None else iters
        _check_params(self.topics, iters, self.alpha, self.beta, self.seed)
        tile = Tile.of(S)
        xp = array_module(tile.S)
        X, _ = starting_state(tile.S.shape, tile.S.dtype, float(tile.S.sum()), self.topics,
                              self.seed)
        X, L = xp.asarray(X), xp.asarray(to_host(L) if xp is np else L, dtype=tile.S.dtype)
        tiny = np.finfo(tile.S.dtype).tiny
        for _ in range(iters):
            X = tile.update_loadings(X, L, self.alpha, self.beta, tiny, tile.rates(X, L))
        if not bool(xp.isfinite(X).all()):
            raise FloatingPointError(OVERFLOW.format(where="GaP.transform's updates",
                                                      dtype=tile.S.dtype))
        return X

    def top_words(self, vocab: list[str] | None = None, n: int = 8) -> list[list[str]]:
        """Each topic's n heaviest words (ids as strings without a vocabulary); a vocabulary
        of another length than the fitted words is refused (ValueError).

        >>> model = GaP(topics=2)
        >>> model.L_ = np.array([[0.1, 0.7], [0.9, 0.3]])
        >>> model.top_words(["a", "b"], 1)
        [['b'], ['a']]
        """
        L = to_host(self.L_)
        if vocab is not None and len(vocab) != L.shape[0]:
            raise ValueError(f"The 'vocab' parameter of GaP.top_words must hold one word per "
                             f"fitted word ({L.shape[0]:,}). Got {len(vocab):,} instead.")
        order = np.argsort(-L, axis=0, kind="stable")[:n].T
        return [[vocab[w] if vocab is not None else str(w) for w in row] for row in order]


@dataclass(frozen=True)
class _Corpus:
    """What a cluster fit needs to know of the whole corpus: its shape, the dtype it is
    fitted in, its total count, Σ log s! and its tokens."""

    shape: tuple[int, int]
    dtype: np.dtype
    total: float
    log_fact: float
    tokens: float


def _place(S: Any, client: Any, parts: int | None) -> tuple[RowTiles, _Corpus]:
    """S's row tiles on the cluster and its sums, a dask corpus's counts checked tile by
    tile (NaN, negative counts, an overflowing total are refused here, before the fit)."""
    if is_dask_array(S):
        tiles = RowTiles.place(S, name="gap", client=client)
        stats = [tiles.result(f, "GaP's corpus sums")
                 for f in tiles.map(_stats_task, tiles.blocks)]
        if not all(st["finite"] for st in stats):
            raise ValueError("The 'S' parameter of GaP.fit on a cluster holds NaN or "
                             "infinity.")
        if any(st["min"] < 0 for st in stats):
            raise ValueError("The 'S' parameter of GaP.fit must hold non-negative counts.")
        dtype = np.dtype(stats[0]["dtype"]) if stats else np.dtype(np.float64)
        total = float(sum(st["sum"] for st in stats))
        check_total(total, dtype)
        return tiles, _Corpus(S.shape, dtype, total,
                              float(sum(st["log_fact"] for st in stats)),
                              float(sum(st["tokens"] for st in stats)))
    S = canonical_counts(S)
    # the tiles first: without a cluster, nothing is computed on the client
    tiles = RowTiles.place(S, name="gap", parts=parts, client=client)
    log_fact, tokens = loglik_constants(S)
    return tiles, _Corpus(S.shape, S.dtype, float(S.sum()), log_fact, tokens)


def _one_kind(tiles: RowTiles) -> bool:
    """Whether every tile is on a worker of one kind, all with a GPU or all without (a tile
    whose worker is not known counts every worker of the cluster)."""
    gpu = set(gpu_workers(tiles.client))
    holders = {w for w in tiles.workers if w is not None}
    if None in tiles.workers:
        holders |= set(workers_now(tiles.client))
    return len({w in gpu for w in holders}) <= 1


def _fresh_seed() -> int:
    """A seed from the operating system's entropy, for a cluster fit with ``seed=None``."""
    return int(np.random.SeedSequence().entropy)


def _in_order(progress: Callable[[dict[str, float]], None]) -> Callable[[dict[str, float]], None]:
    """``progress`` fed each iteration once, in order: a fit resumed from a checkpoint
    reports again the iterations after it, which the callback has had."""
    last = [0]

    def feed(record: dict[str, float]) -> None:
        if record["iteration"] > last[0]:
            last[0] = record["iteration"]
            progress(record)

    return feed


_RANGES = " (topics and iters must be >= 1, alpha >= 1 and beta > 0)"


def _check_params(topics: int, iters: int, alpha: float, beta: float, seed: int) -> None:
    check_param(topics, "topics", "GaP", Interval(Integral, 1, None), _RANGES)
    check_param(iters, "iters", "GaP", Interval(Integral, 1, None), _RANGES)
    check_param(alpha, "alpha", "GaP", Interval(Real, 1, None), _RANGES)
    check_param(beta, "beta", "GaP", Interval(Real, 0, None, closed="neither"), _RANGES)
    check_param(seed, "seed", "GaP", [Interval(Integral, 0, None), None], " (numpy's seeds)")


def check_counts(S: Any, name: str = "S", func: str = "GaP.fit") -> Any:
    """S as GaP fits it (float CSR, sorted and summed, a copy where that changes anything),
    or the refusal :meth:`GaP.fit` would give (a dense or complex matrix, NaN, negative
    counts, a total that overflows), in the words of ``func``'s ``name``: for a caller that
    checks a corpus before it starts a cluster."""
    check_array(S, name, func, accept_dense=False, ensure_all_finite=True,
                kinds="a scipy or cupyx sparse matrix")
    return canonical_counts(S, name, func)


# ------------------------------------------------------------------- tasks on the tiles


def _stats_task(S: Any) -> dict[str, Any]:
    """What the start needs of a tile of a dask corpus: its total, Σ log s!, its tokens,
    whether its counts are finite, its smallest count and the dtype the fit uses."""
    tile = _canonical_unchecked(S)
    host = to_host(tile.data)
    finite = bool(np.isfinite(host).all())
    low = float(host.min()) if host.size and finite else 0.0
    # NaN or negative counts are refused by the client, which reads "finite" and "min"
    log_fact, tokens = loglik_constants(tile) if finite and low >= 0 else (0.0, 0.0)
    return {"sum": float(host.sum()), "log_fact": log_fact, "tokens": tokens,
            "finite": finite, "min": low, "dtype": tile.dtype.str}


def _canonical_unchecked(S: Any) -> Any:
    S = S.tocsr()
    dtype = S.dtype if S.dtype in (np.float32, np.float64) else np.float64
    return S.astype(dtype)


def _tile_task(S: Any) -> Tile:
    return Tile.of(S)


def _step_task(tile: Tile, X: Any, L: Any, update: bool, alpha: float, beta: float,
               tiny: float) -> tuple[Any, tuple]:
    """One round on one tile: the log-likelihood sums of the current state, then (unless this
    is the last round) the loadings' update and this tile's share of the topics' update."""
    # a host piece sent to a GPU worker crosses once
    X, L = on_device_of(X, tile.S.data), on_device_of(L, tile.S.data)
    R = tile.rates(X, L)
    parts: tuple = (to_host(tile.loglik_parts(R, X, tiny)),)
    if update:
        X = tile.update_loadings(X, L, alpha, beta, tiny, R)
        parts += (tile.topic_parts(X, L, tiny),)
    return synchronize(X), parts


def _reduce_task(L: Any, tiny: float, *parts: tuple) -> tuple[Any, float, Any]:
    """Sum the tiles' shares in tile order: (Λ updated, or None in the last round; Σ s log ŝ;
    the Σ_k (1ᵀX)_k (1ᵀΛ)_k term of the log-likelihood)."""
    sums = sum(p[0] for p in parts)
    penalty = float((sums[1:] * to_host(L.sum(axis=0)).astype(np.float64)).sum())
    L_next = None
    if len(parts[0]) == 2:
        total = parts[0][1]
        for p in parts[1:]:
            total = total + on_device_of(p[1], total)
        L = on_device_of(L, total)
        L_next = L * total[:-1] / array_module(total).maximum(total[-1], tiny)
    return L_next, float(sums[0]), penalty


def _first(pair: tuple) -> Any:
    return pair[0]


def _second(pair: tuple) -> Any:
    return pair[1]


def _sums(reduced: tuple) -> tuple[float, float]:
    """The log-likelihood's two sums of a round's reduce, without its Λ."""
    return reduced[1], reduced[2]
