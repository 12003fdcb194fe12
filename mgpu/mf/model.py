"""``MatrixFactorization``: plain SGD matrix factorisation, sequential or in blocks on a cluster.

Modes so far:

``sequential``
    One pass over the shuffled training ratings per epoch, in this process: the quality
    reference of the HSGD* benchmarks.
``cpu``
    FPSGD-style: users and items shuffled, cut into a (t+1)×(t+1) grid for t worker slots
    (one per thread of the cluster's workers), the blocks run by
    :class:`mgpu.sched.BlockScheduler` so that no two running blocks share users or items;
    factor segments are versioned, so each block sees the latest ones.
``gpu``
    The same grid on the cluster's GPU workers only, one slot per GPU, each block run by the
    GPU kernel (``kernels/sgd.cu``, cuMF_SGD's wavefront: ``mgpu.mf.gpu-scheme``).
``hsgd``
    The thesis's uniform baseline: GPU workers and the threads of the CPU workers together,
    a uniform grid owned round-robin, and dynamic work stealing between them.
``hsgd*``
    HSGD*: the cost model (:mod:`mgpu.mf.calibration`, calibrated on the cluster's own
    workers and cached) gives the GPUs their share α of the ratings, the non-uniform division
    (:func:`mgpu.mf.division.hsgd_star`) gives each GPU its own users and the CPU threads the
    rest, each slot starts on its own blocks (the static phase) and a slot that runs dry
    steals a free block when moving it pays (the dynamic phase). After each epoch, when the
    rates it measured (ratings per busy second of each kind of slot, each call's round trip
    under load included, which the calibration on an idle cluster cannot see) balance the
    two sides at a share more than 0.02 from the one running, whole rows of blocks are
    handed between the GPUs and the CPU slots, halfway there (``mgpu.mf.replan``, on by
    default; :func:`mgpu.mf.division.move_rows`): the strata stay, so no ratings are
    divided again, and a row a GPU takes is staged on its device once. When fit calibrates
    for itself, it also times one block of the GPUs-alone division on a GPU: that prices
    the option of no CPU slots, and no GPU block of any option is priced faster than that
    rate per rating (the curves, fitted on smaller prefixes, can extrapolate the GPU
    faster than it runs).
``hsgd-static``
    ``hsgd*`` without stealing: every slot runs exactly its own blocks (rows handed over
    between epochs like ``hsgd*``).
``hsgd-linear``
    ``hsgd*`` with α from Qilin's linear model (one straight line per device) instead.

Every block mode runs its blocks through block hosts (:mod:`mgpu.mf.hosts`): one Dask actor
per worker holds the ratings of the blocks it owns and the factor segments, versioned, and
runs the calls the block scheduler sends it, without a Dask task per block (whose dispatch
through the scheduler cost as long as the block). The block scheduler itself runs on the
host of the worker with the most slots (:func:`mgpu.mf.placement.driving_worker`, the CPU
worker beside GPUs), so that its calls to that worker's slots are not messages between
processes; the client asks it for an epoch at a time. A GPU's own blocks have their
ratings staged on its device once, for every epoch; the factor segments stay on the device
between its calls, each call leaving host copies of what it updated in pinned memory, sent
when another host or the client asks, so that nobody waits behind the
GPU's next kernel. Hosts of one node share the segments in a shared-memory file
(``mgpu.mf.shared-segments``, :class:`mgpu.mf.segments.SegmentStore`): the host copies are
written there, and a segment another host of the node made is read where it lies. A GPU
runs its blocks of one column (its sub-rows) in one call, one round trip for all of them,
and its next columns' calls are queued on its host behind the running one
(``mgpu.mf.gpu-ahead``). A CPU host visits a block's ratings in LIBMF's order (by user,
then item, with more users than items: :func:`mgpu.mf.sgd.libmf_order`), kept so once.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import time
from collections.abc import Callable
from numbers import Integral, Real
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from dask.utils import parse_bytes

import mgpu.mf.planning as planning
from mgpu import config
from mgpu.mf.calibration import Calibration
from mgpu.mf.division import columns, hsgd_star, uniform
from mgpu.mf.hosts import HostLost, call, share_segments, start_hosts
from mgpu.mf.modes import MODES, check_mode
from mgpu.mf.schedule import check_scheme
from mgpu.mf.placement import (Job, Placement, by_block, driving_worker, job_epoch, job_reown,
                               job_start, measure_gpus_alone, slots_for)
from mgpu.mf.segments import SegmentMap
from mgpu.mf.sgd import check_divergence, compile_cpu, rmse, sgd_block
from mgpu.distributed.inputs import gather_ratings
from mgpu.ops.validation import InstanceOf, Interval, IsCallable, check_param, is_dask_array

logger = logging.getLogger(__name__)

__all__ = ["MODES", "MatrixFactorization"]


def _fresh_seed() -> int:
    """A seed from numpy's fresh entropy (what ``seed=None`` means), as an int >= 0 that
    per-block seeds may be added to."""
    return int(np.random.default_rng().integers(1 << 31))


def gpu_options() -> dict[str, Any]:
    """How GPU blocks run (:func:`mgpu.mf.staging.run_staged`'s ``gpu_kw``), from
    ``mgpu.mf.gpu-scheme`` (checked here, on the client), ``gpu-conflicts`` and ``gpu-warps``."""
    return {"scheme": check_scheme(config.get("mf.gpu-scheme")),
            "conflicts": config.get("mf.gpu-conflicts"), "max_warps": config.get("mf.gpu-warps")}


class MatrixFactorization:
    """R ≈ P Qᵀ by SGD (no biases), k latent factors.

    Parameters
    ----------
    k : int, default=128
    lr : float, default=0.005
        Learning rate γ.
    reg : float, default=0.05
        L2 regularisation λ (the same for P and Q).
    epochs : int, default=60
    target_rmse : float, optional
        Stop once the test RMSE reaches it.
    mode : {'sequential', 'cpu', 'gpu', 'hsgd', 'hsgd-linear', 'hsgd-static', 'hsgd*'}, \
default='sequential'
    seed : int or None, default=0
        The starting factors, the order of the ratings staged on a GPU and the scheduler's
        draws. None: a fresh seed drawn by numpy at the start of ``fit`` (``seed_``).
    checkpoint_dir : str, optional
        Write ``P`` and ``Q`` after every epoch to ``<dir>/mf-epoch-<n>.npz`` (with the
        epoch); ``fit(..., resume=path)`` goes on from one.
    calibration : mgpu.mf.calibration.Calibration, optional
        The cost model's measurements for ``hsgd-linear``, ``hsgd-static`` and ``hsgd*``.
        Default: the cached one for the cluster's GPU and CPU models, k, the GPU conflict
        bound and the division's block shape (``mgpu calibrate`` makes it), else measured on
        the training ratings at the start of ``fit`` and cached. Without one given, ``fit``
        also times a block of the ``gpu`` mode's division on a GPU to price the GPUs alone
        (``gpus_alone_``), and no GPU block faster than that rate; with one given, the plan
        comes from it alone. Where the plan gives the CPU slots nothing, these modes run the
        ``gpu`` mode's division.

    Attributes
    ----------
    P_ : ndarray of shape (n_users, k)
    Q_ : ndarray of shape (n_items, k)
    mean_ : float
        The training ratings' mean: the prediction, in :meth:`predict` and the test RMSE, for
        a user or an item that no training rating names (whose factors never left their
        random start), as LIBMF predicts its average rating there.
    rated_users_, rated_items_ : ndarray of bool
        Which users and items the training ratings name.
    seed_ : int
        The seed the last fit used: ``seed``, or the one drawn for ``seed=None``; a model
        made with ``seed=seed_`` repeats that fit.
    history_ : list of dict
        Per epoch: ``epoch``, ``seconds`` (training time so far: the epochs' own work; the
        setup before the first epoch and the evaluation after each, that is gathering the
        factors from the workers, the RMSEs and the checkpoint, excluded, as SGD benchmarks
        time training), ``wall_s`` (since fit started, everything included), ``train_rmse``,
        ``test_rmse``; block modes add ``epoch_s`` (the block scheduler's epoch),
        ``gather_s`` and each kind of slot's busy seconds, ratings and predicted seconds;
        ``alpha`` in the cost-model modes (the share of the ratings the GPUs owned that
        epoch), ``replan_s`` and ``rows_moved`` where rows were handed between GPUs and CPU
        slots before that epoch (training time).
    division_ : dict
        Block modes: the division's rows, columns and blocks, the slots of each kind, the
        GPUs' share ``alpha`` (the last epoch's: ``hsgd*`` and ``hsgd-static`` hand rows over
        between epochs, ``mgpu.mf.replan``) and the cost model's ``alpha_planned``.
    shared_ : dict
        Block modes: the workers whose block hosts shared the factor segments in one
        shared-memory file, by node (``mgpu.mf.shared-segments``; a node with one host, or
        whose shared memory is too small, is left out: its segments travel through the
        workers' event loops).
    gpus_alone_ : dict or None
        Cost modes with GPU and CPU slots: the GPUs-alone option as measured on one of its
        blocks before planning (seconds per rating, copies, a call's overhead, the epoch's
        predicted seconds ``epoch_s``); None otherwise.
    setup_s_ : float
        Seconds before the first epoch: compiling (or loading from numba's cache) the CPU
        kernel of the sequential mode (:func:`mgpu.mf.sgd.compile_cpu`); in the block modes
        calibrating the cost model (unless cached), compiling the block kernel on each
        worker (:meth:`mgpu.mf.hosts.BlockHost.warm`), dividing the ratings and sending them
        to the workers. None of it counts in ``history_``'s ``seconds``.
    schedule_events_ : list of mgpu.sched.Event
        Block modes only: every assignment, steal and completion of the block scheduler
        (slot names end in ``#gpu`` for GPU slots, ``#<thread>`` for CPU threads).

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> R = sp.random(50, 40, density=0.3, format="coo", random_state=0, data_rvs=lambda n:
    ...               np.random.default_rng(0).integers(1, 6, n).astype(float))
    >>> mf = MatrixFactorization(k=8, lr=0.02, epochs=40).fit(R)
    >>> mf.history_[-1]["train_rmse"] < mf.history_[0]["train_rmse"]
    True
    """

    def __init__(self, k: int = 128, *, lr: float = 0.005, reg: float = 0.05, epochs: int = 60,
                 target_rmse: float | None = None, mode: str = "sequential", seed: int = 0,
                 checkpoint_dir: str | None = None, calibration: Calibration | None = None):
        self.k = k
        self.lr = lr
        self.reg = reg
        self.epochs = epochs
        self.target_rmse = target_rmse
        self.mode = mode
        self.seed = seed
        self.checkpoint_dir = checkpoint_dir
        self.calibration = calibration

    # ------------------------------------------------------------------ input
    def _check_params(self) -> None:
        func = "MatrixFactorization"
        check_param(self.k, "k", func, Interval(Integral, 1, None))
        check_param(self.lr, "lr", func, Interval(Real, 0, None, closed="neither"))
        check_param(self.reg, "reg", func, Interval(Real, 0, None))
        check_param(self.epochs, "epochs", func, Interval(Integral, 1, None))
        check_param(self.target_rmse, "target_rmse", func,
                    [Interval(Real, 0, None, closed="neither"), None])
        check_param(self.seed, "seed", func, [Interval(Integral, 0, None), None],
                    " (numpy's seeds)")
        check_param(self.checkpoint_dir, "checkpoint_dir", func,
                    [InstanceOf((str, os.PathLike), "a path (str or os.PathLike)"), None])
        check_mode(self.mode)
        if self.calibration is not None and not isinstance(self.calibration, Calibration):
            raise TypeError("The 'calibration' parameter of MatrixFactorization must be a "
                            "mgpu.mf.calibration.Calibration or None. Got "
                            f"{type(self.calibration).__name__} instead.")
        if self.checkpoint_dir is not None and not Path(self.checkpoint_dir).is_dir():
            raise ValueError(f"The 'checkpoint_dir' parameter of MatrixFactorization must be an "
                             f"existing folder. Got {self.checkpoint_dir!r}.")

    @staticmethod
    def _triplets(R: Any, name: str, shape: tuple[int, int] | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int]]:
        if isinstance(R, (str, os.PathLike)):
            from mgpu.io import load_ratings

            R = load_ratings(R).matrix
        if is_dask_array(R):  # HSGD* divides all the ratings on the client: computed here
            R = gather_ratings(R, name)
        if not sp.issparse(R):
            raise TypeError(f"The '{name}' parameter of MatrixFactorization.fit must be a scipy "
                            f"sparse matrix or a ratings file. Got {type(R).__name__} instead.")
        if shape is not None and R.shape != shape:
            raise ValueError(f"The '{name}' parameter of MatrixFactorization.fit must have R's "
                             f"shape {shape}. Got {R.shape}.")
        if R.dtype.kind not in "biuf":  # complex: the real part alone would be a guess
            raise TypeError(f"The '{name}' parameter of MatrixFactorization.fit must hold real "
                            f"ratings (bool, int or float). Got dtype {R.dtype} instead.")
        C = R.tocoo()
        u, i = C.row.astype(np.int64), C.col.astype(np.int64)
        r = C.data.astype(np.float64)
        if r.size and not np.isfinite(r).all():
            bad = int(np.flatnonzero(~np.isfinite(r))[0])
            raise ValueError(f"The '{name}' parameter of MatrixFactorization.fit holds a NaN or "
                             f"infinite rating (user {u[bad]}, item {i[bad]}).")
        key = u * max(C.shape[1], 1) + i
        uniq, counts = np.unique(key, return_counts=True)
        if (counts > 1).any():
            first = int(uniq[np.argmax(counts > 1)])
            raise ValueError(
                f"The '{name}' parameter of MatrixFactorization.fit rates a (user, item) pair "
                f"more than once ({int((counts > 1).sum())} pairs; first: user "
                f"{first // max(C.shape[1], 1)}, item {first % max(C.shape[1], 1)}); keep one "
                "rating per pair (mgpu.io.load_ratings keeps the last one in the file).")
        return u, i, r, C.shape

    # ------------------------------------------------------------------ training
    def fit(self, R: Any, test: Any = None, *,
            callback: Callable[[dict[str, Any]], None] | None = None,
            resume: str | os.PathLike[str] | None = None) -> MatrixFactorization:
        """Train on R (users × items), reporting RMSE on ``test`` after every epoch.

        ``callback`` gets each epoch's history entry (for progress bars). ``resume``, a
        checkpoint that ``checkpoint_dir`` holds (``mf-epoch-<n>.npz``), starts from its P
        and Q at epoch n + 1 (after a lost worker, say); give the fit the ratings and
        parameters that wrote it. Raises FloatingPointError, naming the epoch and the learning
        rate, when the fit diverges: the RMSE becomes NaN or infinite, or the train RMSE rises
        past ten times (``mgpu.mf.sgd.DIVERGENCE``) that of the starting factors. Raises
        TypeError for complex ratings, and ValueError for a checkpoint of other shapes, with
        non-finite factors, or with no epoch left to train.
        """
        self._check_params()
        check_param(callback, "callback", "MatrixFactorization.fit", [IsCallable(), None])
        check_param(resume, "resume", "MatrixFactorization.fit",
                    [InstanceOf((str, os.PathLike), "a path (str or os.PathLike)"), None])
        u, i, r, shape = self._triplets(R, "R")
        if r.size == 0:
            raise ValueError("The 'R' parameter of MatrixFactorization.fit holds no ratings.")
        tu = ti = tr = None
        if test is not None:
            tu, ti, tr, _ = self._triplets(test, "test", shape)
            if tr.size == 0:
                raise ValueError("The 'test' parameter of MatrixFactorization.fit holds no "
                                 "ratings; pass None to train without one.")
        self.mean_ = float(r.mean())
        self.rated_users_ = np.bincount(u, minlength=shape[0]) > 0
        self.rated_items_ = np.bincount(i, minlength=shape[1]) > 0
        rated = (self.rated_users_, self.rated_items_)
        # one int for every use (starting factors, GPU staging, calibration windows):
        # None draws it here, once, so the workers never see None
        self.seed_ = _fresh_seed() if self.seed is None else int(self.seed)
        rng = np.random.default_rng(self.seed_)
        scale = 1.0 / np.sqrt(self.k)
        P = rng.random((shape[0], self.k)) * scale
        Q = rng.random((shape[1], self.k)) * scale
        start = 0
        if resume is not None:
            P, Q, start = self._resumed(resume, P.shape, Q.shape)
        self.history_: list[dict[str, Any]] = []
        self.gpus_alone_: dict[str, float] | None = None
        self.setup_s_ = 0.0
        start_rmse = rmse(u, i, r, P, Q)  # the scale past which the fit has diverged
        t0 = time.perf_counter()
        trained = 0.0
        epoch_fn = self._block_epochs if MODES[self.mode].cluster else self._sequential_epochs
        epochs = epoch_fn(u, i, r, P, Q, rng)
        for epoch in range(start + 1, self.epochs + 1):
            t = time.perf_counter()
            try:
                P, Q, extra = next(epochs)
            except HostLost as e:
                last = (Path(self.checkpoint_dir) / f"mf-epoch-{epoch - 1}.npz"
                        if self.checkpoint_dir and epoch > start + 1 else None)
                kept = "no epoch had finished" if epoch == start + 1 else (
                    f"P_ and Q_ hold epoch {epoch - 1}'s factors" + (
                        f", also in {last}" if last else ""))
                again = (f"fit(..., resume={str(last)!r})" if last else "Fit again")
                raise RuntimeError(
                    f"A worker holding the {self.mode} mode's blocks was lost in epoch {epoch}: "
                    f"{e}; {kept}. {again} once the cluster's workers are back.") from e
            setup = extra.pop("setup_s", 0.0)
            self.setup_s_ += setup
            trained += time.perf_counter() - t - setup - extra.get("gather_s", 0.0)
            entry = {"epoch": epoch, "seconds": trained, "wall_s": time.perf_counter() - t0,
                     "train_rmse": rmse(u, i, r, P, Q),
                     "test_rmse": rmse(tu, ti, tr, P, Q, rated, self.mean_) if tr is not None
                     else float("nan"),
                     **extra}
            self.history_.append(entry)
            logger.info("%s epoch %d: train RMSE %.4f, test RMSE %.4f, %.2f s", self.mode, epoch,
                        entry["train_rmse"], entry["test_rmse"], entry["seconds"])
            self.P_, self.Q_ = P, Q
            if callback is not None:
                callback(entry)
            watched = entry["test_rmse"] if tr is not None else entry["train_rmse"]
            check_divergence(entry, watched, start_rmse, epoch, self.lr)
            if self.checkpoint_dir is not None:
                self._checkpoint(epoch, P, Q)
            if self.target_rmse is not None and tr is not None and watched <= self.target_rmse:
                logger.info("target RMSE %.4f reached at epoch %d", self.target_rmse, epoch)
                break
        epochs.close()  # the block modes let go of their futures
        return self

    def _checkpoint(self, epoch: int, P: np.ndarray, Q: np.ndarray) -> None:
        path = Path(self.checkpoint_dir) / f"mf-epoch-{epoch}.npz"
        tmp = path.with_name(path.name + ".partial.npz")
        np.savez(tmp, P=P, Q=Q, epoch=np.int64(epoch))
        tmp.replace(path)

    def _resumed(self, path: str | os.PathLike[str], p_shape: tuple[int, ...],
                 q_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, int]:
        """P, Q and the epoch of a checkpoint written by :meth:`_checkpoint`, checked."""
        what = f"The 'resume' parameter of MatrixFactorization.fit ({os.fspath(path)!r})"
        try:
            with np.load(path, allow_pickle=False) as f:
                P, Q, epoch = f["P"], f["Q"], int(f["epoch"])
        except (OSError, KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"{what} must be a checkpoint of a fit (mf-epoch-<n>.npz with P, "
                             f"Q and epoch): {exc}") from None
        if P.shape != p_shape or Q.shape != q_shape:
            raise ValueError(f"{what} holds P {P.shape} and Q {Q.shape}; this fit needs P "
                             f"{p_shape} and Q {q_shape} (the ratings' shape and k).")
        if not (np.isfinite(P).all() and np.isfinite(Q).all()):
            raise ValueError(f"{what} holds NaN or infinite factors.")
        if not 0 <= epoch < self.epochs:
            raise ValueError(f"{what} is of epoch {epoch}; with epochs={self.epochs} no epoch "
                             "is left to train.")
        logger.info("%s: resuming from %s at epoch %d", self.mode, os.fspath(path), epoch + 1)
        return (np.ascontiguousarray(P, dtype=np.float64),
                np.ascontiguousarray(Q, dtype=np.float64), epoch)

    def _sequential_epochs(self, u, i, r, P, Q, rng):
        # the kernel compiled (or loaded from numba's cache) before the first epoch's clock:
        # setup, as the block modes' warm-up is, not training time
        extra = {"setup_s": compile_cpu(u, i, r, P, Q)}
        for _ in range(self.epochs):
            sgd_block(u, i, r, P, Q, self.lr, self.reg, self.reg, rng.permutation(r.size))
            yield P, Q, extra
            extra = {}

    def _block_epochs(self, u, i, r, P, Q, rng):
        from mgpu.distributed.cluster import current_client

        started = time.perf_counter()
        client = current_client()
        if client is None:
            raise ValueError(f"mode={self.mode!r} runs on a cluster: call mgpu.connect() first.")
        spec = MODES[self.mode]
        slots = slots_for(client, self.mode)
        gpu_kw = gpu_options()  # read here, passed to the tasks
        n_g = sum(s.kind == "gpu" for s in slots)
        n_c = len(slots) - n_g
        predict: dict[str, Callable[..., float]] = {}
        latency = 1e-3  # a task's round trip, until measured
        if spec.cost != "none":
            cal = self._calibration_for(client, slots, u, i, r, (P.shape[0], Q.shape[0]),
                                         gpu_kw)
            model = spec.cost
            predict = {kind: cal.predictor(kind, model) for kind, n in (("gpu", n_g), ("cpu", n_c))
                       if n}
            self.calibration_ = cal
            logger.info("%s: a task's overhead with every slot busy, CPU %.1f ms, GPU %.1f ms; "
                        "a CPU block's run then %.3f× the curve's (not applied)", self.mode,
                        1e3 * cal.overhead_cpu_s, 1e3 * cal.overhead_gpu_s, cal.cpu_load)
            latency = max(cal.overhead_cpu_s, cal.overhead_gpu_s, latency)
            alone = alone_div = None

            def gpus_alone() -> Any:
                """The GPUs-alone division (the gpu mode's, all the ratings on the GPUs),
                divided once and only where it is measured or run."""
                nonlocal alone_div
                if alone_div is None:
                    alone_div = dataclasses.replace(
                        uniform(u, i, P.shape[0], Q.shape[0], n_g, rng), alpha=1.0)
                return alone_div

            if n_c and self.calibration is None:  # priced on a block of theirs
                alone = measure_gpus_alone(client, slots[0].worker, gpus_alone(), n_g, u, i,
                                           r, self.k, gpu_kw, cal.overhead_gpu_alone_s)
                self.gpus_alone_ = alone
                logger.info("%s: the GPUs alone, measured on a block of theirs: %.3g M "
                            "ratings/s, an epoch %.3g s (the curves: %.3g s)", self.mode,
                            1e-6 / alone["per_rating_s"] if alone["per_rating_s"] else math.inf,
                            alone["epoch_s"],
                            planning.epoch_time(r.size, predict, n_g, 0, 1.0, 0.0))
                # and no division's GPU blocks priced faster than that rate
                predict["gpu"] = cal.predictor("gpu", model, floor=alone["per_rating_s"])
            used, alpha = planning.plan(r.size, predict, n_g, n_c,
                                        None if alone is None else alone["epoch_s"])
            if used < n_c:
                logger.info("%s: %d of the %d CPU slots make the shortest predicted epoch",
                            self.mode, used, n_c)
                # a GPU's task overhead as with that many CPU slots at work
                predict = {kind: functools.partial(f, load=used / n_c)
                           for kind, f in predict.items()}
                slots = slots[:n_g + used]
                n_c = used
            if n_c:
                div = hsgd_star(u, i, P.shape[0], Q.shape[0], alpha, n_g, n_c, rng)
            else:
                div = gpus_alone()
                if alone is not None:  # priced as measured
                    predict = {"gpu": functools.partial(planning.alone_block_time, alone)}
        else:
            div = uniform(u, i, P.shape[0], Q.shape[0], len(slots), rng)
        rebalance = spec.replan and n_g > 0 and n_c > 0 \
            and bool(config.get("mf.replan"))
        self.schedule_events_: list[Any] = []  # grows as the epochs run
        last: dict[str, float] = {}  # the last epoch's side times
        threads: dict[str, int] = {}
        for s in slots:
            threads[s.worker] = threads.get(s.worker, 0) + 1
        hosts = start_hosts(client, {s.worker: (s.kind, threads[s.worker]) for s in slots},
                            gpu_kw)
        for f in [call(client, h, "warm", self.k) for h in hosts.values()]:
            f.result()
        placed = self._place(client, hosts, div, slots, predict, latency, u, i, r, P, Q,
                             rng)
        setup = {"setup_s": time.perf_counter() - started}
        for epoch in range(1, self.epochs + 1):
            extra: dict[str, Any] = {}
            if rebalance and epoch >= 2:  # training time: after the first epoch's clock started
                t0 = time.perf_counter()
                moved = self._rebalance(placed, last, n_g, n_c, epoch - 1)
                if moved:
                    extra["replan_s"] = time.perf_counter() - t0
                    extra["rows_moved"] = moved
            if predict:
                extra["alpha"] = planning.gpu_share(placed.owned)
            t0 = time.perf_counter()
            events, latest, calls = placed.drive(job_epoch).result()
            took = time.perf_counter() - t0
            self.schedule_events_.extend(events)
            # the factors to this process, for the RMSE: evaluation, not training
            for f in [call(client, hosts[w], "collect", wanted)
                      for w, wanted in latest.items()]:
                for (kind, idx), got in f.result().items():
                    if kind == "p":
                        P[placed.rows[idx]] = got
                    else:
                        Q[placed.cols[idx]] = got
            last = {**placed.side_times(events), **planning.call_times(calls, placed.owned)}
            yield P, Q, {"epoch_s": took, "gather_s": time.perf_counter() - t0 - took, **setup,
                         **extra, **last}
            setup = {}

    def _place(self, client: Any, hosts: dict[str, Any], div: Any, slots: list[Any],
               predict: dict[str, Callable[..., float]], latency: float, u: np.ndarray,
               i: np.ndarray, r: np.ndarray, P: np.ndarray, Q: np.ndarray,
               rng: np.random.Generator) -> Placement:
        """A division's blocks on the cluster: each block's ratings on its owner's host
        (:mod:`mgpu.mf.hosts`; a GPU's staged on its device), the factor segments, and the
        block scheduler that runs them, on the driving host
        (:func:`mgpu.mf.placement.driving_worker`); returns them as a
        :class:`mgpu.mf.placement.Placement` (:meth:`_rebalance` calls its ``reown``)."""
        n_g = sum(s.kind == "gpu" for s in slots)
        n_c = len(slots) - n_g
        if predict and n_c:
            gpu_batch = planning.gpu_batch(n_g, n_c)
        else:
            gpu_batch = div.n_rows  # a GPU's own blocks of a column, however many
        per_task = {"gpu": gpu_batch, "cpu": 1}
        # a GPU's next call waits on its host behind the one it runs (their shared segments
        # order them), so a round trip per call leaves the GPU's critical path; a slot alone
        # (a GPU planned without CPU slots) queues its whole epoch
        ahead = {"gpu": len(div.blocks) if len(slots) == 1 else int(config.get("mf.gpu-ahead")),
                 "cpu": 0}
        self.division_ = {"rows": div.n_rows, "cols": div.n_cols, "blocks": len(div.blocks),
                          "alpha": div.alpha if predict else None,
                          "alpha_planned": div.alpha if predict else None, "gpu_slots": n_g,
                          "cpu_slots": n_c}
        logger.info("%s: %d×%d strata, %d blocks on %d GPU and %d CPU slot(s)%s", self.mode,
                    div.n_rows, div.n_cols, len(div.blocks), n_g, n_c,
                    f", {div.alpha:.3f} of the ratings on the GPUs" if predict else "")
        rows = [np.flatnonzero(div.user_stratum == a) for a in range(div.n_rows)]
        cols = [np.flatnonzero(div.item_stratum == b) for b in range(div.n_cols)]
        local_u = np.empty(P.shape[0], dtype=np.int64)
        local_i = np.empty(Q.shape[0], dtype=np.int64)
        for a, members in enumerate(rows):
            local_u[members] = np.arange(members.size)
        for b, members in enumerate(cols):
            local_i[members] = np.arange(members.size)
        bid = div.block_of(u, i)
        order = by_block(u, i, bid, P.shape[0], Q.shape[0])
        bounds = np.searchsorted(bid[order], np.arange(div.n_rows * div.n_cols + 1))
        where = {blk.id: slots[blk.owner].worker for blk in div.blocks}
        origin = dict(where)  # the host that keeps a block's ratings for whoever runs it
        # a row's segment starts where its owner is, a column's where its first block's is
        first = slots[0].worker
        home_p = {a: first for a in range(div.n_rows)}
        home_q = {b: first for b in range(div.n_cols)}
        for blk in reversed(div.blocks):
            home_p[blk.row] = home_q[blk.col] = where[blk.id]
        dtype = P.dtype.name
        kind_of = {sl.worker: sl.kind for sl in slots}
        # hosts of one node read each other's segments from shared memory
        self.shared_ = share_segments(
            client, hosts, [(("p", a), int(m.size)) for a, m in enumerate(rows)]
            + [(("q", b), int(m.size)) for b, m in enumerate(cols)], self.k, dtype
        ) if config.get("mf.shared-segments") else {}
        puts = []
        for worker, host in hosts.items():
            mine = [blk for blk in div.blocks if where[blk.id] == worker]
            segs = {("p", a): P[rows[a]] for a, w in home_p.items() if w == worker}
            segs.update({("q", b): Q[cols[b]] for b, w in home_q.items() if w == worker})
            stage = {blk.id for blk in mine} if kind_of[worker] == "gpu" else set()
            puts.append(call(client, host, "put", {}, segs))
            for blk in mine:  # one call a block: no message holds a worker's every rating
                sel = order[bounds[blk.id]:bounds[blk.id + 1]]
                puts.append(call(client, host, "put",
                                 {blk.id: (local_u[u[sel]], local_i[i[sel]], r[sel])}, {},
                                 [blk.id] if blk.id in stage else [], dtype, self.seed_))
        for f in puts:
            f.result()
        segmap = SegmentMap({**{("p", a): w for a, w in home_p.items()},
                             **{("q", b): w for b, w in home_q.items()}})
        job = Job(slots=list(slots), segmap=segmap, origin=origin, where=where,
                  row_sizes=[int(m.size) for m in rows], col_sizes=[int(m.size) for m in cols],
                  predict=predict, per_task=per_task, ahead=ahead,
                  deterministic=not MODES[self.mode].stealing, lr=self.lr, reg=self.reg,
                  k=self.k, itemsize=P.dtype.itemsize, dtype=dtype,
                  bandwidth=float(parse_bytes(config.get("mf.steal-bandwidth"))),
                  latency=latency, seed=int(rng.integers(1 << 31)))
        driving = driving_worker(slots)
        drive = functools.partial(call, client, hosts[driving], "drive")
        drive(job_start, job, tuple(div.blocks)).result()
        logger.info("%s: the block scheduler runs on %s's host", self.mode, driving)

        def reown(blocks: tuple[Any, ...], epochs_done: int) -> Any:
            """The same blocks with new owners, scheduled so from now on: a GPU that now owns
            a block has its ratings staged on its device (fetched from the host that has
            them, once)."""
            fetch: dict[str, list[int]] = {}
            for blk in blocks:
                worker = slots[blk.owner].worker
                if where[blk.id] != worker:
                    where[blk.id] = worker
                    fetch.setdefault(worker, []).append(blk.id)
            for f in [call(client, hosts[w], "prefetch", ids,
                           {b: origin[b] for b in ids if origin[b] != w}, dtype, self.seed_)
                      for w, ids in fetch.items()]:
                f.result()
            gpu_rows: dict[int, set[int]] = {}
            for blk in blocks:
                if slots[blk.owner].kind == "gpu":
                    gpu_rows.setdefault(blk.owner, set()).add(blk.row)
            per_task["gpu"] = max((len(x) for x in gpu_rows.values()), default=1)
            drive(job_reown, tuple(blocks), epochs_done, dict(where), per_task["gpu"]
                  ).result()
            return planning.Ownership(tuple(blocks), tuple(slots))

        kinds = {s.name: s.kind for s in slots}
        sizes = {blk.id: blk.size for blk in div.blocks}

        def side_times(events: list[Any]) -> dict[str, float]:
            return planning.side_times(events, kinds, sizes, predict)

        return Placement(owned=planning.Ownership(tuple(div.blocks), tuple(slots)), drive=drive,
                         rows=rows, cols=cols, side_times=side_times, reown=reown)

    def _rebalance(self, placed: Placement, last: dict[str, float], n_g: int, n_c: int,
                   epochs_done: int) -> int:
        """Whole rows of blocks handed between the GPUs and the CPU slots, halfway from the
        GPUs' share of the ratings now to the share at which the last epoch's measured rates
        (:func:`mgpu.mf.planning.measured_alpha`) finish both sides together, when those
        differ by more than 0.02 (:func:`mgpu.mf.division.move_rows`); returns the rows
        moved. Halfway, because the rates move with the share (a side given less pays its
        per-task costs on fewer ratings) and the first epoch's include warming up."""
        from mgpu.mf.division import move_rows

        blocks = placed.owned.blocks
        kinds = [s.kind for s in placed.owned.slots]
        now = planning.gpu_share(placed.owned)
        target = planning.measured_alpha(last, n_g, n_c)
        if target is None or abs(target - now) <= 0.02:
            return 0
        moved = move_rows(blocks, kinds, now + 0.5 * (target - now))
        rows = {b.row for b, o in zip(moved, blocks) if b.owner != o.owner}
        if not rows:
            return 0
        placed.owned = placed.reown(moved, epochs_done)
        share = planning.gpu_share(placed.owned)
        logger.info("%s: epoch %d's rates balance the sides at %.3f of the ratings on the GPUs; "
                    "%d row(s) moved, %.3f to %.3f", self.mode, epochs_done, target, len(rows),
                    now, share)
        self.division_["alpha"] = share
        return len(rows)

    def _calibration_for(self, client: Any, slots: list[Any], u: np.ndarray, i: np.ndarray,
                         r: np.ndarray, shape: tuple[int, int],
                         gpu_kw: dict[str, Any]) -> Calibration:
        """The given calibration, the cached one for these workers, or a new one (cached)."""
        from mgpu.mf.calibration import block_window, cached, calibrate, cluster_key, store

        if self.calibration is not None:
            return self.calibration
        cpu = next((s.worker for s in slots if s.kind == "cpu"), None)
        gpu = next((s.worker for s in slots if s.kind == "gpu"), None)
        threads = sum(s.kind == "cpu" and s.worker == cpu for s in slots)
        n_g = sum(s.kind == "gpu" for s in slots)
        most = int(config.get("mf.calibration-ratings"))
        # one column stratum of the division these slots will get, its ratings by user
        window = block_window(u, i, shape, columns(n_g, len(slots) - n_g),
                              want=min(most, 1 << 16), seed=self.seed_)
        key = cluster_key(client, cpu, gpu, self.k, "float64", gpu_kw, threads, window.block)
        cal = cached(key)
        # (one without ``probe`` priced calls at an idle round trip, one of other ``calls``
        # their dispatch from the client or a Dask task per block, one without ``cpu_load``
        # its calls' median overhead, not their mean, one of another ``cpu_order`` CPU
        # blocks visited in another order, one without ``segments`` its calls' crossing
        # segments taken between workers where a fit's hosts share them: measured again)
        if cal is None or not cal.probe or cal.calls != "driven" or not cal.segments \
                or (cpu and not (cal.cpu_s and cal.cpu_load and cal.cpu_order == "libmf")) \
                or (gpu and not cal.kernel_s):
            logger.info("no cached calibration for %s: measuring on the training ratings", key)
            cal = calibrate(client, u, i, r, self.k, cpu_worker=cpu, gpu_worker=gpu,
                            dtype="float64", gpu_kw=gpu_kw, cpu_threads=max(threads, 1),
                            max_ratings=most, seed=self.seed_, window=window)
            logger.info("calibration cached in %s", store(cal))
        return cal

    def predict(self, users: Any, items: Any) -> np.ndarray:
        """Predicted ratings pᵤ·qᵢ for pairs of row and column indices; ``mean_`` where the
        user or the item has no training rating."""
        if not hasattr(self, "P_"):
            raise ValueError("This MatrixFactorization instance is not fitted yet. Call 'fit' "
                             "first.")
        try:
            users = np.asarray(users, dtype=np.int64)
        except (TypeError, ValueError):
            raise TypeError(f"The 'users' parameter of predict must hold integer indices. Got "
                            f"{users!r} instead.") from None
        try:
            items = np.asarray(items, dtype=np.int64)
        except (TypeError, ValueError):
            raise TypeError(f"The 'items' parameter of predict must hold integer indices. Got "
                            f"{items!r} instead.") from None
        if users.shape != items.shape:
            raise ValueError(f"The 'users' and 'items' parameters of predict must have the same "
                             f"shape (one pair each). Got {users.shape} and {items.shape}.")
        for name, idx, n in (("users", users, self.P_.shape[0]), ("items", items,
                                                                  self.Q_.shape[0])):
            if idx.size and (idx.min() < 0 or idx.max() >= n):
                raise ValueError(f"The '{name}' parameter of predict must be in [0, {n}). Got "
                                 f"values from {idx.min()} to {idx.max()}.")
        known = self.rated_users_[users] & self.rated_items_[items]
        return np.where(known, np.einsum("nk,nk->n", self.P_[users], self.Q_[items]),
                        self.mean_)
