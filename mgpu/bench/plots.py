"""PNG plots of the models' histories and of Jaccard weights, for the CLI and workflows/.

matplotlib is imported inside each function (the ``plot`` extra): importing this module, or
anything in the library, never imports it.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu.models.jaccard import undirected_edges

__all__ = ["plot_gap_history", "plot_jaccard_weights", "plot_mf_history"]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_gap_history(histories: dict[str, list[dict[str, float]]], path: str,
                     title: str) -> None:
    """Log-likelihood per token against the iteration, one line per device, as a PNG
    (the ``history_`` of :class:`mgpu.models.GaP` fits)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for label, hist in histories.items():
        ax.plot([h["iteration"] for h in hist], [h["loglik_per_token"] for h in hist],
                label=label)
    ax.set_xlabel("iteration (2 SDDMM + 2 SpMM)")
    ax.set_ylabel("log-likelihood per token")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_mf_history(histories: dict[str, list[dict[str, float]]], path: str,
                    title: str) -> None:
    """Test RMSE against the step for every run (one line per device) as a PNG (the
    ``history_`` of :class:`mgpu.models.GradientMF` fits)."""
    plt = _pyplot()
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


def plot_jaccard_weights(J: sp.csr_matrix, path: str, title: str) -> None:
    """A histogram of the edge weights (log count axis) as a PNG."""
    plt = _pyplot()
    w = undirected_edges(J).data
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.hist(w, bins=50, range=(0.0, 1.0), color="#3b6ea8")
    ax.set_yscale("log")
    ax.set_xlabel("Jaccard weight")
    ax.set_ylabel("edges")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
