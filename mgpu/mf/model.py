"""``MatrixFactorization``: plain SGD matrix factorisation, sequential or in blocks on a cluster.

Modes so far:

``sequential``
    One pass over the shuffled training ratings per epoch, in this process: the quality
    reference of the HSGD* benchmarks.
``cpu``
    FPSGD-style: users and items shuffled, cut into a (t+1)×(t+1) grid for t worker slots
    (one per thread of the cluster's workers), the blocks run by
    :class:`mgpu.sched.BlockScheduler` so that no two running blocks share users or items;
    factor segments are futures, so each block sees the latest ones.
``gpu``
    The same grid on the cluster's GPU workers only, one slot per GPU, each block run by the
    GPU kernel (``kernels/sgd.cu``, cuMF_SGD's warp-per-rating scheme).
``hsgd``
    The thesis's uniform baseline: GPU workers and the threads of the CPU workers together,
    a uniform grid owned round-robin, and dynamic work stealing between them.

HSGD*'s own modes (``hsgd-linear``, ``hsgd-static``, ``hsgd*``: the cost-model split and the
non-uniform division) are not here yet.
"""
from __future__ import annotations

import logging
import operator
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu import config
from mgpu.mf.sgd import rmse, sgd_block
from mgpu.ops._validate import check_option

logger = logging.getLogger(__name__)

__all__ = ["MODES", "MatrixFactorization"]

MODES = ("sequential", "cpu", "gpu", "hsgd")


def _block_task(block: tuple[np.ndarray, np.ndarray, np.ndarray], P: np.ndarray,
                Q: np.ndarray, lr: float, reg: float, seed: int, device: str = "cpu",
                conflicts: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One block (users, items, ratings in segment-local ids): SGD over its ratings in a
    random order, on copies of its two factor segments.

    On a GPU slot the segments and the block's ratings cross to the device and back (the
    transfer HSGD*'s GPU cost curve accounts for), and ``kernels/sgd.cu`` runs the pass.
    """
    users, items, ratings = block
    order = np.random.default_rng(seed).permutation(users.shape[0])
    if device == "gpu":
        import cupy

        Pg, Qg = cupy.array(P), cupy.array(Q)
        sgd_block(cupy.asarray(users[order].astype(np.int32)),
                  cupy.asarray(items[order].astype(np.int32)),
                  cupy.asarray(ratings[order].astype(P.dtype)), Pg, Qg, lr, reg, reg,
                  conflicts=conflicts)
        return Pg.get(), Qg.get()
    P, Q = P.copy(), Q.copy()
    sgd_block(users, items, ratings, P, Q, lr, reg, reg, order)
    return P, Q


def _slots(client: Any, mode: str) -> list[Any]:
    """The scheduler's slots for a mode: every thread of every worker (``cpu``), every GPU
    worker (``gpu``), or the GPU workers and the threads of the CPU workers (``hsgd``)."""
    from mgpu.dist.cluster import describe_workers
    from mgpu.sched import Slot

    infos = describe_workers(client)
    has_gpu = {a: bool(i.get("gpu")) and "error" not in i["gpu"] for a, i in infos.items()}
    threads = [Slot(f"{a}#{t}", a, "cpu") for a, i in infos.items()
               for t in range(i.get("nthreads") or 1) if mode == "cpu" or not has_gpu[a]]
    gpus = [Slot(f"{a}#gpu", a, "gpu") for a in infos if has_gpu[a]]
    if mode == "cpu":
        return threads
    if not gpus:
        raise ValueError(f"mode={mode!r} needs GPU workers; the cluster has none "
                         "(mgpu.connect() starts them where GPUs are visible).")
    return gpus if mode == "gpu" else gpus + threads


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
    mode : {'sequential', 'cpu', 'gpu', 'hsgd'}, default='sequential'
    seed : int, default=0
    checkpoint_dir : str, optional
        Write ``P`` and ``Q`` after every epoch to ``<dir>/mf-epoch-<n>.npz``.

    Attributes
    ----------
    P_ : ndarray of shape (n_users, k)
    Q_ : ndarray of shape (n_items, k)
    history_ : list of dict
        Per epoch: ``epoch``, ``seconds`` (since fit started), ``train_rmse``, ``test_rmse``.
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
                 checkpoint_dir: str | None = None):
        self.k = k
        self.lr = lr
        self.reg = reg
        self.epochs = epochs
        self.target_rmse = target_rmse
        self.mode = mode
        self.seed = seed
        self.checkpoint_dir = checkpoint_dir

    # ------------------------------------------------------------------ input
    def _check_params(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, (int, np.integer)) or self.k < 1:
            raise ValueError(f"The 'k' parameter of MatrixFactorization must be an int >= 1. "
                             f"Got {self.k!r} instead.")
        if not self.lr > 0:
            raise ValueError(f"The 'lr' parameter of MatrixFactorization must be > 0. Got "
                             f"{self.lr!r} instead.")
        if not self.reg >= 0:
            raise ValueError(f"The 'reg' parameter of MatrixFactorization must be >= 0. Got "
                             f"{self.reg!r} instead.")
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, (int, np.integer)) \
                or self.epochs < 1:
            raise ValueError(f"The 'epochs' parameter of MatrixFactorization must be an int >= 1."
                             f" Got {self.epochs!r} instead.")
        check_option("mode", "MatrixFactorization", self.mode, MODES)
        if self.checkpoint_dir is not None and not Path(self.checkpoint_dir).is_dir():
            raise ValueError(f"The 'checkpoint_dir' parameter of MatrixFactorization must be an "
                             f"existing folder. Got {self.checkpoint_dir!r}.")

    @staticmethod
    def _triplets(R: Any, name: str, shape: tuple[int, int] | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int]]:
        if isinstance(R, (str, os.PathLike)):
            from mgpu.io import load_ratings

            R = load_ratings(R).matrix
        if not sp.issparse(R):
            raise TypeError(f"The '{name}' parameter of MatrixFactorization.fit must be a scipy "
                            f"sparse matrix or a ratings file. Got {type(R).__name__} instead.")
        if shape is not None and R.shape != shape:
            raise ValueError(f"The '{name}' parameter of MatrixFactorization.fit must have R's "
                             f"shape {shape}. Got {R.shape}.")
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
            callback: Callable[[dict[str, Any]], None] | None = None) -> MatrixFactorization:
        """Train on R (users × items), reporting RMSE on ``test`` after every epoch.

        ``callback`` gets each epoch's history entry (for progress bars). Raises
        FloatingPointError, naming the epoch, if the RMSE becomes NaN or infinite.
        """
        self._check_params()
        u, i, r, shape = self._triplets(R, "R")
        if r.size == 0:
            raise ValueError("The 'R' parameter of MatrixFactorization.fit holds no ratings.")
        tu = ti = tr = None
        if test is not None:
            tu, ti, tr, _ = self._triplets(test, "test", shape)
            if tr.size == 0:
                raise ValueError("The 'test' parameter of MatrixFactorization.fit holds no "
                                 "ratings; pass None to train without one.")
        rng = np.random.default_rng(self.seed)
        scale = 1.0 / np.sqrt(self.k)
        P = rng.random((shape[0], self.k)) * scale
        Q = rng.random((shape[1], self.k)) * scale
        self.history_: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        epoch_fn = self._sequential_epochs if self.mode == "sequential" else self._block_epochs
        for epoch, (P, Q) in enumerate(epoch_fn(u, i, r, P, Q, rng), start=1):
            entry = {"epoch": epoch, "seconds": time.perf_counter() - t0,
                     "train_rmse": rmse(u, i, r, P, Q),
                     "test_rmse": rmse(tu, ti, tr, P, Q) if tr is not None else float("nan")}
            self.history_.append(entry)
            self.P_, self.Q_ = P, Q
            if callback is not None:
                callback(entry)
            watched = entry["test_rmse"] if tr is not None else entry["train_rmse"]
            if not np.isfinite(watched) or not np.isfinite(entry["train_rmse"]):
                raise FloatingPointError(
                    f"SGD diverged at epoch {epoch}: train RMSE {entry['train_rmse']}, test RMSE "
                    f"{entry['test_rmse']}; lower the learning rate (lr={self.lr}).")
            if self.checkpoint_dir is not None:
                self._checkpoint(epoch, P, Q)
            if self.target_rmse is not None and tr is not None and watched <= self.target_rmse:
                logger.info("target RMSE %.4f reached at epoch %d", self.target_rmse, epoch)
                break
        return self

    def _checkpoint(self, epoch: int, P: np.ndarray, Q: np.ndarray) -> None:
        path = Path(self.checkpoint_dir) / f"mf-epoch-{epoch}.npz"
        tmp = path.with_name(path.name + ".partial.npz")
        np.savez(tmp, P=P, Q=Q)
        tmp.replace(path)

    def _sequential_epochs(self, u, i, r, P, Q, rng):
        for _ in range(self.epochs):
            sgd_block(u, i, r, P, Q, self.lr, self.reg, self.reg, rng.permutation(r.size))
            yield P, Q

    def _block_epochs(self, u, i, r, P, Q, rng):
        from mgpu.dist.cluster import current_client
        from mgpu.sched import Block, BlockScheduler, Slot

        client = current_client()
        if client is None:
            raise ValueError(f"mode={self.mode!r} runs on a cluster: call mgpu.connect() first.")
        slots = _slots(client, self.mode)
        conflicts = config.get("mf.gpu-conflicts")  # read here, passed to the tasks
        g = len(slots) + 1
        # shuffled users and items, cut into g strata each
        ru = rng.permutation(P.shape[0]) % g
        ri = rng.permutation(Q.shape[0]) % g
        rows = [np.flatnonzero(ru == s) for s in range(g)]
        cols = [np.flatnonzero(ri == s) for s in range(g)]
        local_u = np.empty(P.shape[0], dtype=np.int64)
        local_i = np.empty(Q.shape[0], dtype=np.int64)
        for s in range(g):
            local_u[rows[s]] = np.arange(rows[s].size)
            local_i[cols[s]] = np.arange(cols[s].size)
        blocks, data = [], {}
        for a in range(g):
            for b in range(g):
                sel = np.flatnonzero((ru[u] == a) & (ri[i] == b))
                bid = a * g + b
                blocks.append(Block(bid, a, b, size=float(sel.size), owner=(a + b) % len(slots)))
                owner = slots[(a + b) % len(slots)].worker
                # a one-element list: scatter sends the tuple as one object
                data[bid] = client.scatter([(local_u[u[sel]], local_i[i[sel]], r[sel])],
                                           workers=[owner], hash=False)[0]
        p_seg = {a: client.scatter(P[rows[a]], hash=False) for a in range(g)}
        q_seg = {b: client.scatter(Q[cols[b]], hash=False) for b in range(g)}
        counter = iter(range(1 << 62))

        def run(block: Block, slot: Slot):
            fut = client.submit(_block_task, data[block.id], p_seg[block.row],
                                q_seg[block.col], self.lr, self.reg,
                                int(rng.integers(1 << 31)) + next(counter), slot.kind,
                                conflicts, workers=[slot.worker], allow_other_workers=False,
                                pure=False)
            p_seg[block.row] = client.submit(operator.getitem, fut, 0, workers=[slot.worker],
                                             pure=False)
            q_seg[block.col] = client.submit(operator.getitem, fut, 1, workers=[slot.worker],
                                             pure=False)
            return fut

        sched = BlockScheduler(blocks, slots, run, client=client)
        self.schedule_events_ = sched.events  # grows as the epochs run
        for _ in range(self.epochs):
            sched.run_epoch()
            Ps = client.gather([p_seg[a] for a in range(g)])
            Qs = client.gather([q_seg[b] for b in range(g)])
            for a in range(g):
                P[rows[a]] = Ps[a]
                Q[cols[a]] = Qs[a]
            yield P, Q

    def predict(self, users: Any, items: Any) -> np.ndarray:
        """Predicted ratings pᵤ·qᵢ for pairs of row and column indices."""
        if not hasattr(self, "P_"):
            raise ValueError("This MatrixFactorization instance is not fitted yet. Call 'fit' "
                             "first.")
        users = np.asarray(users, dtype=np.int64)
        items = np.asarray(items, dtype=np.int64)
        for name, idx, n in (("users", users, self.P_.shape[0]), ("items", items,
                                                                  self.Q_.shape[0])):
            if idx.size and (idx.min() < 0 or idx.max() >= n):
                raise ValueError(f"The '{name}' parameter of predict must be in [0, {n}). Got "
                                 f"values from {idx.min()} to {idx.max()}.")
        return np.einsum("nk,nk->n", self.P_[users], self.Q_[items])
