"""GaP topic model scaling: per-iteration time on one device and fitted SPMD on 1, 2, 4, …
workers, strong (one corpus) and weak (the corpus stacked once per worker)
(``mgpu bench gap``)."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu.models import GaP

__all__ = ["scaling", "scaling_markdown"]

_ONE = "one device, no cluster"


def _steps(model: GaP) -> list[float]:
    """An iteration's times after the first two (compilation, tuning)."""
    return [h["step_s"] for h in model.history_[2:]] or [model.history_[-1]["step_s"]]


def _loglik_gap(model: GaP, ref: GaP) -> float:
    """The largest relative difference of the log-likelihood per token, every iteration."""
    a = np.array([h["loglik_per_token"] for h in model.history_])
    b = np.array([h["loglik_per_token"] for h in ref.history_])
    return float(np.max(np.abs(a - b) / np.abs(b)))


def _one_device(S: sp.csr_matrix, topics: int, iters: int, on_gpu: bool) -> GaP:
    if not on_gpu:
        return GaP(topics, iters=iters).fit(S)
    import cupy
    import cupyx.scipy.sparse as csp

    model = GaP(topics, iters=iters).fit(csp.csr_matrix(S))
    model.X_, model.L_ = model.X_.get(), model.L_.get()
    # the client's GPU is a worker's too: give its memory back before the cluster runs
    cupy.get_default_memory_pool().free_all_blocks()
    return model


def scaling(S: sp.spmatrix, topics: int, iters: int, workers: tuple[int, ...], *,
            gpus: bool | None = None, weak: bool = False,
            progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Per-iteration time of GaP on one device and fitted SPMD on 1, 2, 4, … workers.

    One run, one embedded cluster of ``max(workers)`` workers (GPU workers when ``gpus`` or
    GPUs are visible): for ``n`` workers the corpus is cut into ``n`` row tiles of equal nnz
    on ``n`` of them, and :class:`mgpu.models.GaP` fits it as one SPMD job (``step_s`` from
    rank 0's loop). Every corpus is also fitted on one device (the GPU when GPU workers
    are used), which is the reference of the speedups and of the log-likelihood: the largest
    relative difference over every iteration is reported. With ``weak``, the corpus stacked
    ``n`` times (the same documents per worker) is fitted on ``n`` workers too; the weak
    scaling efficiency is 1 worker's time on the corpus over ``n`` workers' on ``n``
    copies. Medians leave out the first two iterations; means keep the checkpoints'.
    """
    from mgpu.distributed import connect, visible_gpus

    use_gpus = visible_gpus() > 0 if gpus is None else gpus
    kind = "GPU" if use_gpus else "CPU"
    data = sp.csr_matrix(S, dtype=np.float32)
    runs = [(1, n) for n in workers] + ([(n, n) for n in workers if n > 1] if weak else [])
    rows: list[dict[str, Any]] = []

    def record(label: Any, copies: int, model: GaP, ref: GaP | None, fit_s: float) -> None:
        steps = _steps(model)
        row = {"workers": label, "kind": kind, "scaling": "weak" if copies > 1 else "strong",
               "copies": copies, "topics": topics, "iters": iters,
               "n_docs": data.shape[0] * copies, "n_words": data.shape[1],
               "nnz": int(data.nnz) * copies, "median_step_s": float(np.median(steps)),
               "mean_step_s": float(np.mean(steps)), "fit_s": fit_s,
               "loglik_per_token": model.history_[-1]["loglik_per_token"]}
        if ref is not None:  # a cluster row: against its corpus's one-device row
            t = row["median_step_s"]
            one = [r for r in rows if r["copies"] == copies and r["workers"] == _ONE][0]
            row["vs_one_device"] = one["median_step_s"] / t
            row["loglik_diff"] = abs(row["loglik_per_token"] - one["loglik_per_token"])
            row["loglik_rel_diff_max"] = _loglik_gap(model, ref)
            first = [r for r in rows if r["workers"] == 1 and r["copies"] == 1]
            if copies == 1:
                row["speedup"] = first[0]["median_step_s"] / t if first else 1.0
            else:
                base = [r for r in rows if r["copies"] == 1 and r["workers"] == _ONE][0]
                row["weak_efficiency_vs_one_device"] = base["median_step_s"] / t
                if first:
                    row["weak_efficiency"] = first[0]["median_step_s"] / t
        rows.append(row)
        if progress is not None:
            progress(f"{label} {kind} ({row['nnz']:,} counts): {row['median_step_s'] * 1e3:.2f} "
                     f"ms per iteration (mean {row['mean_step_s'] * 1e3:.2f})"
                     + (f", {row['vs_one_device']:.2f}× one device, log-likelihood within "
                        f"{row['loglik_rel_diff_max']:.1e}" if ref is not None else ""))

    with connect(n_workers=max(workers), gpus=gpus) as client:
        for copies in sorted({c for c, _ in runs}):
            corpus = data if copies == 1 else sp.vstack([data] * copies, format="csr")
            t0 = time.perf_counter()
            ref = _one_device(corpus, topics, iters, use_gpus)
            record(_ONE, copies, ref, None, time.perf_counter() - t0)
            for n in [n for c, n in runs if c == copies]:
                t0 = time.perf_counter()
                model = GaP(topics, iters=iters).fit(corpus, parts=n, client=client)
                record(n, copies, model, ref, time.perf_counter() - t0)
    return rows


def scaling_markdown(rows: list[dict[str, Any]], label: str) -> str:
    """The rows of :func:`scaling` as a Markdown table (docs/benchmarks.md's GaP tables).

    >>> row = {"workers": 2, "kind": "GPU", "scaling": "strong", "nnz": 44809606,
    ...        "median_step_s": 0.0125, "mean_step_s": 0.013, "vs_one_device": 2.4,
    ...        "speedup": 1.8, "loglik_per_token": -7.25, "loglik_rel_diff_max": 3e-8}
    >>> print(scaling_markdown([row], "power-law").splitlines()[-1])
    | power-law | strong | 44,809,606 | 2 GPU | 12.50 | 13.00 | 2.40× | 1.80× | -7.250000 | 3.0e-08 |
    """
    head = ("| corpus | scaling | counts | workers | median ms per iteration | mean ms | "
            "vs one device | vs 1 worker (strong) or efficiency (weak) | "
            "log-likelihood per token | largest relative difference to one device |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        ratio = (f"{r['speedup']:.2f}× | " if "speedup" in r else
                 f"{r['weak_efficiency']:.0%} | " if "weak_efficiency" in r else "– | ")
        lines.append(f"| {label} | {r['scaling']} | {r['nnz']:,} | {r['workers']} {r['kind']} | "
                     f"{r['median_step_s'] * 1e3:.2f} | {r['mean_step_s'] * 1e3:.2f} | "
                     + (f"{r['vs_one_device']:.2f}× | " if "vs_one_device" in r else "– | ")
                     + ratio
                     + f"{r['loglik_per_token']:.6f} | "
                     + (f"{r['loglik_rel_diff_max']:.1e} |" if "loglik_rel_diff_max" in r
                        else "– |"))
    return "\n".join(lines)
