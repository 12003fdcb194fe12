"""GaP topic model scaling: per-iteration time on one device and on 1, 2, 4, … workers
(``mgpu bench gap``)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu.models import GaP

__all__ = ["scaling", "scaling_markdown"]


def scaling(S: sp.spmatrix, topics: int, iters: int, workers: tuple[int, ...], *,
            gpus: bool | None = None, progress: Callable[[str], None] | None = None
            ) -> list[dict[str, Any]]:
    """Per-iteration time of GaP on one device and on clusters of 1, 2, 4, … workers.

    One run: :class:`mgpu.models.GaP` on one device (the GPU when ``gpus`` or GPUs are
    visible), then on embedded clusters of each size with one row tile per worker.
    The median iteration leaves out the first two (compilation, tuning). Every run starts
    from the same state, so the log-likelihood must agree across them up to rounding.
    """
    from mgpu.distributed import connect, visible_gpus

    use_gpus = visible_gpus() > 0 if gpus is None else gpus
    rows: list[dict[str, Any]] = []

    def record(label: Any, kind: str, model: GaP) -> None:
        steps = [h["step_s"] for h in model.history_[2:]] or [model.history_[-1]["step_s"]]
        row = {"workers": label, "kind": kind, "topics": topics, "iters": iters,
               "n_docs": S.shape[0], "n_words": S.shape[1], "nnz": int(S.nnz),
               "median_step_s": float(np.median(steps)),
               "loglik_per_token": model.history_[-1]["loglik_per_token"]}
        cluster = [r for r in rows if isinstance(r["workers"], int)]
        if isinstance(label, int):
            row["speedup"] = cluster[0]["median_step_s"] / row["median_step_s"] if cluster \
                else 1.0
        if rows:
            row["loglik_diff"] = abs(row["loglik_per_token"] - rows[0]["loglik_per_token"])
        rows.append(row)
        if progress is not None:
            progress(f"{label} {kind}: {row['median_step_s'] * 1e3:.1f} ms per iteration, "
                     f"log-likelihood per token {row['loglik_per_token']:.6f}")

    data = S.astype(np.float32)
    if use_gpus:
        import cupyx.scipy.sparse as csp

        record("one device, no cluster", "GPU",
               GaP(topics, iters=iters).fit(csp.csr_matrix(data)))
    else:
        record("one device, no cluster", "CPU", GaP(topics, iters=iters).fit(data))
    for n in workers:
        with connect(n_workers=n, gpus=gpus) as client:
            record(n, "GPU" if use_gpus else "CPU",
                   GaP(topics, iters=iters).fit(data, parts=n, client=client))
    return rows


def scaling_markdown(rows: list[dict[str, Any]], label: str) -> str:
    """The rows of :func:`scaling` as a Markdown table (docs/benchmarks.md's GaP tables).

    >>> row = {"workers": 2, "kind": "CPU", "topics": 20, "median_step_s": 0.0125,
    ...        "speedup": 1.8, "loglik_per_token": -7.25, "loglik_diff": 3e-12}
    >>> print(scaling_markdown([row], "ap").splitlines()[-1])
    | ap | 20 | 2 CPU | 12.50 | 1.80× | -7.250000 | 3.0e-12 |
    """
    head = ("| corpus | topics | workers | median ms per iteration | speedup vs 1 worker | "
            "log-likelihood per token | difference to one device |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {label} | {r['topics']} | {r['workers']} {r['kind']} | "
                     f"{r['median_step_s'] * 1e3:.2f} | "
                     + (f"{r['speedup']:.2f}× | " if "speedup" in r else "– | ")
                     + f"{r['loglik_per_token']:.6f} | "
                     + (f"{r['loglik_diff']:.1e} |" if "loglik_diff" in r else "– |"))
    return "\n".join(lines)
