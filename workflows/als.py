"""The ALS workflow: matrix factorisation of a ratings matrix whose every step is SDDMM then
SpMM (the cuSDDMM paper's reformulation: the gradient of the squared error at the observed
entries is ``(S ∘ (U Vᵀ) - R) V`` for U and its transpose for V).

``r_ij ≈ μ + u_i · v_j`` is fitted on the training ratings by full-batch gradient steps with
Adam's per-entry step sizes and an L2 penalty; each step costs one :func:`mgpu.sddmm` (the
predictions at the observed entries) and two :func:`mgpu.spmm` (the residual times V, its
transpose times U). NumPy/SciPy data runs on the CPU backend, CuPy data on the GPU.
:func:`train_distributed` runs the same steps with the users cut into row tiles on a
cluster's workers.
"""
from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

import mgpu
from mgpu.mf import split_ratings as split
from workflows._sparse import Transposer

__all__ = ["Factors", "split", "train", "train_distributed"]

logger = logging.getLogger(__name__)


@dataclass
class Factors:
    """The fitted model and what the training measured per step."""

    U: Any
    V: Any
    mean: float
    history: list[dict[str, float]] = field(default_factory=list)

    def predict(self, S: Any, *, check_finite: bool = True) -> Any:
        """Predictions at the stored entries of S (a CSR of S's pattern); ``check_finite``
        as in :func:`mgpu.sddmm` (of the factors)."""
        P = mgpu.sddmm(S, self.U, self.V, hadamard=False, check_finite=check_finite)
        P.data += self.mean
        return P


def train(R: Any, test: Any = None, *, k: int = 32, reg: float = 0.1, lr: float = 0.01,
          iters: int = 100, seed: int = 0, cuda_graph: bool = True,
          progress: Callable[[dict[str, float]], None] | None = None) -> Factors:
    """Fit ``R ≈ μ + U Vᵀ`` at R's stored entries (scipy or cupyx CSR, float32 or float64).

    Each step's SDDMM + SpMM time is recorded (``step_s``, synchronised on the GPU) with the
    training and test RMSE; ``progress`` receives each step's record.

    R's values are checked once; the steps then call SDDMM and SpMM with
    ``check_finite=False`` (no wait on the device inside a step) and watch the RMSE instead:
    NaN or infinity there, or in the final factors, raises FloatingPointError naming the step.

    On the GPU the step (its SDDMM, residual, transpose and two SpMM) is captured as a CUDA
    graph after the first step and replayed from then on, one launch a step
    (:class:`mgpu.backends.graph.Replay`); ``cuda_graph=False`` launches its kernels one by
    one every step. The numbers are the same either way.
    """
    if k < 1 or iters < 1 or lr <= 0 or reg < 0:
        raise ValueError(f"k and iters must be >= 1, lr > 0 and reg >= 0. Got k={k}, "
                         f"iters={iters}, lr={lr}, reg={reg}.")
    gpu = hasattr(R, "get")
    if gpu:
        import cupy as xp

        stream: Any = xp.cuda.Stream(non_blocking=True)  # the steps' own, for the capture

        def sync() -> None:
            stream.synchronize()
    else:
        xp = np
        stream = contextlib.nullcontext()

        def sync() -> None:
            pass
    R = R.tocsr()
    R.sort_indices()
    if R.nnz and not bool(xp.isfinite(R.data).all()):
        raise ValueError("The 'R' parameter of train holds NaN or infinity among its ratings. "
                         "Clean them first.")
    dtype = R.dtype
    m, n = R.shape
    mean = float(R.data.mean())
    rng = np.random.default_rng(seed)
    U = xp.asarray(rng.normal(0, 0.1, (m, k)).astype(dtype))
    V = xp.asarray(rng.normal(0, 0.1, (n, k)).astype(dtype))
    # the predictions at R's pattern (hadamard=False) each step; R does not change, so its
    # plan keeps the tuned scheme and any tiled copy of the pattern across steps
    plan = mgpu.sddmm_plan(R, k, dtype=dtype)
    transpose = Transposer.of(R)  # the residual's transpose each step: one gather
    cnt_u = xp.maximum(xp.diff(R.indptr), 1).astype(dtype)[:, None]
    cnt_v = xp.maximum(transpose.counts(), 1).astype(dtype)[:, None]
    state = {name: [xp.zeros_like(A), xp.zeros_like(A)] for name, A in (("U", U), ("V", V))}
    offset = mean - R.data
    model = Factors(U, V, mean)

    def run_step() -> tuple[Any, Any, Any]:
        """The predictions at the ratings, the residual on R's pattern, both gradients."""
        E = mgpu.sddmm(R, U, V, hadamard=False, plan=plan, check_finite=False)
        E.data += offset
        gU = mgpu.spmm(E, V, check_finite=False)
        gV = mgpu.spmm(transpose(E.data), U, check_finite=False)
        return E, gU, gV

    replay = None
    if gpu:  # the setup above ran on the default stream, the steps run on their own
        xp.cuda.Device().synchronize()
    t_start = time.perf_counter()
    # unchecked steps on the CPU: overflow shows in the RMSE, which is watched, not as
    # numpy's warnings
    with np.errstate(over="ignore", invalid="ignore"), stream:
        for it in range(1, iters + 1):
            sync()
            t0 = time.perf_counter()
            E, gU, gV = run_step() if replay is None else replay()
            sync()
            step = time.perf_counter() - t0
            train_rmse = float(xp.sqrt(xp.mean(E.data.astype(xp.float64) ** 2)))
            _finite(train_rmse, "training RMSE", it, lr)
            for name, A, g, cnt in (("U", U, gU, cnt_u), ("V", V, gV, cnt_v)):
                _adam(xp, A, g, cnt, state[name], it, lr, reg)
            rec = {"iteration": it, "step_s": step, "train_rmse": train_rmse,
                   "elapsed_s": time.perf_counter() - t_start}
            if test is not None:
                P = model.predict(test, check_finite=False)
                rec["test_rmse"] = float(xp.sqrt(xp.mean((P.data - test.data)
                                                         .astype(xp.float64) ** 2)))
                _finite(rec["test_rmse"], "test RMSE", it, lr)
            model.history.append(rec)
            if progress is not None:
                progress(rec)
            if gpu and cuda_graph and it == 1 and iters > 1:
                replay = _capture(run_step, stream)  # warm now: kernels built, plan tuned
    sync()  # the last Adam step, before the factors are used on another stream
    if not (bool(xp.isfinite(U).all()) and bool(xp.isfinite(V).all())):
        _finite(math.nan, "last step's factors", iters, lr)
    return model


def _capture(step: Callable[[], Any], stream: Any) -> Any:
    """``step`` as a CUDA graph to replay, or None (logged) where it cannot be captured."""
    from mgpu.backends.graph import Replay

    try:
        return Replay(step, stream)
    except Exception as exc:  # e.g. a CuPy or driver without stream capture
        logger.info("ALS: the step was not captured as a CUDA graph (%s); its kernels are "
                    "launched one by one.", exc)
        return None


def _finite(value: float, what: str, it: int, lr: float) -> None:
    """Refuse a NaN or infinite measure of the fit (the steps themselves check nothing)."""
    if not math.isfinite(value):
        raise FloatingPointError(f"ALS diverged at step {it}: the {what} is {value}. Lower the "
                                 f"learning rate (lr={lr}) or check the ratings' scale.")


_B1, _B2, _EPS = 0.9, 0.999, 1e-8


def _adam(xp: Any, A: Any, g: Any, cnt: Any, state: list[Any], it: int, lr: float,
          reg: float) -> None:
    """One Adam step of A in place from the summed gradient g (per-row means by ``cnt``, plus
    the L2 term); ``state`` holds the two moments, updated in place too."""
    g = g / cnt + reg * A
    mom, sq = state
    mom *= _B1
    mom += (1 - _B1) * g
    sq *= _B2
    sq += (1 - _B2) * g * g
    A -= (lr * (mom / (1 - _B1 ** it)) / (xp.sqrt(sq / (1 - _B2 ** it)) + _EPS)).astype(A.dtype)


# ------------------------------------------------------------------- across a cluster


@dataclass
class _Tile:
    """The training ratings of a block of users (rows), the map that transposes a matrix of
    their pattern by one gather, their test ratings, and the block's U with its Adam
    moments: all of it stays on the worker that holds the tile."""

    R: Any
    transpose: Transposer
    cnt: Any
    test: Any
    U: Any
    state: list[Any]


def _xp(S: Any) -> Any:
    if hasattr(S, "get"):
        import cupy

        return cupy
    return np


def _tile_task(R: Any, test: Any, U: np.ndarray) -> _Tile:
    """Build a tile on the worker holding R's rows (GPU arrays when R is a cupyx tile)."""
    xp = _xp(R)
    if xp is not np:
        import cupyx.scipy.sparse as csp

        test = csp.csr_matrix(test)
    R = R.tocsr()
    R.sort_indices()
    U = xp.asarray(U)
    cnt = xp.maximum(xp.diff(R.indptr), 1).astype(R.dtype)[:, None]
    return _Tile(R, Transposer.of(R), cnt, test, U,
                 [xp.zeros_like(U), xp.zeros_like(U)])


def _step_task(tile: _Tile, V: Any, it: int, update: bool, mean: float, lr: float,
               reg: float) -> tuple[_Tile, tuple]:
    """One round on one tile: the squared test error of the current U and V (the previous
    step's factors), then, unless this is the last round, the residual at the training
    ratings (SDDMM), U's gradient (SpMM) and Adam step, and this tile's share of V's gradient
    (SpMM of the residual's transpose). The values go unchecked (``check_finite=False``): the
    client watches the summed errors instead."""
    xp = _xp(tile.R)
    V = xp.asarray(V)
    test_sse = 0.0
    if tile.test.nnz:
        P = mgpu.sddmm(tile.test, tile.U, V, hadamard=False, check_finite=False)
        test_sse = float((((P.data + mean) - tile.test.data).astype(xp.float64) ** 2).sum())
    if not update:
        return tile, (0.0, test_sse, None)
    E = mgpu.sddmm(tile.R, tile.U, V, hadamard=False, check_finite=False)
    E.data += mean - tile.R.data
    gU = mgpu.spmm(E, V, check_finite=False)
    gV = mgpu.spmm(tile.transpose(E.data), tile.U, check_finite=False)
    train_sse = float((E.data.astype(xp.float64) ** 2).sum())
    # a task's input is another task's result: step copies, never the inputs in place
    U, state = tile.U.copy(), [a.copy() for a in tile.state]
    _adam(xp, U, gU, tile.cnt, state, it, lr, reg)
    from mgpu.backends import synchronize

    return replace(tile, U=U, state=state), (train_sse, test_sse, synchronize(gV))


def _reduce_task(V: Any, state: list[Any] | None, cnt: Any, it: int, update: bool,
                 lr: float, reg: float, *parts: tuple) -> tuple[Any, Any, float, float]:
    """Sum the tiles' shares of V's gradient in tile order and take V's Adam step (on
    copies: the inputs are other tasks' results; no moments yet: zeros), and sum the tiles'
    squared errors."""
    train_sse = sum(p[0] for p in parts)
    test_sse = sum(p[1] for p in parts)
    if update:
        xp = _xp(parts[0][2])
        g = parts[0][2]
        for p in parts[1:]:
            g = g + xp.asarray(p[2])
        V = xp.array(V, copy=True)
        state = ([xp.zeros_like(V), xp.zeros_like(V)] if state is None
                 else [xp.array(a, copy=True) for a in state])
        _adam(xp, V, g, xp.asarray(cnt), state, it, lr, reg)
    return V, state, train_sse, test_sse


def _take(out: tuple, i: int) -> Any:
    return out[i]


def _tile_factor(tile: _Tile) -> np.ndarray:
    return _host(tile.U)


def _host(a: Any) -> np.ndarray:
    return np.asarray(a.get() if hasattr(a, "get") else a)


def train_distributed(R: sp.spmatrix, test: sp.spmatrix | None = None, *,
                      parts: int | None = None, client: Any = None, k: int = 32,
                      reg: float = 0.1, lr: float = 0.01, iters: int = 100, seed: int = 0,
                      progress: Callable[[dict[str, float]], None] | None = None) -> Factors:
    """:func:`train` with the users cut into row tiles of equal nnz on a cluster's workers.

    Each tile's ratings, its rows of U and their Adam moments stay on its worker (its GPU on
    GPU workers); per step only V (items × k) moves: it is sent to every tile, each tile
    returns its share of V's gradient, and one task sums them and steps V. The test error
    of a step is summed in the next round, from the factors that start that round, so one
    round per step suffices. The result equals :func:`train`'s up to rounding (V's gradient
    is summed tile by tile).

    Parameters
    ----------
    R : scipy sparse matrix of shape (n_users, n_items)
        Training ratings, float32 or float64.
    test : scipy sparse matrix of shape (n_users, n_items), optional
        Test ratings; their RMSE is recorded per step.
    parts : int, optional
        Row tiles (default: one per worker).
    client : distributed.Client, optional
        Default: the current one (:func:`mgpu.connect`).
    k, reg, lr, iters, seed, progress
        As in :func:`train`. ``step_s`` is the time between consecutive steps as the
        client sees them finish.

    Returns
    -------
    Factors
        numpy U and V, and the history.

    Raises
    ------
    TypeError
        If R or test is not a scipy sparse matrix.
    ValueError
        For the parameters :func:`train` refuses, NaN or infinity among R's ratings, a test
        matrix of another shape, or no cluster.
    FloatingPointError
        When a step's RMSE or the final factors are NaN or infinite (the steps themselves
        run with ``check_finite=False``).
    """
    from collections import deque

    import uuid

    from mgpu.backends import is_gpu_array
    from mgpu.distributed import from_scipy
    from mgpu.distributed.cluster import current_client, result, task_placement
    from mgpu.distributed.collection import block_futures, place_as

    if k < 1 or iters < 1 or lr <= 0 or reg < 0:
        raise ValueError(f"k and iters must be >= 1, lr > 0 and reg >= 0. Got k={k}, "
                         f"iters={iters}, lr={lr}, reg={reg}.")
    for name, M in (("R", R), ("test", test)):
        if M is not None and not sp.issparse(M):
            raise TypeError(f"The '{name}' parameter of train_distributed must be a scipy "
                            f"sparse matrix. Got {type(M).__name__} instead.")
    if test is not None and test.shape != R.shape:
        raise ValueError(f"The 'test' parameter of train_distributed must have R's shape "
                         f"{R.shape}. Got {test.shape} instead.")
    client = client or current_client()
    if client is None:
        raise ValueError("train_distributed runs on a cluster: call mgpu.connect() first.")
    R = sp.csr_matrix(R)
    R.sum_duplicates()
    R.sort_indices()
    if not np.isfinite(R.data).all():
        raise ValueError("The 'R' parameter of train_distributed holds NaN or infinity among "
                         "its ratings. Clean them first.")
    dtype = R.dtype
    m, n = R.shape
    mean = float(R.data.mean())
    rng = np.random.default_rng(seed)  # the same start as train
    U0 = rng.normal(0, 0.1, (m, k)).astype(dtype)
    V0 = rng.normal(0, 0.1, (n, k)).astype(dtype)
    cnt_v = np.maximum(np.bincount(R.indices, minlength=n), 1).astype(dtype)[:, None]
    T = sp.csr_matrix((0, n), dtype=dtype) if test is None else sp.csr_matrix(test, dtype=dtype)
    Rd = from_scipy(R, parts, axis=0, client=client)
    blocks = block_futures(Rd, client)
    where = client.who_has(list(blocks.values()))
    bounds = np.concatenate([[0], np.cumsum(Rd.chunks[0])]).astype(np.int64)
    # A tile's work runs where its ratings are (task_placement) and its starting data is held
    # by tasks, not scattered: when a worker is lost, its tiles are made again elsewhere from
    # their tasks (every step since the first: it costs time, not results), where scattered
    # data would be gone for good.
    gpu_tiles = is_gpu_array(Rd._meta)
    run = uuid.uuid4().hex
    tiles = []
    for i in range(Rd.numblocks[0]):
        fut = blocks[(i, 0)]
        holders = list(where.get(fut.key, ()))[:1]
        pin = task_placement(holders, gpu_tiles)
        lo, hi = bounds[i], bounds[i + 1]
        te = place_as(client, f"mgpu-als-test-{run}-{i}",
                      T[lo:hi] if test is not None else sp.csr_matrix((hi - lo, n), dtype=dtype),
                      workers=holders)
        u = place_as(client, f"mgpu-als-U0-{run}-{i}", U0[lo:hi], workers=holders)
        tiles.append([client.submit(_tile_task, fut, te, u, pure=False, **pin), pin])
    V: Any = place_as(client, f"mgpu-als-V0-{run}", V0)
    state: Any = None
    n_train, n_test = R.nnz, T.nnz
    model = Factors(None, None, mean)
    t_start = last = time.perf_counter()
    pending: deque = deque()
    previous = None
    for r in range(1, iters + 2):
        update = r <= iters
        steps = [client.submit(_step_task, t, V, r, update, mean, lr, reg, pure=False, **pin)
                 for t, pin in tiles]
        for pair, st in zip(tiles, steps):
            pair[0] = client.submit(_take, st, 0, pure=False, **pair[1])
        shares = [client.submit(_take, st, 1, pure=False, **pin)
                  for st, (_, pin) in zip(steps, tiles)]
        red = client.submit(_reduce_task, V, state, cnt_v, r, update, lr, reg, *shares,
                            pure=False)
        V = client.submit(_take, red, 0, pure=False)
        state = client.submit(_take, red, 1, pure=False)
        # Round r sums step r's training error and step r-1's test error (the factors that
        # start round r): step r-1's record is complete once round r is done.
        if previous is not None:
            pending.append((r - 1, previous, red))
        previous = red
        while pending and (len(pending) > 1 or not update):
            it, done, after = pending.popleft()
            train_sse = result(done, f"ALS step {it}", client)[2]
            test_sse = result(after, f"ALS step {it + 1}", client)[3]
            now = time.perf_counter()
            rec = {"iteration": it, "step_s": now - last,
                   "train_rmse": float(np.sqrt(train_sse / max(n_train, 1))),
                   "elapsed_s": now - t_start}
            _finite(rec["train_rmse"], "training RMSE", it, lr)
            if test is not None:
                rec["test_rmse"] = float(np.sqrt(test_sse / max(n_test, 1)))
                _finite(rec["test_rmse"], "test RMSE", it, lr)
            last = now
            model.history.append(rec)
            if progress is not None:
                progress(rec)
    final = [client.submit(_tile_factor, t, pure=False, **pin) for t, pin in tiles]
    model.U = np.vstack([result(f, "ALS's final factors", client) for f in final])
    model.V = _host(result(V, "ALS's final factors", client))
    if not (np.isfinite(model.U).all() and np.isfinite(model.V).all()):
        _finite(math.nan, "last step's factors", iters, lr)
    return model


def plot(histories: dict[str, list[dict[str, float]]], path: str, title: str) -> None:
    """Test RMSE against the step for every run (one line per device) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for label, hist in histories.items():
        ax.plot([h["iteration"] for h in hist], [h.get("test_rmse", np.nan) for h in hist],
                label=label)
    ax.set_xlabel("step (SDDMM + SpMM)")
    ax.set_ylabel("test RMSE")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
