"""The GaP topic model's updates on a tile of documents, and its loop over the tiles of one
rank: the same code fits on one device (a rank alone) and as every rank of an SPMD job
(:func:`mgpu.spmd`). :mod:`mgpu.models.gap` holds the estimator."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import gammaln

import mgpu
from mgpu.backends import array_module, to_host
from mgpu.models._transpose import Transposer
from mgpu.ops.validation import canonical_csr

__all__ = ["OVERFLOW", "Alone", "Setup", "Tile", "canonical_counts", "check_finite_loglik",
           "check_total", "iterate", "loglik_constants", "rank_fit", "starting_state"]


def canonical_counts(S: Any, name: str = "S", func: str = "GaP.fit") -> Any:
    """S as float CSR with sorted, summed entries (a copy where that changes anything: the
    caller's matrix is never sorted in place), refusing negative counts."""
    S = canonical_csr(S)
    if S.nnz and float(S.data.min()) < 0:
        raise ValueError(f"The '{name}' parameter of {func} must hold non-negative counts.")
    with np.errstate(over="ignore"):  # an overflowing total is refused below, in words
        total = float(S.sum(dtype=np.float64))
    check_total(total, S.dtype, name, func)
    return S


def check_total(total: float, dtype: Any, name: str = "S", func: str = "GaP.fit") -> None:
    """Refuse counts whose total overflows (the starting loadings are scaled by it)."""
    if not np.isfinite(total) or total > np.finfo(dtype).max:
        raise ValueError(f"The '{name}' parameter of {func} holds counts whose total "
                         f"({total:.4g}) overflows {np.dtype(dtype).name}. Scale the counts "
                         "down.")


OVERFLOW = ("{where} overflowed {dtype}: the counts of 'S' or the prior (alpha, beta) are too "
            "large for it. Scale the counts down, pass float64 counts, or choose a smaller "
            "prior.")


def check_finite_loglik(loglik: float, it: int, dtype: Any) -> None:
    """Refuse an iteration whose log-likelihood is NaN or infinite (the SDDMMs and SpMMs of
    the updates run unchecked)."""
    if not np.isfinite(loglik):
        raise FloatingPointError(OVERFLOW.format(
            where=f"GaP's updates at iteration {it} (log-likelihood {loglik})",
            dtype=np.dtype(dtype).name))


def starting_state(shape: tuple[int, int], dtype: Any, total: float, topics: int,
                   seed: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The starting loadings and topics (numpy), the same for every device and split, from
    the corpus's shape, dtype and total count."""
    n_docs, n_words = shape
    rng = np.random.default_rng(seed)
    X = rng.gamma(1.0, 1.0, (n_docs, topics)).astype(dtype)
    L = rng.gamma(1.0, 1.0, (n_words, topics)).astype(dtype)
    L /= L.sum(axis=0, keepdims=True)
    X *= total / n_docs / topics
    return X, L


def loglik_constants(S: Any) -> tuple[float, float]:
    """Σ log s! over the nonzero counts, and the number of tokens."""
    data = np.asarray(to_host(S.data), dtype=np.float64)
    return float(gammaln(data + 1.0).sum()), float(data.sum())


@dataclass
class Tile:
    """Documents (rows) of the corpus with what the updates need: the counts and the map
    that transposes a matrix of their pattern by one gather."""

    S: Any
    transpose: Transposer

    @classmethod
    def of(cls, S: Any) -> Tile:
        S = canonical_counts(S)
        return cls(S, Transposer.of(S))

    def rates(self, X: Any, L: Any) -> Any:
        """ŝ = S's pattern ∘ (X Λᵀ): the Poisson rates at the nonzero counts (SDDMM),
        unchecked, as the SpMMs are: the fit watches the log-likelihood instead
        (:func:`check_finite_loglik`), whose message names GaP's input, not SDDMM's operands."""
        return mgpu.sddmm(self.S, X, L, hadamard=False, check_finite=False)

    def _ratio(self, R: Any, tiny: float) -> Any:
        R.data = self.S.data / array_module(self.S).maximum(R.data, tiny)
        return R

    def update_loadings(self, X: Any, L: Any, alpha: float, beta: float, tiny: float,
                        R: Any) -> Any:
        """X ← (X ∘ ((S / ŝ) Λ) + α − 1) / (1ᵀΛ + 1/β), given ŝ = ``R``."""
        X = X * mgpu.spmm(self._ratio(R, tiny), L, check_finite=False)
        X += alpha - 1.0
        X /= L.sum(axis=0) + 1.0 / beta
        return X

    def topic_parts(self, X: Any, L: Any, tiny: float) -> Any:
        """The sums behind Λ's update for these documents: (S / ŝ)ᵀ X (words × topics) with
        1ᵀX as one more row."""
        Q = self._ratio(self.rates(X, L), tiny)
        part = mgpu.spmm(self.transpose(Q.data), X, check_finite=False)
        return array_module(X).concatenate([part, X.sum(axis=0)[None]])

    def loglik_parts(self, R: Any, X: Any, tiny: float) -> Any:
        """[Σ s log ŝ, 1ᵀX] over these documents (given ŝ = ``R``): a float64 vector of
        ``1 + topics`` on S's device."""
        xp = array_module(self.S)
        ll = (self.S.data.astype(xp.float64)
              * xp.log(xp.maximum(R.data.astype(xp.float64), tiny))).sum()
        return xp.concatenate([ll.reshape(1), X.sum(axis=0).astype(xp.float64)])


# ------------------------------------------------------------------- the iterations


@dataclass(frozen=True)
class Setup:
    """What every rank's loop needs besides its tiles: the iterations, the prior, the
    corpus's constant terms of the log-likelihood, and the iterations between checkpoints
    (0: none)."""

    iters: int
    alpha: float
    beta: float
    log_fact: float
    tokens: float
    every: int


class Alone:
    """The communicator of a fit on one device: one rank with one tile, nothing to
    exchange, progress straight to the caller's callback."""

    rank = 0
    resumed = None

    def __init__(self, progress: Callable[[dict[str, float]], None] | None) -> None:
        self._progress = progress

    def allreduce(self, x: Any) -> Any:
        return x

    def report(self, record: dict[str, float]) -> None:
        if self._progress is not None:
            self._progress(record)

    def checkpoint(self, iteration: int, state: dict[int, dict[str, Any]]) -> None:
        pass


def tile_sum(comm: Any, local: list[Any], indices: tuple[int, ...], n_tiles: int) -> Any:
    """The sum over every tile of the corpus of its array (``local``: this rank's, for its
    tiles ``indices``), added in tile order.

    Each rank writes its tiles' arrays into their slots of a zeroed buffer of one slot per
    tile, the buffers are all-reduced (adding zeros is exact), and every rank adds the slots
    in tile order: the sum is the same bits whichever worker holds which tile, so a fit
    resumed on fewer workers goes on exactly as the undisturbed one would have. The price is
    an all-reduce of n_tiles arrays rather than one: with a tile per GPU and Λ's shares
    (words × topics), a fraction of a millisecond between the GPUs of one host."""
    xp = array_module(local[0])
    slots = xp.zeros((n_tiles, *local[0].shape), dtype=local[0].dtype)
    for i, x in zip(indices, local):
        slots[i] = x
    every = comm.allreduce(slots)
    if n_tiles == 1:
        return every[0]
    total = every[0] + every[1]
    for i in range(2, n_tiles):
        total += every[i]
    return total


def iterate(comm: Any, tiles: list[Tile], X: list[Any], L: Any, setup: Setup,
             history: list[dict[str, float]], indices: tuple[int, ...] = (0,),
             n_tiles: int = 1) -> tuple[list[Any], Any, list[dict[str, float]]]:
    """The fit's iterations after the last record of ``history``, over this rank's ``tiles``
    (tile numbers ``indices``) and their loadings ``X``, with the topics ``L`` every rank
    holds: per iteration the loadings' update, Λ's update from every tile's share
    (:func:`tile_sum`), then the log-likelihood of the new state, whose rates start the
    next iteration's update (two SDDMMs and two SpMMs an iteration). Every rank computes the
    same Λ and log-likelihood from the same sums; rank 0's records reach the caller."""
    xp = array_module(L)
    dtype = L.dtype
    tiny = float(np.finfo(dtype).tiny)
    done = history[-1]["iteration"] if history else 0
    t_start = time.perf_counter() - (history[-1]["elapsed_s"] if history else 0.0)
    R = [t.rates(x, L) for t, x in zip(tiles, X)]
    # unchecked updates: an overflow shows in the log-likelihood, which is watched, not as
    # numpy's warnings
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for it in range(done + 1, setup.iters + 1):
            t0 = time.perf_counter()
            X = [t.update_loadings(x, L, setup.alpha, setup.beta, tiny, r)
                 for t, x, r in zip(tiles, X, R)]
            total = tile_sum(comm, [t.topic_parts(x, L, tiny) for t, x in zip(tiles, X)],
                              indices, n_tiles)
            L = L * total[:-1] / xp.maximum(total[-1], tiny)
            R = [t.rates(x, L) for t, x in zip(tiles, X)]
            sums = tile_sum(comm, [t.loglik_parts(r, x, tiny) for t, x, r in zip(tiles, X, R)],
                             indices, n_tiles)
            penalty = (sums[1:] * L.sum(axis=0).astype(xp.float64)).sum()
            ll, penalty = to_host(xp.stack([sums[0], penalty])).tolist()
            loglik = ll - penalty - setup.log_fact
            check_finite_loglik(loglik, it, dtype)
            now = time.perf_counter()
            rec = {"iteration": it, "loglik_per_token": loglik / setup.tokens,
                   "step_s": now - t0, "elapsed_s": now - t_start}
            history.append(rec)
            comm.report(rec)
            if setup.every and it % setup.every == 0 and it < setup.iters:
                comm.checkpoint(it, _state(indices, X, L, history))
    return X, L, history


_RECORD = ("loglik_per_token", "step_s", "elapsed_s")


def _state(indices: tuple[int, ...], X: list[Any], L: Any, history: list[dict[str, float]]
           ) -> dict[int, dict[str, np.ndarray]]:
    """A checkpoint of this rank's tiles: each tile's loadings, with Λ and the history so
    far beside every tile (a rank that takes over any of them can go on)."""
    Lh = to_host(L)
    past = np.array([[h[k] for k in _RECORD] for h in history], dtype=np.float64)
    return {i: {"X": to_host(x), "L": Lh, "history": past} for i, x in zip(indices, X)}


def _history(past: np.ndarray, done: int) -> list[dict[str, float]]:
    """The records of a checkpoint's history, up to iteration ``done``."""
    return [{"iteration": i + 1, **dict(zip(_RECORD, map(float, row)))}
            for i, row in enumerate(past[:done])]


def rank_fit(comm: Any, parts: list[Any], start: tuple[Any, ...], setup: Setup,
              n_tiles: int) -> dict[str, Any]:
    """One rank of a cluster fit (:func:`mgpu.spmd`): its tiles' state and loadings (its rows
    of the one-device start, or the checkpoint ``comm.resumed`` holds), every iteration, and
    its tiles' loadings on the host (rank 0 adds Λ and the history).

    With checkpoints on, the start is the first (iteration 0): a worker lost before the
    first periodic one costs the iterations done, not the fit."""
    tiles = [Tile.of(p.data) for p in parts]
    indices = tuple(p.index for p in parts)
    xp = array_module(tiles[0].S)
    if comm.resumed is None:
        X0, L0 = starting_state(*start)
        X, L, history = [X0[p.rows] for p in parts], L0, []
        if setup.every:
            comm.checkpoint(0, _state(indices, X, L, history))
    else:
        done, saved = comm.resumed
        X = [saved[i]["X"] for i in indices]
        L = saved[indices[0]]["L"]
        history = _history(saved[indices[0]]["history"], done)
    X, L = [xp.asarray(x) for x in X], xp.asarray(L)
    X, L, history = iterate(comm, tiles, X, L, setup, history, indices, n_tiles)
    lead = comm.rank == 0
    return {"X": {i: to_host(x) for i, x in zip(indices, X)},
            "L": to_host(L) if lead else None, "history": history if lead else None}


