"""Plain SGD for matrix factorisation R ≈ P Qᵀ (no biases, as in the HSGD* thesis): the CPU
block kernel and the RMSE, in numba (nogil, so one worker's threads run blocks at once), and
the random train/test split every ratings job uses."""
from __future__ import annotations

import time
from typing import Any

import numba
import numpy as np
import scipy.sparse as sp

from mgpu.backends import sgd_lookup
from mgpu.backends.jit import njit
from mgpu.mf.schedule import WaveSchedule, pass_order

__all__ = ["check_divergence", "compile_cpu", "libmf_order", "rmse", "sgd_block", "split_ratings"]

_AS_GIVEN = np.empty(0, dtype=np.int64)

DIVERGENCE = 10.0
"""A factorisation whose training RMSE rises past this many times its scale at the start
has diverged (MatrixFactorization and GradientMF raise FloatingPointError): a finite but
huge RMSE is as wrong as NaN, and a rate that throws the factors that far does not bring
them back to a useful fit."""


@njit(nogil=True, fastmath=False)
def _sgd(users, items, ratings, order, P, Q, lr, reg_p, reg_q):
    k = P.shape[1]
    given = order.shape[0] == 0  # no order: the ratings as they are stored
    for t in range(users.shape[0] if given else order.shape[0]):
        n = t if given else order[t]
        u = users[n]
        i = items[n]
        e = ratings[n]
        for f in range(k):
            e -= P[u, f] * Q[i, f]
        for f in range(k):
            p = P[u, f]
            q = Q[i, f]
            P[u, f] = p + lr * (e * q - reg_p * p)
            Q[i, f] = q + lr * (e * p - reg_q * q)


def sgd_block(users: Any, items: Any, ratings: Any, P: Any, Q: Any, lr: float, reg_p: float,
              reg_q: float, order: Any = None, conflicts: float | None = None,
              max_warps: int | None = None, *, schedule: WaveSchedule | None = None) -> None:
    """One SGD pass over the given ratings, updating P and Q in place.

    ``users`` and ``items`` index rows of P and Q; ``order`` is the visiting order (default
    as given). For each rating: e = r − pᵤ·qᵢ, pᵤ += lr·(e·qᵢ − reg_p·pᵤ),
    qᵢ += lr·(e·pᵤ − reg_q·qᵢ), both from the old values. numpy arrays run the numba kernel
    (one rating after the other); CuPy arrays (int32 ids, one float dtype) run
    ``kernels/sgd.cu``, one warp per rating and lock-free between warps (cuMF_SGD's scheme);
    ``conflicts`` (GPU only) bounds the warps in flight so that the busiest user or item is
    in about that many updates at once (None: as many warps as the device holds), and
    ``max_warps`` (GPU only) caps them outright (a GPU given a smaller share of itself).

    ``schedule`` (:func:`mgpu.mf.schedule.build_schedule`, the ratings given in its order)
    runs the wavefront scheme instead: on a GPU no two warps ever update one user or item
    (``kernels/sgd.cu``'s ``mgpu_sgd_wave``), on a CPU the same pass one rating after the
    other (:func:`mgpu.mf.schedule.pass_order`), with the same result; each call is the
    schedule's next pass (its diagonals drawn from its seed and ``schedule.passes``, which
    the call advances). It takes no ``order`` and no ``conflicts``.

    >>> P, Q = np.full((1, 2), 0.5), np.full((1, 2), 0.5)
    >>> sgd_block(np.array([0]), np.array([0]), np.array([1.5]), P, Q, 0.1, 0.0, 0.0)
    >>> P.round(3).tolist()
    [[0.55, 0.55]]
    """
    kw: dict[str, Any] = {} if conflicts is None else {"conflicts": float(conflicts)}
    if max_warps is not None:
        kw["max_warps"] = int(max_warps)
    if schedule is not None:
        if order is not None or conflicts is not None:
            raise ValueError(
                "The 'schedule' parameter of sgd_block fixes the order of every update and "
                "lets no two collide: it takes no 'order' and no 'conflicts' (got "
                f"order={'given' if order is not None else None}, conflicts={conflicts!r}). "
                "Pass the ratings in the schedule's order, or drop the schedule.")
        if not isinstance(schedule, WaveSchedule):
            raise TypeError(f"The 'schedule' parameter of sgd_block must be a "
                            f"mgpu.mf.schedule.WaveSchedule or None. Got "
                            f"{type(schedule).__name__} instead.")
        kw["schedule"] = schedule
    sgd_lookup(users, items, ratings, P, Q, float(lr), float(reg_p), float(reg_q), order, **kw)


@sgd_lookup.register(np.ndarray)
def _sgd_cpu(users: np.ndarray, items: np.ndarray, ratings: np.ndarray, P: np.ndarray,
             Q: np.ndarray, lr: float, reg_p: float, reg_q: float,
             order: np.ndarray | None = None, schedule: WaveSchedule | None = None) -> None:
    if schedule is not None:  # the GPU's wavefront pass, one rating after the other
        if users.shape[0] != schedule.size:
            raise ValueError(f"The schedule covers {schedule.size} ratings; this pass was given "
                             f"{users.shape[0]}. Build it (mgpu.mf.schedule.build_schedule) "
                             "from these ratings.")
        order = pass_order(schedule, schedule.passes)
        schedule.passes += 1
    _sgd(users, items, ratings, _AS_GIVEN if order is None else order, P, Q, lr, reg_p, reg_q)


def check_divergence(entry: dict[str, Any], watched: float, start_rmse: float, epoch: int,
                     lr: float) -> None:
    """Raise FloatingPointError, naming the epoch and the learning rate, when an epoch's
    RMSE (``watched``: the test RMSE, or the train RMSE without test ratings) or its train
    RMSE is NaN or infinite, or its train RMSE rose past :data:`DIVERGENCE` times
    ``start_rmse`` (that of the starting factors)."""
    train = entry["train_rmse"]
    if not np.isfinite(watched) or not np.isfinite(train):
        raise FloatingPointError(
            f"SGD diverged at epoch {epoch}: train RMSE {train}, test RMSE "
            f"{entry['test_rmse']}; lower the learning rate (lr={lr}).")
    if train > DIVERGENCE * start_rmse:
        raise FloatingPointError(
            f"SGD diverged at epoch {epoch}: the train RMSE rose to {train:.4g}, past "
            f"{DIVERGENCE:g} times that of the starting factors ({start_rmse:.4g}); lower the "
            f"learning rate (lr={lr}).")


def compile_cpu(users: np.ndarray, items: np.ndarray, ratings: np.ndarray, P: np.ndarray,
                Q: np.ndarray) -> float:
    """Compile (or load from numba's cache) the CPU pass and the RMSE for the types of these
    arrays, on none of their ratings, so that no timed pass pays for it; the seconds it took.

    The pass is given an order (``order`` of :func:`sgd_block`), as the sequential fit's
    epochs give it; :func:`rmse` as the fit calls it.

    >>> P, Q = np.zeros((2, 3)), np.zeros((2, 3))
    >>> compile_cpu(np.array([0]), np.array([1]), np.array([4.0]), P, Q) >= 0
    True
    """
    t0 = time.perf_counter()
    none = slice(0, 0)
    u, i, r = users[none], items[none], ratings[none]
    _sgd(u, i, r, np.empty(0, dtype=np.int64), P, Q, 0.0, 0.0, 0.0)
    rated_u, rated_i = np.ones(P.shape[0], dtype=np.bool_), np.ones(Q.shape[0], dtype=np.bool_)
    _sq_err(u, i, r, P, Q, rated_u, rated_i, 0.0)
    return time.perf_counter() - t0


def libmf_order(users: np.ndarray, items: np.ndarray, by_user: bool) -> np.ndarray:
    """The order in which LIBMF's FPSGD visits a block's ratings: sorted by user, then item
    (``by_user``, LIBMF's choice when there are more users than items) or by item, then
    user; the randomness is in the shuffled strata and the order the blocks run. Against a
    new random permutation per pass, the ratings of one user (or item) come one after the
    other, so its factor row stays in cache, and no permutation is drawn per call.

    >>> libmf_order(np.array([2, 0, 2, 1]), np.array([0, 1, 1, 0]), by_user=True).tolist()
    [1, 3, 0, 2]
    >>> libmf_order(np.array([2, 0, 2, 1]), np.array([0, 1, 1, 0]), by_user=False).tolist()
    [3, 0, 1, 2]
    """
    major, minor = (users, items) if by_user else (items, users)
    return np.lexsort((minor, major))


@njit(nogil=True, parallel=True)
def _sq_err(users, items, ratings, P, Q, rated_users, rated_items, fallback):
    total = 0.0
    for n in numba.prange(users.shape[0]):
        u = users[n]
        i = items[n]
        if rated_users[u] and rated_items[i]:
            e = ratings[n]
            for f in range(P.shape[1]):
                e -= P[u, f] * Q[i, f]
        else:
            e = ratings[n] - fallback
        total += e * e
    return total


def rmse(users: np.ndarray, items: np.ndarray, ratings: np.ndarray, P: np.ndarray,
         Q: np.ndarray, rated: tuple[np.ndarray, np.ndarray] | None = None,
         fallback: float = 0.0) -> float:
    """Root mean squared error of P Qᵀ on the given ratings (nan for none).

    ``rated`` (a boolean per row of P and one per row of Q: does the training set rate it)
    makes a pair whose user or item is unrated predict ``fallback`` (the training mean) in
    place of pᵤ·qᵢ, whose factors never left their random start.

    >>> rmse(np.array([0]), np.array([0]), np.array([2.0]), np.ones((1, 1)), np.ones((1, 1)))
    1.0
    >>> rmse(np.array([0]), np.array([0]), np.array([2.0]), np.ones((1, 1)), np.ones((1, 1)),
    ...      rated=(np.array([True]), np.array([False])), fallback=2.5)
    0.5
    """
    if users.shape[0] == 0:
        return float("nan")
    if rated is None:
        rated = (np.ones(P.shape[0], dtype=np.bool_), np.ones(Q.shape[0], dtype=np.bool_))
    return float(np.sqrt(_sq_err(users, items, ratings, P, Q, rated[0], rated[1],
                                 float(fallback)) / users.shape[0]))


def split_ratings(R: sp.spmatrix, test_fraction: float, seed: int = 0
                  ) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Training and test ratings, the test ones drawn at random (a share ``test_fraction``).

    >>> R = sp.csr_matrix(np.arange(1.0, 11.0).reshape(2, 5))
    >>> tr, te = split_ratings(R, 0.2)
    >>> tr.nnz, te.nnz, (tr + te - R).nnz
    (8, 2, 0)
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"The 'test_fraction' parameter of split_ratings must be in (0, 1). Got "
                         f"{test_fraction!r} instead.")
    C = sp.coo_matrix(R)
    perm = np.random.default_rng(seed).permutation(C.nnz)
    n_test = int(round(C.nnz * test_fraction))
    if n_test == 0 or n_test == C.nnz:
        raise ValueError(f"{C.nnz} ratings cannot be split {test_fraction:.0%} held out.")

    def part(sel: np.ndarray) -> sp.csr_matrix:
        M = sp.csr_matrix((C.data[sel], (C.row[sel], C.col[sel])), shape=C.shape)
        M.sort_indices()
        return M

    return part(perm[n_test:]), part(perm[:n_test])
