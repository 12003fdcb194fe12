"""The ALS workflow: matrix factorisation of a ratings matrix whose every step is SDDMM then
SpMM (the cuSDDMM paper's reformulation: the gradient of the squared error at the observed
entries is ``(S ∘ (U Vᵀ) - R) V`` for U and its transpose for V).

``r_ij ≈ μ + u_i · v_j`` is fitted on the training ratings by full-batch gradient steps with
Adam's per-entry step sizes and an L2 penalty; each step costs one :func:`mgpu.sddmm` (the
predictions at the observed entries) and two :func:`mgpu.spmm` (the residual times V, its
transpose times U). NumPy/SciPy data runs on the CPU backend, CuPy data on the GPU.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

import mgpu
from mgpu.mf import split_ratings as split
from workflows._sparse import transpose_map

__all__ = ["Factors", "split", "train"]


@dataclass
class Factors:
    """The fitted model and what the training measured per step."""

    U: Any
    V: Any
    mean: float
    history: list[dict[str, float]] = field(default_factory=list)

    def predict(self, S: Any) -> Any:
        """Predictions at the stored entries of S (a CSR of S's pattern)."""
        P = mgpu.sddmm(_pattern(S), self.U, self.V)
        P.data += self.mean
        return P


def _pattern(S: Any) -> Any:
    P = S.copy()
    P.data[:] = 1
    return P


def train(R: Any, test: Any = None, *, k: int = 32, reg: float = 0.1, lr: float = 0.01,
          iters: int = 100, seed: int = 0,
          progress: Callable[[dict[str, float]], None] | None = None) -> Factors:
    """Fit ``R ≈ μ + U Vᵀ`` at R's stored entries (scipy or cupyx CSR, float32 or float64).

    Each step's SDDMM + SpMM time is recorded (``step_s``, synchronised on the GPU) with the
    training and test RMSE; ``progress`` receives each step's record.
    """
    if k < 1 or iters < 1 or lr <= 0 or reg < 0:
        raise ValueError(f"k and iters must be >= 1, lr > 0 and reg >= 0. Got k={k}, "
                         f"iters={iters}, lr={lr}, reg={reg}.")
    gpu = hasattr(R, "get")
    if gpu:
        import cupy as xp
        import cupyx.scipy.sparse as sparse

        def sync() -> None:
            xp.cuda.Device().synchronize()
    else:
        xp, sparse = np, sp

        def sync() -> None:
            pass
    R = R.tocsr()
    R.sort_indices()
    dtype = R.dtype
    m, n = R.shape
    mean = float(R.data.mean())
    rng = np.random.default_rng(seed)
    U = xp.asarray(rng.normal(0, 0.1, (m, k)).astype(dtype))
    V = xp.asarray(rng.normal(0, 0.1, (n, k)).astype(dtype))
    S = _pattern(R)
    t_ptr, t_ind, perm = transpose_map(R)
    cnt_u = xp.maximum(xp.diff(R.indptr), 1).astype(dtype)[:, None]
    cnt_v = xp.maximum(xp.diff(t_ptr), 1).astype(dtype)[:, None]
    state = {name: [xp.zeros_like(A), xp.zeros_like(A)] for name, A in (("U", U), ("V", V))}
    b1, b2, eps = 0.9, 0.999, 1e-8
    model = Factors(U, V, mean)
    t_start = time.perf_counter()
    for it in range(1, iters + 1):
        sync()
        t0 = time.perf_counter()
        E = mgpu.sddmm(S, U, V)  # predictions at the observed entries
        E.data += mean - R.data  # the residual, R's pattern
        ET = sparse.csr_matrix((E.data[perm], t_ind, t_ptr), shape=(n, m))
        gU = mgpu.spmm(E, V)
        gV = mgpu.spmm(ET, U)
        sync()
        step = time.perf_counter() - t0
        train_rmse = float(xp.sqrt(xp.mean(E.data.astype(xp.float64) ** 2)))
        for name, A, g, cnt in (("U", U, gU, cnt_u), ("V", V, gV, cnt_v)):
            g = g / cnt + reg * A
            mom, sq = state[name]
            mom *= b1
            mom += (1 - b1) * g
            sq *= b2
            sq += (1 - b2) * g * g
            A -= (lr * (mom / (1 - b1 ** it)) / (xp.sqrt(sq / (1 - b2 ** it)) + eps)).astype(dtype)
        rec = {"iteration": it, "step_s": step, "train_rmse": train_rmse,
               "elapsed_s": time.perf_counter() - t_start}
        if test is not None:
            P = model.predict(test)
            rec["test_rmse"] = float(xp.sqrt(xp.mean((P.data - test.data).astype(xp.float64)
                                                     ** 2)))
        model.history.append(rec)
        if progress is not None:
            progress(rec)
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
