"""Matrix factorisation of a ratings matrix by full-batch gradient descent with Adam, every
step one SDDMM and two SpMM (the cuSDDMM paper's reformulation: the gradient of the squared
error at the observed entries is ``(S ∘ (U Vᵀ) - R) V`` for U and its transpose for V).

``r_ij ≈ μ + u_i · v_j`` is fitted on the training ratings by full-batch gradient steps with
Adam's per-entry step sizes and an L2 penalty; each step costs one :func:`mgpu.sddmm` (the
predictions at the observed entries) and two :func:`mgpu.spmm` (the residual times V, its
transpose times U). NumPy/SciPy data runs on the CPU backend, CuPy data on the GPU, and a
dask array of row tiles (or ``client=``/``parts=``) on a cluster, the users cut into row
tiles. (It is not alternating least squares: no step solves for a factor.)
"""
from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from numbers import Integral, Real
from typing import Any

import numpy as np
import scipy.sparse as sp

import mgpu
from mgpu import config
from mgpu.backends import array_module, is_gpu_array, synchronize, to_host
from mgpu.distributed.cluster import CLIENT, workers_now
from mgpu.distributed.tiles import RowTiles, check_scipy_or_tiles
from mgpu.models._gradient_steps import (
    _adam,
    _divergence_bound,
    _finite,
    _Tile,
    _tile_task,
    _watch,
)
from mgpu.models._transpose import Transposer
from mgpu.ops.validation import (
    Boolean,
    Interval,
    IsCallable,
    check_array,
    check_param,
    is_dask_array,
)

__all__ = ["GradientMF"]

logger = logging.getLogger(__name__)


class GradientMF:
    """``R ≈ μ + U Vᵀ`` at R's stored entries by full-batch gradient descent with Adam; each
    step one SDDMM and two SpMM.

    Parameters
    ----------
    k : int, default=32
        Rank of the factors.
    reg : float, default=0.1
        L2 penalty.
    lr : float, default=0.01
        Adam's step size.
    iters : int, default=100
        Gradient steps.
    seed : int, default=0
        The starting factors; the same on every device and split.
    cuda_graph : bool, default=True
        On one GPU, capture the step as a CUDA graph after the first step and replay it
        (:class:`mgpu.backends.graph.Replay`); ``False`` launches its kernels one by one
        every step. The numbers are the same either way.

    Attributes
    ----------
    U_ : array of shape (n_users, k)
    V_ : array of shape (n_items, k)
        The factors (numpy after a cluster fit, else R's array type).
    mean_ : float
        μ, the training ratings' mean.
    history_ : list of dict
        Per step: ``iteration``, ``step_s``, ``train_rmse``, ``elapsed_s`` and, with test
        ratings, ``test_rmse``.
    tiles_ : list of dict
        After a cluster fit, each row tile's ``worker``, ``rows`` and ``nnz`` in user
        order; empty after a fit on one device.

    Examples
    --------
    >>> R = sp.csr_matrix(np.array([[5, 4, 0], [4, 0, 1], [0, 1, 2.]]))
    >>> model = GradientMF(k=2, lr=0.05, iters=50).fit(R)
    >>> h = model.history_
    >>> h[-1]["train_rmse"] < h[0]["train_rmse"]
    True
    >>> model.predict(R).shape
    (3, 3)
    """

    def __init__(self, k: int = 32, *, reg: float = 0.1, lr: float = 0.01, iters: int = 100,
                 seed: int = 0, cuda_graph: bool = True) -> None:
        self.k = k
        self.reg = reg
        self.lr = lr
        self.iters = iters
        self.seed = seed
        self.cuda_graph = cuda_graph

    def fit(self, R: Any, test: Any = None, *, client: Any = None, parts: int | None = None,
            progress: Callable[[dict[str, float]], None] | None = None) -> GradientMF:
        """Fit to the ratings R, recording the training (and test) RMSE per step.

        Parameters
        ----------
        R : {sparse matrix, dask array} of shape (n_users, n_items)
            Training ratings, float32 or float64. A scipy or cupyx CSR fits on its own
            device; a dask array of CSR row tiles (:func:`mgpu.from_scipy`) fits on the
            cluster, its tiles where they are; a scipy matrix with ``client`` or ``parts``
            is cut into tiles first.
        test : sparse matrix of shape (n_users, n_items), optional
            Test ratings (R's array type on one device; scipy on a cluster); their RMSE is
            recorded per step.
        client : distributed.Client, optional
            The cluster (default: the current one, for a dask array or with ``parts``).
        parts : int, optional
            Row tiles of a scipy matrix (default: one per worker).
        progress : callable, optional
            Called with each step's record (that of ``history_``) as it arrives.

        Returns
        -------
        self

        Raises
        ------
        TypeError
            On a cluster: R not a scipy matrix or dask array, or test not a scipy matrix.
        ValueError
            For the parameters out of range (k and iters >= 1, lr > 0, reg >= 0), NaN or
            infinity among R's ratings, a test matrix of another shape, or a cluster fit
            without a cluster.
        FloatingPointError
            When the fit diverges: a step's training RMSE rises past ten times
            (``mgpu.mf.sgd.DIVERGENCE``) its scale at the start (the first step's RMSE, or the
            ratings' mean where that is larger), or a step's RMSE or the final factors are
            NaN or infinite (the steps themselves run with ``check_finite=False``).

        Notes
        -----
        R's values are checked once; the steps then call SDDMM and SpMM with
        ``check_finite=False`` (no wait on the device inside a step) and watch the RMSE
        instead. On one device each step's SDDMM + SpMM time is ``step_s`` (synchronised on
        the GPU); on a cluster it is the time between consecutive steps as the client sees
        them finish. On a cluster each tile's ratings, its rows of U and their Adam moments
        stay on its worker and only V moves; the result equals one device's up to rounding
        (V's gradient is summed tile by tile).
        """
        ranges = " (k and iters must be >= 1, lr > 0 and reg >= 0)"
        check_param(self.k, "k", "GradientMF", Interval(Integral, 1, None), ranges)
        check_param(self.reg, "reg", "GradientMF", Interval(Real, 0, None), ranges)
        check_param(self.lr, "lr", "GradientMF", Interval(Real, 0, None, closed="neither"),
                    ranges)
        check_param(self.iters, "iters", "GradientMF", Interval(Integral, 1, None), ranges)
        check_param(self.seed, "seed", "GradientMF", [Interval(Integral, 0, None), None],
                    " (numpy's seeds)")
        check_param(self.cuda_graph, "cuda_graph", "GradientMF", Boolean())
        check_param(client, "client", "GradientMF.fit", [CLIENT, None])
        check_param(parts, "parts", "GradientMF.fit", [Interval(Integral, 1, None), None])
        check_param(progress, "progress", "GradientMF.fit", [IsCallable(), None])
        if client is not None or parts is not None or is_dask_array(R):
            self._fit_tiles(R, test, client, parts, progress)
        else:
            check_array(R, "R", "GradientMF.fit", accept_dense=False)
            if test is not None:
                check_array(test, "test", "GradientMF.fit", accept_dense=False,
                            ensure_all_finite=True)
                if test.shape != R.shape:
                    raise ValueError(f"The 'test' parameter of GradientMF.fit must have R's "
                                     f"shape {R.shape}. Got {test.shape} instead.")
            self._fit_local(R, test, progress)
        return self

    def predict(self, S: Any, *, check_finite: bool = True) -> Any:
        """Predictions at the stored entries of S (a CSR of S's pattern).

        ``check_finite`` as in :func:`mgpu.sddmm` (of the factors).
        """
        if getattr(self, "U_", None) is None:
            raise ValueError("This GradientMF is not fitted yet: call fit first.")
        check_param(check_finite, "check_finite", "GradientMF.predict", Boolean())
        check_array(S, "S", "GradientMF.predict", accept_dense=False, accept_dask=True)
        shape = (self.U_.shape[0], self.V_.shape[0])
        if tuple(S.shape) != shape:
            raise ValueError(f"The 'S' parameter of GradientMF.predict must have the fitted "
                             f"shape {shape} (users × items). Got {tuple(S.shape)} instead.")
        P = mgpu.sddmm(S, self.U_, self.V_, hadamard=False, check_finite=check_finite)
        P.data += self.mean_
        return P

    def _fit_local(self, R: Any, test: Any,
                   progress: Callable[[dict[str, float]], None] | None) -> None:
        k, iters, lr, reg = self.k, self.iters, self.lr, self.reg
        # on a GPU the steps run on a stream of their own, to be captured as a CUDA graph
        gpu = is_gpu_array(R)
        if gpu:
            xp = array_module(R)
            stream: Any = xp.cuda.Stream(non_blocking=True)  # the steps' own, for the capture

            def sync() -> None:
                stream.synchronize()
        else:
            xp = np
            stream = contextlib.nullcontext()

            def sync() -> None:
                pass
        R = _sorted_ratings(R)
        if R.nnz and not bool(xp.isfinite(R.data).all()):
            raise ValueError("The 'R' parameter of GradientMF.fit holds NaN or infinity among "
                             "its ratings. Clean them first.")
        dtype = R.dtype
        m, n = R.shape
        mean = float(R.data.mean())
        rng = np.random.default_rng(self.seed)
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
        self.U_, self.V_, self.mean_, self.tiles_ = U, V, mean, []
        history: list[dict[str, float]] = []
        self.history_ = history

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
        bound = math.inf  # set by the first step
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
                if it == 1:
                    bound = _divergence_bound(train_rmse, mean)
                _watch(train_rmse, bound, it, lr)
                for name, A, g, cnt in (("U", U, gU, cnt_u), ("V", V, gV, cnt_v)):
                    _adam(xp, A, g, cnt, state[name], it, lr, reg)
                rec = {"iteration": it, "step_s": step, "train_rmse": train_rmse,
                       "elapsed_s": time.perf_counter() - t_start}
                if test is not None:
                    P = self.predict(test, check_finite=False)
                    rec["test_rmse"] = float(xp.sqrt(xp.mean((P.data - test.data)
                                                             .astype(xp.float64) ** 2)))
                    _finite(rec["test_rmse"], "test RMSE", it, lr)
                history.append(rec)
                if progress is not None:
                    progress(rec)
                if gpu and self.cuda_graph and it == 1 and iters > 1:
                    replay = _capture(run_step, stream)  # warm now: kernels built, plan tuned
        sync()  # the last Adam step, before the factors are used on another stream
        if not (bool(xp.isfinite(U).all()) and bool(xp.isfinite(V).all())):
            _finite(math.nan, "last step's factors", iters, lr)

    def _fit_tiles(self, R: Any, test: Any, client: Any, parts: int | None,
                   progress: Callable[[dict[str, float]], None] | None) -> None:
        """The users in row tiles on the cluster's workers.

        Each tile's ratings, its rows of U and their Adam moments stay on its worker (its
        GPU on GPU workers); only V's gradient is summed across the tiles. Where every tile
        is on a worker of one kind (all GPU or all CPU workers) the whole fit is one SPMD
        call (:func:`mgpu.models._gradient_mf_spmd.fit_spmd`): each worker loops over the
        steps itself and V's gradient is all-reduced between the workers. A cluster that
        mixes GPU and CPU workers keeps one Dask round per step (:meth:`_fit_rounds`).
        U_ and V_ are numpy.
        """
        check_scipy_or_tiles(R, "R", "GradientMF.fit on a cluster")
        if test is not None and not sp.issparse(test):
            raise TypeError(f"The 'test' parameter of GradientMF.fit on a cluster must be a "
                            f"scipy sparse matrix. Got {type(test).__name__} instead.")
        if test is not None and test.shape != R.shape:
            raise ValueError(f"The 'test' parameter of GradientMF.fit must have R's shape "
                             f"{R.shape}. Got {test.shape} instead.")
        if test is not None:
            check_array(test, "test", "GradientMF.fit on a cluster", accept_dense=False,
                        ensure_all_finite=True)
        tiles, dtype, n_train, mean, per_item = _place(R, client, parts)
        m, n = R.shape
        k = self.k
        rng = np.random.default_rng(self.seed)  # the same start as on one device
        U0 = rng.normal(0, 0.1, (m, k)).astype(dtype)
        V0 = rng.normal(0, 0.1, (n, k)).astype(dtype)
        cnt_v = np.maximum(per_item, 1).astype(dtype)[:, None]
        T = sp.csr_matrix((0, n), dtype=dtype) if test is None else sp.csr_matrix(test, dtype=dtype)
        pieces = [T[tiles.rows(i)] if test is not None
                  else sp.csr_matrix((tiles.rows(i).stop - tiles.rows(i).start, n), dtype=dtype)
                  for i in range(len(tiles))]
        tests = tiles.hold("test", pieces)
        starts = tiles.hold("U0", [U0[tiles.rows(i)] for i in range(len(tiles))])
        if _one_kind(tiles):
            from mgpu.models._gradient_mf_spmd import Spec, fit_spmd

            every = int(config.get("spmd.checkpoint-every", 0) or 0)
            spec = Spec(self.iters, self.lr, self.reg, mean, n_train, T.nnz,
                        test is not None, every, len(tiles))
            U, V, history = fit_spmd(
                tiles, replace(tiles, blocks=tests, nnz=[p.nnz for p in pieces]),
                replace(tiles, blocks=starts, nnz=[0] * len(tiles)),
                V0, cnt_v, spec, progress)
        else:
            U, V, history = self._fit_rounds(tiles, tests, starts, V0, cnt_v, mean, n_train,
                                              T.nnz, test is not None, progress)
        self.U_, self.V_, self.mean_ = U, V, mean
        self.history_, self.tiles_ = history, tiles.describe()
        if not (np.isfinite(U).all() and np.isfinite(V).all()):
            _finite(math.nan, "last step's factors", self.iters, self.lr)

    def _fit_rounds(self, tiles: RowTiles, tests: list[Any], starts: list[Any], V0: Any,
                    cnt_v: Any, mean: float, n_train: int, n_test: int, has_test: bool,
                    progress: Callable[[dict[str, float]], None] | None
                    ) -> tuple[np.ndarray, np.ndarray, list[dict[str, float]]]:
        """One Dask round per step, driven from the client (a cluster of GPU and CPU
        workers): V is sent to every tile, each tile returns its share of V's gradient, and
        one task sums them and steps V. The test error of a step is summed in the next
        round, from the factors that start that round, so one round per step suffices."""
        iters, lr, reg = self.iters, self.lr, self.reg
        state_of_tiles = tiles.map(_tile_task, tiles.blocks, tests, starts)
        V: Any = tiles.share("V0", V0)
        state: Any = None
        history: list[dict[str, float]] = []
        t_start = last = time.perf_counter()
        bound = math.inf  # set by the first step
        pending: deque = deque()
        previous = None
        for r in range(1, iters + 2):
            update = r <= iters
            steps = tiles.map(_step_task, state_of_tiles, args=(V, r, update, mean, lr, reg))
            state_of_tiles = tiles.map(_take, steps, args=(0,))
            shares = tiles.map(_take, steps, args=(1,))
            red = tiles.submit(_reduce_task, V, state, cnt_v, r, update, lr, reg, *shares)
            V = tiles.submit(_take, red, 0)
            state = tiles.submit(_take, red, 1)
            # Round r sums step r's training error and step r-1's test error (the factors
            # that start round r): step r-1's record is complete once round r is done.
            if previous is not None:
                pending.append((r - 1, previous, red))
            previous = red
            while pending and (len(pending) > 1 or not update):
                it, done, after = pending.popleft()
                train_sse = tiles.result(done, f"GradientMF step {it}")[2]
                test_sse = tiles.result(after, f"GradientMF step {it + 1}")[3]
                now = time.perf_counter()
                rec = {"iteration": it, "step_s": now - last,
                       "train_rmse": float(np.sqrt(train_sse / max(n_train, 1))),
                       "elapsed_s": now - t_start}
                if it == 1:
                    bound = _divergence_bound(rec["train_rmse"], mean)
                _watch(rec["train_rmse"], bound, it, lr)
                if has_test:
                    rec["test_rmse"] = float(np.sqrt(test_sse / max(n_test, 1)))
                    _finite(rec["test_rmse"], "test RMSE", it, lr)
                last = now
                history.append(rec)
                if progress is not None:
                    progress(rec)
        final = tiles.map(_tile_factor, state_of_tiles)
        U = np.vstack([tiles.result(f, "GradientMF's final factors") for f in final])
        return U, to_host(tiles.result(V, "GradientMF's final factors")), history


def _place(R: Any, client: Any, parts: int | None
           ) -> tuple[RowTiles, np.dtype, int, float, np.ndarray]:
    """R's row tiles on the cluster, with what the start needs of the ratings: their dtype,
    count, mean and count per item; NaN, infinity and duplicate ratings refused (a dask
    array's tile by tile, in one round before any fit)."""
    if is_dask_array(R):
        tiles = RowTiles.place(R, name="gradient-mf", client=client)
        stats = [tiles.result(f, "GradientMF's rating sums")
                 for f in tiles.map(_stats_task, tiles.blocks, args=(R.shape[1],))]
        if not all(st["finite"] for st in stats):
            raise ValueError("The 'R' parameter of GradientMF.fit holds NaN or infinity "
                             "among its ratings. Clean them first.")
        if any(st["duplicates"] for st in stats):
            raise ValueError(_DUPLICATES)
        n_train = sum(st["nnz"] for st in stats)
        mean = float(sum(st["sum"] for st in stats) / max(n_train, 1))
        return (tiles, np.dtype(stats[0]["dtype"]), n_train, mean,
                sum(st["per_item"] for st in stats))
    R = sp.csr_matrix(_sorted_ratings(R))
    if not np.isfinite(R.data).all():
        raise ValueError("The 'R' parameter of GradientMF.fit holds NaN or infinity "
                         "among its ratings. Clean them first.")
    per_item = np.bincount(R.indices, minlength=R.shape[1])
    tiles = RowTiles.place(R, name="gradient-mf", parts=parts, client=client)
    return tiles, R.dtype, R.nnz, float(R.data.mean()), per_item


def _one_kind(tiles: RowTiles) -> bool:
    """Whether every tile is on a worker of one kind (all with a GPU or all without), the
    condition of the SPMD fit: one communicator, NCCL or the host's, joins them."""
    info = workers_now(tiles.client)
    kinds = {bool(info.get(w, {}).get("resources", {}).get("GPU")) for w in tiles.workers}
    return len(kinds) == 1 and None not in tiles.workers


def _capture(step: Callable[[], Any], stream: Any) -> Any:
    """``step`` as a CUDA graph to replay, or None (logged) where it cannot be captured."""
    from mgpu.backends.graph import Replay

    try:
        return Replay(step, stream)
    except Exception as exc:  # e.g. a CuPy or driver without stream capture
        logger.info("GradientMF: the step was not captured as a CUDA graph (%s); its kernels "
                    "are launched one by one.", exc)
        return None


# ------------------------------------------------------------------- tasks on the tiles


_DUPLICATES = ("The 'R' parameter of GradientMF.fit rates an item more than once for a user "
               "(duplicate entries). Keep one rating of each, or call R.sum_duplicates() "
               "first if their sum is what you mean.")


def _sorted_ratings(R: Any) -> Any:
    """R as CSR with sorted indices, a copy wherever that changes anything (the caller's
    matrix is never sorted in place), refusing duplicate entries (:data:`_DUPLICATES`):
    whether two ratings of an item should be summed, averaged or one kept is the
    caller's choice."""
    nnz = R.nnz
    R = R.tocsr()
    if R.nnz != nnz:  # converting from COO summed the duplicates
        raise ValueError(_DUPLICATES)
    if not R.has_sorted_indices:
        R = R.copy()
        R.sort_indices()
    indices = R.indices
    same = indices[1:] == indices[:-1]
    # a pair that straddles two rows is not a duplicate
    starts = R.indptr[1:-1] - 1
    same[starts[(starts >= 0) & (starts < same.size)]] = False
    if bool(same.any()):
        raise ValueError(_DUPLICATES)
    return R


def _stats_task(R: Any, n: int) -> dict[str, Any]:
    """What the start needs of a tile of dask ratings: its sum and count, whether its values
    are finite, whether it rates an item twice for a user, its ratings per item and its
    dtype. The tile itself is left as it is."""
    host = sp.csr_matrix(to_host(R))
    summed = host.copy()
    summed.sum_duplicates()
    return {"sum": float(host.data.astype(np.float64).sum()), "nnz": int(host.nnz),
            "finite": bool(np.isfinite(host.data).all()), "dtype": host.dtype.str,
            "duplicates": summed.nnz != host.nnz,
            "per_item": np.bincount(host.indices, minlength=n)}


def _step_task(tile: _Tile, V: Any, it: int, update: bool, mean: float, lr: float,
               reg: float) -> tuple[_Tile, tuple]:
    """One round on one tile: the squared test error of the current U and V (the previous
    step's factors), then, unless this is the last round, the residual at the training
    ratings (SDDMM), U's gradient (SpMM) and Adam step, and this tile's share of V's gradient
    (SpMM of the residual's transpose). The values go unchecked (``check_finite=False``): the
    client watches the summed errors instead."""
    xp = array_module(tile.R)
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
    return replace(tile, U=U, state=state), (train_sse, test_sse, synchronize(gV))


def _reduce_task(V: Any, state: list[Any] | None, cnt: Any, it: int, update: bool,
                 lr: float, reg: float, *parts: tuple) -> tuple[Any, Any, float, float]:
    """Sum the tiles' shares of V's gradient in tile order and take V's Adam step (on
    copies: the inputs are other tasks' results; no moments yet: zeros), and sum the tiles'
    squared errors."""
    train_sse = sum(p[0] for p in parts)
    test_sse = sum(p[1] for p in parts)
    if update:
        xp = array_module(parts[0][2])
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
    return to_host(tile.U)

