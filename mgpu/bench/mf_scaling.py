"""GradientMF's step on one device and on 1, 2, 4, … workers (``mgpu bench mf-scaling``).

Every run fits :class:`mgpu.models.GradientMF` from the same start on the same ratings: first
on one device (the GPU when one is used, its step replayed as a CUDA graph), then on embedded
clusters of each size with one row tile per worker, where the fit is one SPMD call (each
worker loops over the steps, V's gradient all-reduced between the workers). A step's time is
the whole step as the history records it (SDDMM, both SpMMs, both Adam steps, the RMSE, and
on a cluster the all-reduces): the differences of ``elapsed_s``, median over the steps after
the first two (compilation, tuning). The training RMSE curves must agree with one device's
up to rounding.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu.models import GradientMF

__all__ = ["scaling", "scaling_markdown"]


def _median_step(model: GradientMF) -> float:
    elapsed = [h["elapsed_s"] for h in model.history_]
    steps = np.diff([0.0] + elapsed)
    return float(np.median(steps[2:] if len(steps) > 2 else steps))


def scaling(R: sp.spmatrix, k: int, iters: int, workers: tuple[int, ...], *, lr: float = 0.01,
            gpus: bool | None = None, progress: Callable[[str], None] | None = None
            ) -> list[dict[str, Any]]:
    """Median step time of GradientMF on one device and on clusters of 1, 2, 4, … workers.

    Parameters
    ----------
    R : sparse matrix of shape (n_users, n_items)
        Training ratings (float32 or float64, as they are to be fitted).
    k, iters, lr : GradientMF's.
    workers : tuple of int
        Cluster sizes, one row tile per worker.
    gpus : bool, optional
        GPU workers (and the one device a GPU); default: when GPUs are visible.
    progress : callable, optional
        Called with a line per run.

    Returns
    -------
    list of dict
        One row per run: ``workers`` (the label "one device, no cluster" or the count),
        ``kind``, ``median_step_s``, ``speedup`` (one device's median over this one's),
        ``train_rmse`` (the curve) and ``rmse_rel_diff`` (the largest relative difference
        from one device's curve).
    """
    from mgpu.distributed import connect, visible_gpus

    use_gpus = visible_gpus() > 0 if gpus is None else gpus
    kind = "GPU" if use_gpus else "CPU"
    R = sp.csr_matrix(R)
    rows: list[dict[str, Any]] = []

    def record(label: Any, model: GradientMF) -> None:
        curve = [h["train_rmse"] for h in model.history_]
        row = {"workers": label, "kind": kind, "k": k, "iters": iters, "n_users": R.shape[0],
               "n_items": R.shape[1], "nnz": int(R.nnz), "dtype": R.dtype.name,
               "median_step_s": _median_step(model), "train_rmse": curve}
        if rows:
            base = rows[0]
            row["speedup"] = base["median_step_s"] / row["median_step_s"]
            ref = np.asarray(base["train_rmse"])
            row["rmse_rel_diff"] = float(np.max(np.abs(np.asarray(curve) - ref) / ref))
        rows.append(row)
        if progress is not None:
            progress(f"{label} {kind}: {row['median_step_s'] * 1e3:.2f} ms per step, training "
                     f"RMSE {curve[0]:.4f} → {curve[-1]:.4f}")

    if use_gpus:
        import cupyx.scipy.sparse as csp

        record("one device, no cluster", GradientMF(k, lr=lr, iters=iters).fit(
            csp.csr_matrix(R)))
    else:
        record("one device, no cluster", GradientMF(k, lr=lr, iters=iters).fit(R))
    for n in workers:
        with connect(n_workers=n, gpus=gpus) as client:
            record(n, GradientMF(k, lr=lr, iters=iters).fit(R, parts=n, client=client))
    return rows


def scaling_markdown(rows: list[dict[str, Any]], label: str) -> str:
    """The rows of :func:`scaling` as a Markdown table.

    >>> one = {"workers": "one device, no cluster", "kind": "GPU", "k": 128,
    ...        "median_step_s": 0.04, "train_rmse": [1.5, 1.0]}
    >>> four = dict(one, workers=4, median_step_s=0.0111, speedup=3.6, rmse_rel_diff=2e-7)
    >>> print(scaling_markdown([one, four], "planted").splitlines()[-1])
    | planted | 128 | 4 GPU | 11.10 | 3.60× | 1.0000 | 2.0e-07 |
    """
    head = ("| ratings | k | workers | median ms per step | speedup vs one device | "
            "last training RMSE | largest relative RMSE difference to one device |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {label} | {r['k']} | {r['workers']} {r['kind']} | "
                     f"{r['median_step_s'] * 1e3:.2f} | "
                     + (f"{r['speedup']:.2f}× | " if "speedup" in r else "– | ")
                     + f"{r['train_rmse'][-1]:.4f} | "
                     + (f"{r['rmse_rel_diff']:.1e} |" if "rmse_rel_diff" in r else "– |"))
    return "\n".join(lines)
