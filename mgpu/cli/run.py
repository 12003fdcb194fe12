"""``mgpu run``: end-to-end jobs on real data.

Every job here that takes ``--address`` runs on a cluster and is one a SLURM batch script can
run (:func:`cluster_jobs` reads them from these commands).
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import numpy as np

from mgpu.cli import _options as opt
from mgpu.cli import _plots
from mgpu.cli._errors import Group
from mgpu.cli._inputs import (Input, load_ratings, load_vectors, read_input, read_matrix,
                              read_words)
from mgpu.cli._mf import mf_options, train
from mgpu.cli._output import (bar, describe, plotted, replace_json, save_npz, save_sparse,
                              save_table, tile_placement)


@click.group(cls=Group)
def run() -> None:
    """End-to-end jobs on real data."""


@run.command("partition")
@opt.matrix_input
@opt.input_format
@opt.parts("Chunks (default: one per worker).")
@click.option("--axis", type=click.Choice(["0", "1"]), default="0", show_default=True,
              help="0 cuts rows, 1 cuts columns.")
@opt.address
@opt.gpus
@opt.plot("a bar chart of nnz per chunk and worker")
def run_partition(input: str | None, powerlaw: tuple[int, int] | None, nnz: float, seed: int,
                  fmt: str | None, parts: int | None, axis: str, address: str | None, gpus: bool | None,
                  plot: str | None) -> None:
    """Spread a sparse matrix over the cluster in nnz-balanced chunks and report the balance.

    INPUT is any file mgpu.io.load reads (Matrix Market, SNAP edge list, bag-of-words,
    MovieLens ratings, a 10x folder); or use --powerlaw. The chunks are checked by computing
    the row norms on the workers against the same computation done here.
    """
    from mgpu.bench.partition import spread
    from mgpu.distributed import connect, describe_workers

    t0 = time.perf_counter()
    S, label = read_input(input, powerlaw, nnz, seed, fmt)[:2]
    click.echo(f"{label}: {S.shape[0]:,} x {S.shape[1]:,}, {S.nnz:,} nonzeros "
               f"(loaded in {time.perf_counter() - t0:.1f} s)")
    ax = int(axis)
    with connect(address, gpus=gpus) as client:
        infos = describe_workers(client)
        with bar(total=int(S.nnz), unit="nz", unit_scale=True, desc="placing chunks") as b:
            placed = spread(S, parts, ax, client, progress=b.update)
    _report_chunks(placed, infos, ax)
    err = placed["max_rel_err"]
    odd = placed.get("nonfinite_rows", 0)
    click.echo(f"row-norm check on the workers: max relative error {err:.2e}"
               + (f" ({odd:,} row(s) with NaN or infinity, compared by position)" if odd else ""))
    if not err <= 1e-5:  # NaN fails too: a check that cannot compare has not passed
        raise click.ClickException(f"distributed row norms disagree with the local ones ({err:.2e})")
    if plot is not None:
        _plots.chunks(placed["nnz"], placed["sizes"], placed["owners"], label,
                      "rows" if ax == 0 else "columns", plot)
    plotted(plot)


def _report_chunks(placed: dict[str, Any], infos: dict[str, Any], ax: int) -> None:
    from mgpu.bench.partition import per_worker
    from mgpu.partition import imbalance

    per_chunk, bounds = placed["nnz"], placed["bounds"]
    click.echo(f"{len(per_chunk)} chunk(s) along axis {ax} "
               f"({'rows' if ax == 0 else 'columns'}); nnz imbalance (max/mean) "
               f"{imbalance(per_chunk):.4f}")
    click.echo(f"{'chunk':>5} {'range':>23} {'nnz':>14} {'share':>7}  worker")
    total = max(int(per_chunk.sum()), 1)
    for i, (v, w) in enumerate(zip(per_chunk, placed["owners"])):
        click.echo(f"{i:>5} {f'{bounds[i]:,}-{bounds[i + 1]:,}':>23} {int(v):>14,} "
                   f"{100 * v / total:>6.2f}%  {w}")
    click.echo("per worker:")
    workers = per_worker(placed)
    for w, v in sorted(workers.items()):
        gpu = (infos.get(w) or {}).get("gpu")
        dev = f"GPU {gpu.get('name', gpu.get('index'))}" if gpu else "CPU"
        click.echo(f"  {w:<24} {dev:<28} {v:>14,} nnz  {100 * v / total:6.2f}%")
    if workers:
        click.echo(f"worker imbalance (max/mean): {imbalance(np.array(list(workers.values()))):.4f}")


@run.command("knn-graph")
@opt.matrix_input
@opt.input_format
@opt.k(10, "Neighbours per row (the row itself excluded).")
@click.option("--metric", default="cosine", show_default=True,
              help="Any metric or alias of mgpu.ops.distances.SEMIRINGS.")
@click.option("--p", "p", default=2.0, show_default=True, type=float,
              help="Minkowski's exponent.")
@opt.out_npz("the graph", "Where to write the graph (scipy .npz, CSR: row i holds its k "
             "neighbours, distances as values; node_ids: the original id of every row).")
@opt.parts("Row tiles of the index (default: one per worker).")
@opt.address
@opt.gpus
@opt.plot("histograms of the distances and of the in-degrees")
def run_knn_graph(input: str | None, powerlaw: tuple[int, int] | None, nnz: float, seed: int,
                  fmt: str | None, k: int, metric: str, p: float, out: Path, parts: int | None,
                  address: str | None, gpus: bool | None, plot: str | None) -> None:
    """The k-nearest-neighbour graph of a dataset's rows, computed on the cluster.

    INPUT is any file mgpu.io.load reads (bag-of-words, a 10x folder, MNIST IDX, ...). The
    index is spread over the workers in nnz-balanced row tiles; every row is queried against
    it and its own entry dropped, as scikit-learn's kneighbors_graph does. OUT holds the
    graph (scipy.sparse.load_npz reads it) and ``node_ids`` (numpy.load): the original id of
    every row (a ratings file's user ids, an edge list's node ids, the 1-based row numbers of
    a Matrix Market or docword file, the 0-based ones of LDA-C, IDX and npz).
    """
    from mgpu.bench.knn_graph import graph_stats, knn_graph
    from mgpu.ops.distances import resolve_metric

    metric = resolve_metric(metric, p, func="knn-graph")[0].name  # refused before reading
    t0 = time.perf_counter()
    S, label, ids = read_input(input, powerlaw, nnz, seed, fmt)[:3]
    n = S.shape[0]
    click.echo(f"{label}: {n:,} x {S.shape[1]:,}, {S.nnz:,} nonzeros "
               f"(loaded in {time.perf_counter() - t0:.1f} s); k={k}, metric {metric}")
    t0 = time.perf_counter()
    with bar(total=n, unit="row", desc="neighbours") as b:
        G, d, i = knn_graph(S, k, metric=metric, p=p, parts=parts, address=address, gpus=gpus,
                            progress=b.update)
    save_sparse(out, G, node_ids=ids)
    st = graph_stats(G, d, i)
    click.echo(f"graph: {n:,} nodes, {G.nnz:,} edges in {time.perf_counter() - t0:.1f} s, "
               f"written to {out}")
    q = st["quantiles"]
    click.echo(f"distances: min {q[0]:.4g}, median {q[1]:.4g}, 90% {q[2]:.4g}, max {q[3]:.4g}"
               + (f"; {st['infinite']:,} infinite" if st["infinite"] else ""))
    indeg = st["in_degree"]
    click.echo(f"in-degree: mean {indeg.mean():.2f}, max {int(indeg.max())} (row "
               f"{int(indeg.argmax())}), {int((indeg == 0).sum()):,} rows nobody's neighbour; "
               f"mutual edges {st['mutual']:.1%}")
    if plot is not None:
        _plots.knn_graph(st["finite"], indeg, f"{label}: {k}-NN graph, {metric}", plot)
    plotted(plot)


@run.command("ann-graph")
@click.argument("input", type=click.Path(exists=True))
@click.option("--metric", default="euclidean", show_default=True,
              type=click.Choice(("euclidean", "l2", "sqeuclidean", "cosine", "inner_product")))
@click.option("--degree", default=32, show_default=True, type=click.IntRange(2),
              help="Links a vertex keeps; a new row makes half as many.")
@click.option("--candidates", default=64, show_default=True, type=click.IntRange(1),
              help="Vertices the build's searches keep (and, saved, the index's searches).")
@click.option("--batch", default=1024, show_default=True, type=click.IntRange(1),
              help="Rows inserted at a time.")
@click.option("--gpu", is_flag=True, help="Build on the GPU (the rows in float32).")
@opt.out_npz("the index", "Where to write the index (mgpu.models.GraphIndex.load reads it).")
def run_ann_graph(input: str, metric: str, degree: int, candidates: int, batch: int,
                  gpu: bool, out: Path) -> None:
    """Build the proximity-graph index of INPUT's rows (mgpu.models.GraphIndex, on the CPU
    or with --gpu on the GPU) and write it to OUT.

    INPUT is a vectors file (MNIST IDX, an npz array) or a sparse matrix (bag-of-words, a
    10x folder, ...): dense rows stay dense, sparse rows sparse.
    """
    import scipy.sparse as sp

    from mgpu.backends import to_device, to_host
    from mgpu.models import GraphIndex

    t0 = time.perf_counter()
    X = load_vectors(input)
    click.echo(f"{click.format_filename(input)}: {X.shape[0]:,} x {X.shape[1]:,} "
               f"({'sparse' if sp.issparse(X) else 'dense'}, loaded in "
               f"{time.perf_counter() - t0:.1f} s); {metric}, degree {degree}")
    index = GraphIndex(min(10, candidates), metric=metric, degree=degree,
                       candidates=candidates, batch=batch)
    t0 = time.perf_counter()
    rows = to_device(X.astype(np.float32)) if gpu else X
    with bar(total=X.shape[0], unit="row", desc="inserted") as b:
        index.fit(rows, progress=lambda done, n: b.update(done - b.n))
    index.save(out)
    links = to_host(index.degree_)
    click.echo(f"graph: {X.shape[0]:,} vertices, {int(links.sum()):,} links (per vertex: "
               f"mean {links.mean():.1f}, max {int(links.max())}) in "
               f"{time.perf_counter() - t0:.1f} s, written to {out}")


@run.command("jaccard")
@click.argument("input", type=click.Path(exists=True))
@opt.input_format
@click.option("--weighted", is_flag=True, help="Use the edge weights (Σ min / Σ max).")
@click.option("--directed-ok/--strict", "symmetrize", default=True, show_default=True,
              help="Use G + Gᵀ for a directed edge list (SNAP lists are often one-way), or "
              "refuse it.")
@opt.top("Print this many strongest edges.")
@opt.out_npz("the weights", "Where to write the weights (scipy .npz, G's pattern; "
             "node_ids: the original id of every node).")
@opt.parts("Row blocks over the cluster (default: four per worker).")
@opt.address
@opt.gpus
@opt.plot("the histogram of the weights")
def run_jaccard(input: str, fmt: str | None, weighted: bool, symmetrize: bool, top: int, out: Path,
                parts: int | None, address: str | None, gpus: bool | None,
                plot: str | None) -> None:
    """Jaccard weights of every edge of a graph, computed on the cluster.

    INPUT is an edge list (plain or gzip; read as undirected): SNAP's 'u v' lines, or 'u v
    weight' lines (a file of three numbers a line is read as weights, and says so; --format
    temporal-edges reads the third column as a time, ignored), or any adjacency matrix
    mgpu.io.load reads. Prints the distribution and the strongest edges (original node ids).
    OUT holds the weights (scipy.sparse.load_npz reads them) and ``node_ids`` (numpy.load):
    row and column i are node node_ids[i] of the file.
    """
    import mgpu
    from mgpu.distributed import connect, workers_now
    from mgpu.models.jaccard import histogram, top_edges
    from mgpu.ops.jaccard import check_graph

    t0 = time.perf_counter()
    G, ids = _load_graph(input, fmt, weighted)
    click.echo(f"{Path(input).name}: {G.shape[0]:,} nodes, {G.nnz:,} stored edges "
               f"(loaded in {time.perf_counter() - t0:.1f} s)")
    with connect(address, gpus=gpus) as client:
        t0 = time.perf_counter()
        n_parts = parts or 4 * max(1, len(workers_now(client)))
        checked = check_graph(G, "jaccard", weighted=weighted, symmetrize=symmetrize)
        with bar(total=checked.nnz, unit="edge", desc="jaccard") as b:
            J = mgpu.jaccard(checked, weighted=weighted, symmetrize=False, parts=n_parts,
                             client=client, progress=b.update)
        elapsed = time.perf_counter() - t0
    save_sparse(out, J, node_ids=ids)
    h = histogram(J)
    click.echo(f"weights of {h['edges']:,} edges in {elapsed:.1f} s "
               f"({J.nnz / max(elapsed, 1e-9):,.0f} edge entries/s), written to {out}")
    click.echo(f"mean {h['mean']:.4f}, median {h['median']:.4f}; weight 0: {h['zero']:.1%}, "
               f"weight 1: {h['one']:.1%}")
    for u, v, w in top_edges(J, top):
        click.echo(f"  {int(ids[u])} -- {int(ids[v])}: {w:.4f}")
    if plot is not None:
        _plots.jaccard_weights(J, plot,
                               f"Jaccard weights, {Path(input).name} ({h['edges']:,} edges)")
    plotted(plot)


def _load_graph(path: str, fmt: str | None, weighted: bool) -> tuple[Any, np.ndarray]:
    """A graph's adjacency (an edge list's ids relabelled 0..n-1) and the original ids; a
    file whose lines also read as ratings is read as an edge list, and says so."""
    got: Input = read_matrix(path, fmt, expect="graph", relabel=True, dtype=np.float64)
    if weighted and got.fmt == "temporal-edges":
        raise click.BadParameter(
            f"{got.label} is read as temporal-edges, whose third column is a time, not a "
            "weight; drop --weighted (the times are ignored), or pass --format weighted-edges "
            "if that column holds weights", param_hint="--weighted")
    return got.matrix, got.row_ids


@run.command("triangles")
@click.argument("graph", type=click.Path(exists=True))
@opt.input_format
@click.option("--symmetrize", is_flag=True, help="Use G + Gᵀ for a directed edge list (SNAP "
              "lists often store each edge once) instead of refusing it.")
@opt.device(("auto", "cpu", "gpu"), "auto", "Where the SpGEMM runs: auto (the GPU when one "
            "is visible), cpu or gpu; one device, no cluster.")
@opt.top("Print this many vertices with most triangles.")
@opt.out_table("the counts", "Write the count of every vertex (columns node_id, the id in "
               "the file, and triangles) as CSV (.csv) or a numpy structured array (.npy).")
def run_triangles(graph: str, fmt: str | None, symmetrize: bool, device: str, top: int,
                  out: Path | None) -> None:
    """Triangles through every vertex of an undirected graph, by one masked SpGEMM.

    GRAPH is an edge list (plain or gzip; SNAP's 'u v' lines, or 'u v weight' lines: the
    weights are ignored) or any adjacency matrix mgpu.io.load reads. Self-loops are dropped
    and repeated edges count once. The count is mgpu.triangles: the product A·A computed
    only at A's edges, row sums halved. Prints the vertices, edges, triangles, the global
    clustering coefficient (3 x triangles / connected triples) and the vertices with most
    triangles (ids of the file).
    """
    from mgpu.models.triangles import summary, top_vertices
    from mgpu.ops.triangles import triangles_local

    dev = _devices(device, None, None, None)[0]  # refuses gpu where none is visible
    t0 = time.perf_counter()
    G, ids = _load_graph(graph, fmt, weighted=False)
    click.echo(f"{Path(graph).name}: {G.shape[0]:,} vertices, {G.nnz:,} stored edges "
               f"(loaded in {time.perf_counter() - t0:.1f} s)")
    t0 = time.perf_counter()
    A = _undirected(G, ids, symmetrize)
    click.echo(f"counting on the {dev.upper()}: one masked SpGEMM, A·A at the {A.nnz:,} "
               "stored edges of A")
    if dev == "gpu":
        import cupyx.scipy.sparse as csp

        t = _host(triangles_local(csp.csr_matrix(A)))[0]
    else:
        t = triangles_local(A)
    elapsed = time.perf_counter() - t0
    s = summary(t, np.diff(A.indptr))
    click.echo(f"{s['vertices']:,} vertices, {s['edges']:,} edges; triangles: "
               f"{s['triangles']:,} (counted in {elapsed:.2f} s)")
    click.echo(f"global clustering coefficient {s['transitivity']:.6f} "
               f"({s['triples']:,} connected triples)")
    if top:
        click.echo("most triangles (vertex id in the file: triangles):")
    for v, c in top_vertices(t, top):
        click.echo(f"  {ids[v]}: {c:,}")
    if out is not None:
        save_table(out, node_id=ids, triangles=t)
        click.echo(f"counts written to {out}")


def _undirected(G: Any, ids: np.ndarray, symmetrize: bool) -> Any:
    """G checked as an undirected simple graph; a directed one refused in the command
    line's words: the library's row and column as the file's vertex ids, and its offer of
    symmetrize=True as --symmetrize."""
    import re

    from mgpu.ops.jaccard import check_graph

    try:
        return check_graph(G, "triangles", symmetrize=symmetrize)
    except ValueError as exc:
        msg = str(exc)
        if symmetrize or "Pass symmetrize=True" not in msg:
            raise

        def edge(m: re.Match[str]) -> str:  # the entry whose mirror is missing, either way
            u, v = int(m[1]), int(m[2])
            u, v = (u, v) if G[u, v] != 0 else (v, u)
            return f"an edge {ids[u]} -> {ids[v]} without its reverse"

        msg = re.sub(r"row (\d+), column (\d+)", edge, msg)
        raise click.UsageError(msg.replace("The 'G' parameter of triangles", "GRAPH")
                               .replace("Pass symmetrize=True", "Pass --symmetrize")) from None


@run.command("mf")
@opt.ratings
@mf_options
@opt.out_dir("Folder for the factors (<mode>-factors.npz) and history.json.")
def run_mf(ratings: str, out_dir: str, target_rmse: float | None, **kw: Any) -> None:
    """Train SGD matrix factorisation on a ratings file in several modes and compare them.

    RATINGS is a MovieLens file (ratings.csv, ratings.dat or u.data, gzip or not). A random
    share is held out; every mode trains on the rest from the same start and reports RMSE per
    epoch. Factors go to OUT as <mode>-factors.npz (P, Q, the original user/item ids, and
    ``mean``, ``rated_users``, ``rated_items``: a user or item without a training rating is
    predicted the training mean).
    """
    data = load_ratings(ratings)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = 0.98 if target_rmse is None else target_rmse
    mfs = train(data.matrix, Path(ratings).name, target=target, **kw)
    for mode, mf in mfs.items():
        save_npz(out / f"{mode}-factors.npz", P=mf.P_, Q=mf.Q_, user_ids=data.user_ids,
                 item_ids=data.item_ids, mean=mf.mean_, rated_users=mf.rated_users_,
                 rated_items=mf.rated_items_)
    replace_json(out / "history.json", {m: mf.history_ for m, mf in mfs.items()})
    click.echo(f"factors and history written to {out}")


# ------------------------------------------------------------ the SDDMM + SpMM workflows


def _devices(device: str, parts: int | None, n_workers: int | None,
             address: str | None) -> list[str]:
    """``["cluster"]`` for --device cluster, else the one-device runs --device asks for
    (refused when a GPU is asked for and none is visible); refuses the cluster's options
    (--parts, --workers, --address) without a cluster."""
    from mgpu.distributed.cluster import visible_gpus

    if device == "cluster":
        return ["cluster"]
    if parts is not None or n_workers is not None or address:
        raise click.BadParameter("--parts, --workers and --address go with --device cluster "
                                 "(the default)", param_hint="--device")
    have = visible_gpus() > 0
    devices = {"auto": ["gpu" if have else "cpu"], "both": ["cpu", "gpu"]}.get(device, [device])
    if "gpu" in devices and not have:
        raise click.BadParameter("no GPU is visible on this machine", param_hint="--device")
    return devices


def _on_devices(devices: list[str], data: tuple[Any, ...], total: int, unit: str,
                postfix: Callable[[dict[str, float]], dict[str, str]],
                fit: Callable[[str, tuple[Any, ...], Callable[[dict[str, float]], None]], Any]
                ) -> dict[str, Any]:
    """``fit(device, data, progress)`` on each device, with a progress bar (``postfix``
    turns a step's record into what the bar shows); on 'gpu', ``data`` moved to the GPU.
    The fitted models by device."""
    models = {}
    for dev in devices:
        if dev == "gpu":
            import cupyx.scipy.sparse as csp

            on = tuple(csp.csr_matrix(x) for x in data)
        else:
            on = data
        with bar(total=total, unit=unit, desc=dev) as b:
            def progress(rec: dict[str, float], b: Any = b) -> None:
                b.update(1)
                b.set_postfix(**postfix(rec))

            models[dev] = fit(dev, on, progress)
    return models


def _host(*arrays: Any) -> list[np.ndarray]:
    from mgpu.backends import to_host

    return [to_host(A) for A in arrays]


def _median_step(hist: list[dict[str, float]]) -> float:
    """The median step time, the first step (compilation, placement) left out."""
    return float(np.median([h["step_s"] for h in hist[1:]] or [hist[0]["step_s"]]))


@run.command("gradient-mf")
@opt.ratings
@opt.placement("steps", "the users", "the ratings", " (the CPU and the GPU from the same "
               "start, and their per-step times compared)")
@opt.k(32)
@click.option("--iters", default=100, show_default=True, type=click.IntRange(min=1),
              help="Gradient steps.")
@click.option("--lr", default=0.01, show_default=True,
              type=click.FloatRange(min=0, min_open=True), help="Adam step size.")
@click.option("--reg", default=0.1, show_default=True, type=click.FloatRange(min=0),
              help="L2 penalty.")
@click.option("--test-fraction", default=0.1, show_default=True, type=float)
@opt.seed
@opt.out_dir("Folder for <device>-factors.npz and history.json.")
@opt.plot("test RMSE against the step")
def run_gradient_mf(ratings: str, device: str, parts: int | None, n_workers: int | None,
                    address: str | None, k: int, iters: int, lr: float, reg: float,
                    test_fraction: float, seed: int, out_dir: str, plot: str | None) -> None:
    """Matrix factorisation of a ratings file by full-batch gradient steps of SDDMM + SpMM.

    mgpu.models.GradientMF (formerly `mgpu run als`): every step computes the predictions at
    the training ratings (mgpu.sddmm) and the two gradients (mgpu.spmm of the residual with V,
    of its transpose with U); the step's time and the test RMSE are reported, per device. On a
    cluster (the default) each worker keeps its users' ratings and rows of U, and only V moves.
    OUT gets <device>-factors.npz: U, V, mean, and user_ids, item_ids (row i of U is user
    user_ids[i] of the file, row j of V item item_ids[j]).
    """
    from mgpu.mf import split_ratings
    from mgpu.models import GradientMF

    rated = load_ratings(ratings)
    R = rated.matrix
    train, test = split_ratings(R, test_fraction, seed)
    devices = _devices(device, parts, n_workers, address)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    click.echo(f"{Path(ratings).name}: {R.shape[0]:,} users x {R.shape[1]:,} items, "
               f"{train.nnz:,} training and {test.nnz:,} test ratings; k={k}, {iters} steps")

    def fit(dev: str, data: tuple[Any, ...], progress: Callable[..., None]) -> Any:
        model = GradientMF(k, reg=reg, lr=lr, iters=iters, seed=seed)
        _fit(model, dev, data, progress, address, n_workers, parts)
        hist = model.history_
        U, V = _host(model.U_, model.V_)
        save_npz(out / f"{dev}-factors.npz", U=U, V=V, mean=model.mean_,
                 user_ids=rated.user_ids, item_ids=rated.item_ids)
        click.echo(f"{dev}: test RMSE {hist[-1]['test_rmse']:.4f} after {iters} steps "
                   f"(best {min(h['test_rmse'] for h in hist):.4f}); SDDMM + SpMM step median "
                   f"{_median_step(hist) * 1e3:.2f} ms")
        return model

    models = _on_devices(devices, (train, test), iters, "step",
                         lambda rec: {"test_rmse": f"{rec['test_rmse']:.4f}"}, fit)
    histories = {dev: m.history_ for dev, m in models.items()}
    if len(histories) == 2:
        med = {d: _median_step(hist) for d, hist in histories.items()}
        click.echo(f"GPU step {med['cpu'] / med['gpu']:.1f}x faster than the CPU backend")
    replace_json(out / "history.json", histories)
    if plot is not None:
        _plots.mf_history(histories, plot,
                          f"SDDMM + SpMM matrix factorisation, {Path(ratings).name}")
    plotted(plot)


# The command's name until it was named for what it does (it is not alternating least squares).
_als = copy.copy(run_gradient_mf)
_als.name, _als.hidden, _als.deprecated = "als", True, True
_als.help = "Renamed: mgpu run gradient-mf (this name goes in a later release)."
run.add_command(_als, "als")


@run.command("gap")
@click.argument("corpus", type=click.Path(exists=True, dir_okay=False))
@opt.input_format
@click.option("--vocab", type=click.Path(exists=True, dir_okay=False), default=None,
              help="One word per line (plain or gzip), for the topics' top words.")
@opt.placement("updates", "the documents", "the corpus", "")
@click.option("--topics", default=20, show_default=True, type=click.IntRange(min=1))
@click.option("--iters", default=50, show_default=True, type=click.IntRange(min=1))
@click.option("--alpha", default=1.1, show_default=True, type=click.FloatRange(min=1),
              help="Shape of the Gamma prior of the loadings (>= 1).")
@click.option("--beta", default=10.0, show_default=True,
              type=click.FloatRange(min=0, min_open=True),
              help="Scale of the Gamma prior of the loadings.")
@opt.seed
@opt.out_dir("Folder for <device>-topics.npz, topics.json and history.json.")
@opt.plot("the log-likelihood per token against the iteration")
def run_gap(corpus: str, fmt: str | None, vocab: str | None, device: str, parts: int | None,
            n_workers: int | None, address: str | None, topics: int, iters: int,
            alpha: float, beta: float, seed: int, out_dir: str, plot: str | None) -> None:
    """GaP topic model of a bag-of-words corpus (documents x words counts).

    CORPUS is any bag-of-words file mgpu.io.load reads (UCI docword, LDA-C). Every update is
    an SDDMM (the Poisson rates at the nonzero counts) followed by an SpMM; on a cluster the
    documents stay on the workers and only the topics move. OUT gets <device>-topics.npz: X
    (documents x topics), L (words x topics), and row_ids, col_ids: the ids in the file of
    X's rows (documents) and of L's rows (words): 1-based for UCI docword, 0-based for LDA-C.
    """
    from mgpu.models import GaP

    from mgpu.models.gap import check_counts

    S, _, doc_ids, word_ids = read_matrix(corpus, fmt)[:4]
    S = check_counts(S, "CORPUS", "run gap")  # refused before any cluster
    words = _vocabulary(vocab, S.shape[1], corpus) if vocab is not None else None
    devices = _devices(device, parts, n_workers, address)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    click.echo(f"{Path(corpus).name}: {S.shape[0]:,} documents x {S.shape[1]:,} words, "
               f"{S.nnz:,} nonzero counts; {topics} topics, {iters} iterations")

    def fit(dev: str, data: tuple[Any, ...], progress: Callable[..., None]) -> Any:
        model = GaP(topics, iters=iters, alpha=alpha, beta=beta, seed=seed)
        _fit(model, dev, data, progress, address, n_workers, parts, tiles=True)
        X, L = _host(model.X_, model.L_)
        save_npz(out / f"{dev}-topics.npz", X=X, L=L, row_ids=doc_ids, col_ids=word_ids)
        click.echo(f"{dev}: log-likelihood per token "
                   f"{model.history_[-1]['loglik_per_token']:.4f}"
                   f"; iteration median {_median_step(model.history_) * 1e3:.2f} ms")
        return model

    models = _on_devices(devices, (S,), iters, "iter",
                         lambda rec: {"loglik": f"{rec['loglik_per_token']:.4f}"}, fit)
    listing = {dev: m.top_words(words) for dev, m in models.items()}
    for t, ws in enumerate(listing[devices[0]][:10]):
        click.echo(f"  topic {t:2d}: {' '.join(ws)}")
    histories = {dev: m.history_ for dev, m in models.items()}
    replace_json(out / "history.json", histories)
    replace_json(out / "topics.json", listing)
    if plot is not None:
        _plots.gap_history(histories, plot, f"GaP topic model, {Path(corpus).name}")
    plotted(plot)


def _fit(model: Any, dev: str, data: tuple[Any, ...], progress: Callable[..., None],
         address: str | None, n_workers: int | None, parts: int | None,
         tiles: bool = False) -> None:
    """``model.fit`` on one device, or on the cluster (``dev == "cluster"``); a fit that
    diverged or overflowed (FloatingPointError) ends the job with its message, before
    anything of the run is written."""
    from mgpu.distributed import connect

    try:
        if dev != "cluster":
            model.fit(*data, progress=progress)
        else:
            with connect(address, n_workers=n_workers) as client:
                click.echo(f"cluster: {describe(client)}")
                model.fit(*data, parts=parts, client=client, progress=progress)
                if tiles:
                    click.echo(tile_placement(client, model.tiles_))
    except FloatingPointError as exc:
        raise click.ClickException(f"{dev}: {exc}") from None


def _vocabulary(path: str, n_words: int, corpus: str) -> list[str]:
    """--vocab's words, refused unless there is one per column of the corpus: a list one
    line short (or long) names every topic's words wrongly, and plausibly."""
    words = read_words(path)
    if len(words) != n_words:
        raise click.BadParameter(
            f"{Path(path).name} holds {len(words):,} word(s) (non-empty lines) but "
            f"{Path(corpus).name} has {n_words:,} words (columns); give the corpus's own "
            "vocabulary, one word per line in column order.", param_hint="--vocab")
    return words


def cluster_jobs(group: click.Group = run) -> tuple[str, ...]:
    """The ``mgpu run`` jobs a batch script can run: those that take ``--address`` (the
    script passes its own scheduler), read from the commands themselves (hidden ones, old
    names kept for a while, left out)."""
    return tuple(sorted(name for name, cmd in group.commands.items() if not cmd.hidden
                        and any(p.name == "address" for p in cmd.params)))
