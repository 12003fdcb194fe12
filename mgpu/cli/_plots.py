"""The PNGs behind ``--plot`` (matplotlib, Agg: no display needed)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu.models.jaccard import undirected_edges


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def knn_graph(dist: np.ndarray, indeg: np.ndarray, title: str, path: str) -> None:
    plt = _pyplot()
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9, 3.6))
    ax0.hist(dist, bins=60)
    ax0.set_xlabel("distance to a neighbour")
    ax0.set_ylabel("edges")
    ax1.hist(indeg, bins=np.arange(indeg.max() + 2) - 0.5 if indeg.max() < 60 else 60, log=True)
    ax1.set_xlabel("in-degree")
    ax1.set_ylabel("rows")
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def calibration(cal: Any, path: str) -> None:
    plt = _pyplot()
    n = np.asarray(cal.sizes)
    grid = np.geomspace(n[0], n[-1], 200)
    fig, ax = plt.subplots(figsize=(6, 4))
    for kind, color in (("cpu", "C0"), ("gpu", "C1")):
        meas = {"cpu": cal.cpu_s, "gpu": [a + b for a, b in zip(cal.transfer_s, cal.kernel_s)]}
        if not meas[kind]:
            continue
        ovh = cal.overhead_cpu_s if kind == "cpu" else cal.overhead_gpu_s
        ax.plot(n, n / (np.asarray(meas[kind]) + ovh), "o", color=color,
                label=f"{kind.upper()} measured")
        for model, ls in (("hsgd*", "-"), ("linear", ":")):
            f = cal.predictor(kind, model)
            ax.plot(grid, grid / np.array([f(x) for x in grid]), ls, color=color,
                    label=f"{kind.upper()} {model} model")
    ax.set_xscale("log")
    ax.set_xlabel("ratings in a block")
    ax.set_ylabel("updates per second (task round trip included)")
    ax.set_title(cal.key, fontsize="x-small")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def rmse(histories: dict[str, list[dict[str, Any]]], target: float, title: str,
         path: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, h in histories.items():
        ax.plot([e["seconds"] for e in h], [e["test_rmse"] for e in h], "o-", ms=3, label=mode)
    if target:
        ax.axhline(target, color="k", lw=1, ls="--", label=f"target {target}")
    ax.set_xlabel("seconds")
    ax.set_ylabel("test RMSE")
    ax.set_title(title, fontsize="medium")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def chunks(per_chunk: np.ndarray, sizes: tuple[int, ...], workers: list[str], title: str,
           unit: str, path: str) -> None:
    plt = _pyplot()
    from matplotlib.patches import Patch

    names = sorted(set(workers))
    colors = {w: plt.cm.tab10(i % 10) for i, w in enumerate(names)}
    x = np.arange(len(per_chunk))
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(max(8, 0.5 * len(per_chunk) + 4), 4))
    ax0.bar(x, per_chunk, color=[colors[w] for w in workers])
    ax0.axhline(per_chunk.mean(), color="k", lw=1, ls="--")
    ax0.set_ylabel("nonzeros")
    ax0.set_title(f"nnz per chunk (max/mean {per_chunk.max() / max(per_chunk.mean(), 1):.4f})")
    ax1.bar(x, sizes, color=[colors[w] for w in workers])
    ax1.set_ylabel(unit)
    ax1.set_title(f"{unit} per chunk")
    for ax in (ax0, ax1):
        ax.set_xlabel("chunk")
        ax.set_xticks(x)
    handles = [Patch(color=colors[w], label=w) for w in names]
    handles.append(plt.Line2D([], [], color="k", ls="--", label="mean nnz"))
    fig.legend(handles=handles, loc="lower center", ncol=min(4, len(handles)), fontsize="small")
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def scaling(rows: list[dict[str, Any]], title: str, path: str,
            rate: Callable[[dict[str, Any]], str], against: str | None = None) -> None:
    """Speedup against workers, one line per ``series`` of the rows (one line "measured"
    where the rows name none), with linear scaling from the first worker count; the
    speedup is against ``against`` (default: the first worker count)."""
    plt = _pyplot()
    w = sorted({r["workers"] for r in rows})
    fig, ax = plt.subplots(figsize=(5, 4))
    series: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        series.setdefault(r.get("series", "measured"), []).append(r)
    for label, some in series.items():
        ax.plot([r["workers"] for r in some], [r["speedup"] for r in some], "o-", label=label)
    ax.plot(w, [x / w[0] for x in w], "k--", lw=1, label="linear")
    for r in rows:
        ax.annotate(rate(r), (r["workers"], r["speedup"]),
                    textcoords="offset points", xytext=(4, -12), fontsize="small")
    ax.set_xlabel(f"{rows[0]['kind']} workers" if rows else "workers")
    ax.set_ylabel(f"speedup against {against or w[0]}" if w else "speedup")
    ax.set_xticks(w)
    ax.set_title(title, fontsize="medium")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def spmv(rows: list[dict[str, Any]], r: float, path: str) -> None:
    """Time against nnz for mgpu's SpMV (with and without checks, in a CUDA graph where
    there is a GPU) and its peer."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    nnz = [row["nnz"] for row in rows]
    ax.loglog(nnz, [row["mgpu_ms"] for row in rows], "o", label="mgpu.spmv (with checks)")
    ax.loglog(nnz, [row["unchecked_ms"] for row in rows], "x",
              label="mgpu.spmv, check_finite=False")
    ax.loglog(nnz, [row["kernels_ms"] for row in rows], "^", label="merge-path kernels")
    if any(row["graph_ms"] == row["graph_ms"] for row in rows):  # GPU: not NaN
        ax.loglog(nnz, [row["graph_ms"] for row in rows], "d",
                  label="mgpu.spmv, unchecked, in a CUDA graph")
        ax.loglog(nnz, [row["planned_graph_ms"] for row in rows], "P",
                  label="the same with a plan (mgpu.spmv_plan)")
    ax.loglog(nnz, [row["peer_ms"] for row in rows], "s", label=rows[0]["peer"])
    ax.set_xlabel("nonzeros")
    ax.set_ylabel("ms per SpMV")
    ax.set_title(f"SpMV time against nnz (r = {r:.3f})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def spgemm(rows: list[dict[str, Any]], path: str) -> None:
    """GFLOP/s of mgpu's SpGEMM and each peer per input (rows of
    :func:`mgpu.bench.spgemm.bench_spgemm`), bars on a log scale: a wrong result hatched,
    a failure written where its bar would be."""
    from mgpu.bench.spgemm import FORMS, PEERS

    plt = _pyplot()
    keys = [k for k in PEERS if any(k in r["peers"] for r in rows)]
    methods = [("mgpu", "mgpu.spgemm")] + [(k, PEERS[k][0]) for k in keys]
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(max(6.4, 1.1 * len(rows) + 2.5), 4.4))
    for j, (key, label) in enumerate(methods):
        for i, r in enumerate(rows):
            x = i - 0.4 + (j + 0.5) * width
            if key == "mgpu":
                status, gflops = ("failed" if r["mgpu_error"] else "ok"), r["mgpu_gflops"]
            elif key in r["peers"]:
                status, gflops = r["peers"][key]["status"], r["peers"][key]["gflops"]
            else:
                continue
            if status == "failed" or not gflops:
                ax.text(x, 0.02, "failed", rotation=90, ha="center", va="bottom",
                        fontsize="x-small", transform=ax.get_xaxis_transform())
                continue
            wrong = status == "wrong result"
            ax.bar(x, gflops, width, color=f"C{j}", hatch="//" if wrong else None,
                   edgecolor="k" if wrong else None, label=label)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{r['name']}, {FORMS[r['form']]}" for r in rows], rotation=20,
                       ha="right", fontsize="small")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))  # one entry a method, not one a bar
    if unique:
        ax.set_yscale("log")
    if any(r["peers"].get(k, {}).get("status") == "wrong result" for r in rows for k in keys):
        from matplotlib.patches import Patch

        unique["wrong result"] = Patch(facecolor="white", edgecolor="k", hatch="//")
    if unique:
        ax.legend(unique.values(), unique.keys(), fontsize="small")
    ax.set_ylabel("GFLOP/s (2 per intermediate product)")
    if rows:
        device = rows[0]["device_name"] or rows[0]["device"].upper()
        ax.set_title(f"SpGEMM, {device}, {rows[0]['dtype']}", fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def gap_history(histories: dict[str, list[dict[str, float]]], path: str,
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


def mf_history(histories: dict[str, list[dict[str, float]]], path: str,
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


def jaccard_weights(J: sp.csr_matrix, path: str, title: str) -> None:
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


def ann(rows: list[dict[str, Any]], title: str, path: str) -> None:
    """Queries/s against recall@k of each method of :func:`mgpu.bench.ann.bench_ann` (one
    line through its search parameters; mgpu's exact kNN a point at recall 1)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    methods = dict.fromkeys(r["method"] for r in rows if r["qps"] is not None)
    for j, method in enumerate(methods):
        pts = sorted((r["recall"], r["qps"]) for r in rows if r["method"] == method)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=f"C{j}", label=method)
    ax.set_yscale("log")
    ax.set_xlabel("recall@k (against exact neighbours)")
    ax.set_ylabel("queries/s")
    ax.set_title(title, fontsize="small")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
