"""The ``mgpu`` command: info, run, bench."""
from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import platform
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import dask.config
import numpy as np

import mgpu

logger = logging.getLogger("mgpu.cli")

_VERSIONED = ("numpy", "scipy", "numba", "dask", "distributed", "dask-cuda", "cupy-cuda13x",
              "cupy-cuda12x", "cupy")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _fmt_bytes(n: float | None) -> str:
    if not n:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@click.group()
@click.version_option(mgpu.__version__, prog_name="mgpu")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def main(verbose: int) -> None:
    """mgpu: sparse machine-learning primitives on many GPUs and CPUs through Dask."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # Dask's cluster chatter (worker start/stop) only with -v; worker processes inherit this.
    dask_level = "info" if verbose else "warning"
    dask_level = os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", dask_level)
    dask.config.set({"logging.distributed": dask_level})
    logging.getLogger("distributed").setLevel(dask_level.upper())


@main.command()
@click.option("--address", default=None, help="Join this scheduler (or scheduler file) "
              "instead of starting an embedded cluster.")
@click.option("--start/--no-start", default=True, show_default=True,
              help="Start (or join) the cluster and list its workers.")
@click.option("--gpus/--no-gpus", default=None, help="Force or forbid GPU workers "
              "(default: GPU workers when GPUs are visible).")
def info(address: str | None, start: bool, gpus: bool | None) -> None:
    """Versions, the cluster mgpu starts or joins, and every worker's GPU or CPUs."""
    from mgpu.backends.loader import kernel_dir
    from mgpu.distributed import connect, describe_workers, visible_gpus

    click.echo(f"mgpu {mgpu.__version__}  (Python {platform.python_version()}, "
               f"{platform.system()} {platform.machine()})")
    for dist in _VERSIONED:
        v = _version(dist)
        if v is not None:
            click.echo(f"  {dist:<14} {v}")
    try:
        click.echo(f"  kernels        {kernel_dir()}")
    except FileNotFoundError as exc:
        click.echo(f"  kernels        MISSING: {exc}")
    n_gpus = visible_gpus()
    if address:
        click.echo(f"cluster: joins the scheduler at {address}")
    elif (gpus is None and n_gpus) or gpus:
        click.echo(f"cluster: embedded LocalCUDACluster, one worker per GPU ({n_gpus} visible)")
    else:
        click.echo(f"cluster: embedded LocalCluster on the CPU ({n_gpus} GPUs visible)")
    if not start:
        return
    t0 = time.perf_counter()
    with connect(address, gpus=gpus) as client:
        workers = describe_workers(client)
        click.echo(f"{len(workers)} worker(s), up in {time.perf_counter() - t0:.1f} s "
                   f"(scheduler {client.scheduler.address}):")
        for addr, w in workers.items():
            gpu = w.get("gpu")
            if gpu and "error" not in gpu:
                dev = (f"GPU {gpu['index']}: {gpu['name']}, {_fmt_bytes(gpu['memory'])}, "
                       f"{gpu['uuid']}")
            elif gpu:
                dev = f"GPU {gpu['index']}: unreadable ({gpu['error']})"
            else:
                dev = f"CPU: {w.get('cpus')} core(s)"
            click.echo(f"  {addr}  host={w['host']} pid={w['pid']} "
                       f"threads={w.get('nthreads', '?')} mem={_fmt_bytes(w.get('memory_limit'))}"
                       f"  {dev}")


@main.group()
def run() -> None:
    """End-to-end jobs on real data."""


def _parse_shape(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d[\d_]*)\s*[xX×,]\s*(\d[\d_]*)\s*", text)
    if not m:
        raise click.BadParameter(f"expected ROWSxCOLS such as 300000x100000, got {text!r}")
    return int(m.group(1).replace("_", "")), int(m.group(2).replace("_", ""))


def _load_input(path: str | None, powerlaw: str | None, nnz: float, seed: int) -> tuple[Any, str]:
    import scipy.sparse as sp

    if (path is None) == (powerlaw is None):
        raise click.UsageError("give either an input file (INPUT) or --powerlaw ROWSxCOLS")
    if powerlaw is not None:
        from mgpu.synthetic import powerlaw_csr

        m, n = _parse_shape(powerlaw)
        S = powerlaw_csr(m, n, int(nnz), seed=seed)
        return S, f"power-law {m:,} x {n:,} (seed {seed})"
    from mgpu import io

    try:
        data = io.load(path)
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc
    S = getattr(data, "matrix", data)
    if not sp.issparse(S):
        S = sp.csr_matrix(S)
    return S, Path(path).name


def _matrix_input(f: Any) -> Any:
    """The INPUT argument and the --powerlaw/--nnz/--seed options of the run jobs."""
    for deco in reversed((
        click.argument("input", required=False, type=click.Path(exists=True)),
        click.option("--powerlaw", default=None, metavar="ROWSxCOLS",
                     help="Generate a power-law matrix of this shape instead of reading INPUT."),
        click.option("--nnz", default=2e6, show_default=True, type=float,
                     help="Nonzeros drawn for --powerlaw."),
        click.option("--seed", default=0, show_default=True),
    )):
        f = deco(f)
    return f


def _workflow_placement(what: str, rows: str, data: str, both: str) -> Any:
    """The --device/--parts/--workers/--address options of the SDDMM + SpMM workflows
    (``run als``, ``run gap``): the embedded cluster by default, or one device in this
    process."""
    def wrap(f: Any) -> Any:
        for deco in reversed((
            click.option("--device", type=click.Choice(["cluster", "auto", "cpu", "gpu", "both"]),
                         default="cluster", show_default=True,
                         help=f"Where the SDDMM + SpMM {what} run: 'cluster', {rows} in row "
                         "tiles of equal nnz on the workers of the embedded cluster (GPU workers "
                         "when GPUs are visible) or of --address; or one device in this process, "
                         "without a cluster: auto (the GPU when one is visible), cpu, gpu, or "
                         f"both{both}."),
            click.option("--parts", default=None, type=int,
                         help=f"--device cluster: row tiles of {data} (default: one per "
                         "worker)."),
            click.option("--workers", "n_workers", default=None, type=int,
                         help="--device cluster: workers of the embedded cluster (default: "
                         "every GPU, or Dask's sizing on CPUs)."),
            click.option("--address", default=None, help="--device cluster: scheduler to join."),
        )):
            f = deco(f)
        return f

    return wrap


@run.command("partition")
@_matrix_input
@click.option("--parts", default=None, type=int, help="Chunks (default: one per worker).")
@click.option("--axis", type=click.Choice(["0", "1"]), default="0", show_default=True,
              help="0 cuts rows, 1 cuts columns.")
@click.option("--address", default=None, help="Scheduler to join (default: embedded cluster).")
@click.option("--gpus/--no-gpus", default=None, help="Force or forbid GPU workers.")
@click.option("--plot", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write a bar chart of nnz per chunk and worker to this PNG.")
def run_partition(input: str | None, powerlaw: str | None, nnz: float, seed: int,
                  parts: int | None, axis: str, address: str | None, gpus: bool | None,
                  plot: str | None) -> None:
    """Spread a sparse matrix over the cluster in nnz-balanced chunks and report the balance.

    INPUT is any file mgpu.io.load reads (Matrix Market, SNAP edge list, bag-of-words,
    MovieLens ratings, a 10x folder); or use --powerlaw. The chunks are checked by computing
    the row norms on the workers against the same computation done here.
    """
    from tqdm import tqdm

    from mgpu.distributed import chunk_nnz, chunk_workers, connect, describe_workers, from_scipy
    from mgpu.partition import imbalance

    if plot is not None:
        _need_matplotlib()
    t0 = time.perf_counter()
    S, label = _load_input(input, powerlaw, nnz, seed)
    click.echo(f"{label}: {S.shape[0]:,} x {S.shape[1]:,}, {S.nnz:,} nonzeros "
               f"(loaded in {time.perf_counter() - t0:.1f} s)")
    ax = int(axis)
    with connect(address, gpus=gpus) as client:
        infos = describe_workers(client)
        with tqdm(total=int(S.nnz), unit="nz", unit_scale=True, desc="placing chunks",
                  file=sys.stderr, disable=None) as bar:
            x = from_scipy(S, parts, axis=ax, client=client, progress=bar.update)
        per_chunk = chunk_nnz(x).ravel()
        where = chunk_workers(x, client)
        got = mgpu.row_norms(x, norm="l2").compute()
        if hasattr(got, "get"):
            got = got.get()
        want = mgpu.row_norms(S.tocsr(), norm="l2")
        err = float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-30), initial=0.0))
    bounds = np.concatenate([[0], np.cumsum(x.chunks[ax])])
    click.echo(f"{len(per_chunk)} chunk(s) along axis {ax} "
               f"({'rows' if ax == 0 else 'columns'}); nnz imbalance (max/mean) "
               f"{imbalance(per_chunk):.4f}")
    click.echo(f"{'chunk':>5} {'range':>23} {'nnz':>14} {'share':>7}  worker")
    total = max(int(per_chunk.sum()), 1)
    per_worker: dict[str, int] = {}
    for i, v in enumerate(per_chunk):
        idx = (i, 0) if ax == 0 else (0, i)
        w = where.get(idx, ("-",))[0]
        per_worker[w] = per_worker.get(w, 0) + int(v)
        click.echo(f"{i:>5} {f'{bounds[i]:,}-{bounds[i + 1]:,}':>23} {int(v):>14,} "
                   f"{100 * v / total:>6.2f}%  {w}")
    click.echo("per worker:")
    for w, v in sorted(per_worker.items()):
        gpu = (infos.get(w) or {}).get("gpu")
        dev = f"GPU {gpu.get('name', gpu.get('index'))}" if gpu else "CPU"
        click.echo(f"  {w:<24} {dev:<28} {v:>14,} nnz  {100 * v / total:6.2f}%")
    if per_worker:
        click.echo(f"worker imbalance (max/mean): {imbalance(np.array(list(per_worker.values()))):.4f}")
    click.echo(f"row-norm check on the workers: max relative error {err:.2e}")
    if err > 1e-5:
        raise click.ClickException(f"distributed row norms disagree with the local ones ({err:.2e})")
    if plot is not None:
        owners = [where.get((i, 0) if ax == 0 else (0, i), ("-",))[0]
                  for i in range(len(per_chunk))]
        _plot_chunks(per_chunk, x.chunks[ax], owners, label, "rows" if ax == 0 else "columns",
                     plot)
        click.echo(f"plot written to {plot}")


@run.command("knn-graph")
@_matrix_input
@click.option("-k", "--k", "k", default=10, show_default=True, type=int,
              help="Neighbours per row (the row itself excluded).")
@click.option("--metric", default="cosine", show_default=True,
              help="Any metric or alias of mgpu.ops.distances.SEMIRINGS.")
@click.option("--p", "p", default=2.0, show_default=True, type=float,
              help="Minkowski's exponent.")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False),
              help="Where to write the graph (scipy .npz, CSR: row i holds its k neighbours, "
              "distances as values).")
@click.option("--parts", default=None, type=int, help="Row tiles of the index (default: one "
              "per worker).")
@click.option("--address", default=None, help="Scheduler to join (default: embedded cluster).")
@click.option("--gpus/--no-gpus", default=None, help="Force or forbid GPU workers.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write histograms of the distances and of the in-degrees to this PNG.")
def run_knn_graph(input: str | None, powerlaw: str | None, nnz: float, seed: int, k: int,
                  metric: str, p: float, out_path: str, parts: int | None, address: str | None,
                  gpus: bool | None, plot: str | None) -> None:
    """The k-nearest-neighbour graph of a dataset's rows, computed on the cluster.

    INPUT is any file mgpu.io.load reads (bag-of-words, a 10x folder, MNIST IDX, ...). The
    index is spread over the workers in nnz-balanced row tiles; every row is queried against
    it and its own entry dropped, as scikit-learn's kneighbors_graph does.
    """
    import scipy.sparse as sp
    from tqdm import tqdm

    from mgpu.distributed import connect, from_scipy
    from mgpu.ops.distances import _check_input, _check_values, drop_self, resolve_metric

    try:
        ring, p = resolve_metric(metric, p, func="knn-graph")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--metric/--p") from None
    if plot is not None:
        _need_matplotlib()
    out = _npz_out(out_path, "the graph")
    t0 = time.perf_counter()
    S, label = _load_input(input, powerlaw, nnz, seed)
    S = sp.csr_matrix(S)
    try:
        S = _check_input(S, "INPUT", "knn-graph")
        _check_values(S, "INPUT", "knn-graph", ring)
    except (TypeError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    n = S.shape[0]
    if not 1 <= k < n:
        raise click.BadParameter(f"must be in [1, {n - 1}] for {n:,} rows", param_hint="--k")
    click.echo(f"{label}: {n:,} x {S.shape[1]:,}, {S.nnz:,} nonzeros "
               f"(loaded in {time.perf_counter() - t0:.1f} s); k={k}, metric {ring.name}")
    t0 = time.perf_counter()
    with connect(address, gpus=gpus) as client:
        X = from_scipy(S, parts, axis=0, client=client)
        with tqdm(total=n, unit="row", desc="neighbours", file=sys.stderr, disable=None) as bar:
            d, i = mgpu.knn(X, S, k + 1, metric=ring.name, p=p, progress=bar.update)
    d, i = drop_self(d, i, k)
    G = sp.csr_matrix((d.ravel(), i.ravel(), np.arange(0, n * k + 1, k)), shape=(n, n))
    tmp = out.with_name(out.name + ".partial.npz")
    sp.save_npz(tmp, G, compressed=True)
    tmp.replace(out)  # nothing half written under the final name
    indeg = np.bincount(i.ravel(), minlength=n)
    mutual = G.copy()
    mutual.data[:] = 1.0
    mutual = float(mutual.multiply(mutual.T).sum()) / max(G.nnz, 1)
    fin = d[np.isfinite(d)]
    q = np.quantile(fin, [0.0, 0.5, 0.9, 1.0]) if fin.size else [np.nan] * 4
    click.echo(f"graph: {n:,} nodes, {G.nnz:,} edges in {time.perf_counter() - t0:.1f} s, "
               f"written to {out}")
    click.echo(f"distances: min {q[0]:.4g}, median {q[1]:.4g}, 90% {q[2]:.4g}, max {q[3]:.4g}"
               + (f"; {d.size - fin.size:,} infinite" if fin.size < d.size else ""))
    click.echo(f"in-degree: mean {indeg.mean():.2f}, max {int(indeg.max())} (row "
               f"{int(indeg.argmax())}), {int((indeg == 0).sum()):,} rows nobody's neighbour; "
               f"mutual edges {mutual:.1%}")
    if plot is not None:
        _plot_knn_graph(fin, indeg, f"{label}: {k}-NN graph, {ring.name}", plot)
        click.echo(f"plot written to {plot}")


def _plot_knn_graph(dist: np.ndarray, indeg: np.ndarray, title: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


def _mf_cluster(modes: list[str], address: str | None, cpu_threads: int | None) -> Any:
    """The cluster the modes need: none (sequential alone), a CPU cluster (cpu), GPU workers
    (gpu), or GPU workers and a CPU worker of ``cpu_threads`` threads (the hsgd modes; default
    one thread per core not driving a GPU)."""
    from mgpu.mf.model import GPU_MODES, MIXED_MODES
    from mgpu.distributed.cluster import connect, visible_gpus

    if all(m == "sequential" for m in modes):
        return None
    if address is not None:
        return connect(address)
    if not any(m in GPU_MODES for m in modes):
        return connect(gpus=False)
    n_gpus = visible_gpus()
    if n_gpus == 0:
        raise click.UsageError(f"modes {', '.join(m for m in modes if m in GPU_MODES)} run on "
                               "GPU workers and no GPU is visible; use sequential and cpu, or "
                               "--address a cluster with GPU workers.")
    if any(m in MIXED_MODES for m in modes):
        threads = cpu_threads or max(1, (os.cpu_count() or 1) - n_gpus)
        return connect(gpus=True, cpu_threads=threads)
    return connect(gpus=True)


def _mf_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The training options shared by run mf and bench mf."""
    from mgpu.mf import MODES

    for opt in reversed([
        click.option("--modes", default="sequential,cpu", show_default=True,
                     help=f"Comma-separated modes of mgpu.MatrixFactorization ({', '.join(MODES)})."),
        click.option("-k", "--k", "k", default=128, show_default=True, type=int),
        click.option("--lr", default=0.005, show_default=True, type=float, help="Learning rate γ."),
        click.option("--reg", default=0.05, show_default=True, type=float,
                     help="Regularisation λ."),
        click.option("--epochs", default=80, show_default=True, type=int),
        click.option("--target-rmse", default=None, type=float,
                     help="Stop a mode once its test RMSE reaches this (default: 0.98 for a "
                     "ratings file, 1.2 × the noise for --synthetic; 0 runs every epoch)."),
        click.option("--test-fraction", default=0.1, show_default=True, type=float,
                     help="Share of the ratings held out at random for the test RMSE."),
        click.option("--seed", default=0, show_default=True),
        click.option("--address", default=None,
                     help="Scheduler to join (default: embedded cluster)."),
        click.option("--cpu-threads", default=None, type=int,
                     help="Threads of the CPU worker started beside the GPU workers for the "
                     "hsgd modes (default: the cores not driving a GPU)."),
        click.option("--plot", type=click.Path(dir_okay=False), default=None,
                     help="Write test RMSE against time for every mode to this PNG."),
        click.option("--one-cluster", is_flag=True, default=False,
                     help="Run every mode on one embedded cluster (default: a fresh one per "
                     "mode, so that no mode runs on what an earlier one left; with "
                     "--address, always the one given)."),
    ]):
        f = opt(f)
    return f


def _mf_train(R: Any, label: str, modes: str, k: int, lr: float, reg: float, epochs: int,
              target_rmse: float, test_fraction: float, seed: int, address: str | None,
              cpu_threads: int | None, plot: str | None, one_cluster: bool = False
              ) -> dict[str, Any]:
    """Split R, train every mode from one start with progress bars, report, plot.

    Without ``address`` or ``one_cluster``, each mode that needs a cluster gets a fresh
    embedded one of the same shape: on one cluster the `cpu` mode ran 11.5–14.3 s to the
    target after GPU modes against 8.7 s first (planted 1e7 ratings, one H100, 12 threads)."""
    from tqdm import tqdm

    from mgpu.bench.mf import train_modes
    from mgpu.mf import MODES, split_ratings

    names = [m.strip() for m in modes.split(",") if m.strip()]
    bad = [m for m in names if m not in MODES]
    if bad or not names:
        raise click.BadParameter(f"modes must be among {', '.join(MODES)}; got {modes!r}",
                                 param_hint="--modes")
    if not 0 < test_fraction < 1:
        raise click.BadParameter("must be in (0, 1)", param_hint="--test-fraction")
    if cpu_threads is not None and cpu_threads < 1:
        raise click.BadParameter("must be >= 1", param_hint="--cpu-threads")
    if plot is not None:
        _need_matplotlib()
    try:
        train, test = split_ratings(R.tocoo(), test_fraction, seed)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{label}: {R.shape[0]:,} users x {R.shape[1]:,} items, {train.nnz:,} training "
               f"and {test.nnz:,} test ratings; k={k}, lr={lr}, reg={reg}")
    fresh = address is None and not one_cluster and len(names) > 1
    client = None if fresh else _mf_cluster(names, address, cpu_threads)
    if client is not None:
        click.echo(f"cluster: {_describe(client)}")
    bars: list[Any] = []

    @contextlib.contextmanager
    def cluster(mode: str) -> Iterator[None]:
        """A fresh cluster around one mode's fit, where each mode gets its own."""
        own = _mf_cluster(names, None, cpu_threads) if fresh and mode != "sequential" else None
        try:
            if own is not None:
                click.echo(f"{mode}: on a fresh cluster, {_describe(own)}")
            yield
        finally:
            if own is not None:
                own.close()

    def progress(mode: str) -> Callable[[dict[str, Any]], None]:
        bar = tqdm(total=epochs, unit="epoch", desc=mode, file=sys.stderr, disable=None)
        bars.append(bar)

        def tick(entry: dict[str, Any]) -> None:
            bar.set_postfix(test_rmse=f"{entry['test_rmse']:.4f}")
            bar.update(1)
        return tick

    def report(mode: str, mf: Any) -> None:
        bars[-1].close()
        h = mf.history_
        events = getattr(mf, "schedule_events_", None)
        if events:
            click.echo(f"{mode}: {_placement(events)}")
        reached = next((e for e in h if target_rmse and e["test_rmse"] <= target_rmse), None)
        click.echo(f"{mode}: {len(h)} epochs in {h[-1]['seconds']:.1f} s, test RMSE "
                   f"{h[-1]['test_rmse']:.4f}" + (
                       f"; reached {target_rmse} at epoch {reached['epoch']} after "
                       f"{reached['seconds']:.1f} s" if reached else
                       (f"; did not reach {target_rmse}" if target_rmse else "")))

    try:
        mfs = train_modes(train, test, names, k=k, lr=lr, reg=reg, epochs=epochs,
                          target_rmse=target_rmse or None, seed=seed, callback=progress,
                          done=report, cluster=cluster)
    except (FloatingPointError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        for bar in bars:
            bar.close()
        if client is not None:
            client.close()
    if plot is not None:
        _plot_rmse({m: mf.history_ for m, mf in mfs.items()}, target_rmse, f"{label}, k={k}",
                   plot)
        click.echo(f"plot written to {plot}")
    return mfs


@run.command("mf")
@click.argument("ratings", type=click.Path(exists=True, dir_okay=False))
@_mf_options
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder for the factors (<mode>-factors.npz) and history.json.")
def run_mf(ratings: str, modes: str, k: int, lr: float, reg: float, epochs: int,
           target_rmse: float | None, test_fraction: float, seed: int, address: str | None,
           cpu_threads: int | None, plot: str | None, one_cluster: bool, out_dir: str) -> None:
    """Train SGD matrix factorisation on a ratings file in several modes and compare them.

    RATINGS is a MovieLens file (ratings.csv, ratings.dat or u.data, gzip or not). A random
    share is held out; every mode trains on the rest from the same start and reports RMSE per
    epoch. Factors go to OUT as <mode>-factors.npz (P, Q, the original user/item ids, and
    ``mean``, ``rated_users``, ``rated_items``: a user or item without a training rating is
    predicted the training mean).
    """
    import json

    from mgpu.io import load_ratings

    try:
        data = load_ratings(ratings)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = 0.98 if target_rmse is None else target_rmse
    mfs = _mf_train(data.matrix, Path(ratings).name, modes, k, lr, reg, epochs, target,
                    test_fraction, seed, address, cpu_threads, plot, one_cluster)
    for mode, mf in mfs.items():
        tmp = out / f"{mode}-factors.partial.npz"
        np.savez(tmp, P=mf.P_, Q=mf.Q_, user_ids=data.user_ids, item_ids=data.item_ids,
                 mean=mf.mean_, rated_users=mf.rated_users_, rated_items=mf.rated_items_)
        tmp.replace(out / f"{mode}-factors.npz")
    (out / "history.json").write_text(json.dumps({m: mf.history_ for m, mf in mfs.items()},
                                                 indent=1))
    click.echo(f"factors and history written to {out}")


@main.command("calibrate")
@click.argument("ratings", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("-k", "--k", "k", default=128, show_default=True, type=int)
@click.option("--max-ratings", default=4_000_000, show_default=True, type=int,
              help="Ratings of the shuffled sample whose prefixes are timed.")
@click.option("--repeats", default=3, show_default=True, type=int)
@click.option("--address", default=None, help="Scheduler to join (default: embedded cluster).")
@click.option("--show", is_flag=True, help="Print the cached calibrations and measure nothing.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write the measurements and both models' curves to this PNG.")
@click.option("--cpu-threads", default=1, show_default=True, type=int,
              help="CPU blocks timed at once: the CPU slots the training runs will use "
                   "(mgpu bench mf --cpu-threads).")
def calibrate_cmd(ratings: str | None, k: int, max_ratings: int, repeats: int,
                  address: str | None, show: bool, plot: str | None, cpu_threads: int) -> None:
    """Calibrate HSGD*'s cost model on this cluster's CPU and GPU workers, and cache it.

    Times block calls on growing prefixes of a shuffled sample of RATINGS (default: planted
    ratings of Netflix's shape) on --cpu-threads CPU threads at once and on one GPU, fits the
    thesis's curves and Qilin's lines, and caches them (mgpu.mf.calibration-cache) for this
    GPU model, CPU model and thread count, k, GPU options and block size, where
    MatrixFactorization's cost-model modes find them. The sample is one column stratum of
    the division HSGD* makes of RATINGS on these slots, so a fit on these ratings (or a
    split of them) on the same slots finds it.
    """
    from mgpu.distributed import describe_workers
    from mgpu.io import load_ratings
    from mgpu.mf.calibration import _cache_path, block_window, cached_all, calibrate, store
    from mgpu.mf.division import columns
    from mgpu.mf.model import gpu_options
    from mgpu.synthetic import planted_ratings

    if show:
        entries = cached_all()
        if not entries:
            raise click.ClickException(f"no calibration cached yet ({_cache_path()}); run "
                                       "mgpu calibrate")
        for cal in entries.values():
            click.echo(cal.describe() + "\n")
        return
    if k < 1 or max_ratings < 2 or repeats < 1 or cpu_threads < 1:
        raise click.BadParameter("-k, --repeats and --cpu-threads must be >= 1, --max-ratings "
                                 ">= 2")
    if plot is not None:
        _need_matplotlib()
    if ratings is not None:
        try:
            C = load_ratings(ratings).matrix.tocoo()
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        label = Path(ratings).name
    else:
        C = planted_ratings(480_189, 17_770, max_ratings, seed=0)
        label = "planted ratings 480,189×17,770"
    from mgpu.distributed.cluster import connect, visible_gpus

    if address is not None:
        client = connect(address)
    elif visible_gpus():  # a GPU worker and a CPU worker
        client = connect(gpus=True, cpu_threads=cpu_threads)
    else:
        client = connect(gpus=False, n_workers=1)
    try:
        infos = describe_workers(client)
        gpu = next((a for a, i in infos.items() if i.get("gpu") and "error" not in i["gpu"]),
                   None)
        cpu = next((a for a, i in infos.items() if not i.get("gpu")), None)
        window = block_window(C.row, C.col, C.shape,
                              columns(int(gpu is not None), cpu_threads if cpu else 0),
                              want=min(max_ratings, 1 << 16))
        click.echo(f"{label}: {C.nnz:,} ratings; timing blocks of {window.n_items:,} items, "
                   f"{window.per_user:.3g} ratings per user on CPU worker {cpu or '(none)'} and "
                   f"GPU worker {gpu or '(none)'}")
        cal = calibrate(client, C.row, C.col, C.data, k, cpu_worker=cpu, gpu_worker=gpu,
                        gpu_kw=gpu_options(), max_ratings=max_ratings, repeats=repeats,
                        cpu_threads=cpu_threads, window=window)
    finally:
        client.close()
    click.echo(cal.describe())
    click.echo(f"cached in {store(cal)}")
    if plot is not None:
        _plot_calibration(cal, plot)
        click.echo(f"plot written to {plot}")


def _plot_calibration(cal: Any, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


def _placement(events: list[Any]) -> str:
    """Where the block scheduler ran the blocks: runs and steals per worker and kind of slot
    (a worker's GPU, or its CPU threads), so that an idle GPU worker shows."""
    runs: dict[tuple[str, str], list[int]] = {}
    for ev in events:
        if ev.kind in ("assign", "steal"):
            worker, _, slot = ev.slot.rpartition("#")
            kind = "GPU" if slot == "gpu" else "CPU"
            runs.setdefault((kind, worker), [0, 0])[ev.kind == "steal"] += 1
    return "; ".join(f"{n + st} block runs on the {kind} slot(s) of {worker} ({st} stolen)"
                     for (kind, worker), (n, st) in sorted(runs.items()))


def _plot_rmse(histories: dict[str, list[dict[str, Any]]], target: float, title: str,
               path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


def _npz_out(out_path: str, what: str) -> Path:
    """The --out path of a job that writes a scipy .npz, checked before any work."""
    out = Path(out_path)
    if out.suffix != ".npz":
        raise click.BadParameter(f"{what} is written as scipy .npz: give a path ending in "
                                 ".npz", param_hint="--out")
    if not out.parent.exists():
        raise click.BadParameter(f"folder {out.parent} does not exist", param_hint="--out")
    return out


def _devices(device: str) -> list[str]:
    """The devices a --device auto|cpu|gpu|both option asks for, refused when absent."""
    from mgpu.distributed.cluster import visible_gpus

    have = visible_gpus() > 0
    devices = {"auto": ["gpu" if have else "cpu"], "both": ["cpu", "gpu"]}.get(device, [device])
    if "gpu" in devices and not have:
        raise click.BadParameter("no GPU is visible on this machine", param_hint="--device")
    return devices


def _cluster_or_devices(device: str, parts: int | None, n_workers: int | None,
                        address: str | None) -> list[str]:
    """``["cluster"]`` for --device cluster, else the one-device runs :func:`_devices` asks
    for; refuses the cluster's options (--parts, --workers, --address) without a cluster."""
    if device != "cluster" and (parts is not None or n_workers is not None or address):
        raise click.BadParameter("--parts, --workers and --address go with --device cluster "
                                 "(the default)", param_hint="--device")
    for name, v in (("--parts", parts), ("--workers", n_workers)):
        if v is not None and v < 1:
            raise click.BadParameter(f"must be >= 1, got {v}", param_hint=name)
    return ["cluster"] if device == "cluster" else _devices(device)


def _describe(client: Any) -> str:
    """'2 GPU worker(s)' or '4 CPU worker(s)' (or both) for a client's cluster."""
    from mgpu.distributed import describe_workers

    infos = describe_workers(client).values()
    n_gpu = sum(1 for i in infos if i.get("gpu"))
    kinds = [f"{n} {kind} worker(s)" for n, kind in ((n_gpu, "GPU"), (len(infos) - n_gpu, "CPU"))
             if n]
    return ", ".join(kinds) or "no workers"


def _tile_placement(client: Any, tiles: list[dict[str, Any]]) -> str:
    """Lines saying which worker (and which GPU, by UUID) holds each row tile, so that a job
    that left a GPU idle, or two workers on one GPU, shows it."""
    from mgpu.distributed import describe_workers

    infos = describe_workers(client)
    lines = []
    for i, t in enumerate(tiles):
        info = infos.get(t["worker"])
        gpu = info and info.get("gpu")
        on = ("worker gone" if info is None else "CPU" if not gpu
              else gpu.get("uuid", f"GPU {gpu.get('index')}"))
        lines.append(f"  tile {i}: {t['rows']:,} rows, {t['nnz']:,} nonzeros on {t['worker']} "
                     f"({on})")
    return "row tiles:\n" + "\n".join(lines)


def _need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise click.ClickException("--plot needs matplotlib: pip install 'mgpu[plot]'") from exc


def _plot_chunks(per_chunk: np.ndarray, sizes: tuple[int, ...], workers: list[str], title: str,
                 unit: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
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


@main.group()
def slurm() -> None:
    """SLURM: batch scripts that run mgpu jobs on a Dask cluster inside one allocation."""


@slurm.command("script", context_settings={"ignore_unknown_options": True})
@click.argument("workflow", nargs=-1, type=click.UNPROCESSED, required=True)
@click.option("--nodes", default=1, show_default=True, type=int)
@click.option("--gpus-per-node", default=0, show_default=True, type=int,
              help="GPUs per node (--gres=gpu:N), one dask-cuda worker each; 0 for CPU workers.")
@click.option("--workers-per-node", default=None, type=int,
              help="CPU workers per node (default 1; with GPUs, one per GPU).")
@click.option("--cpus-per-worker", default=4, show_default=True, type=int)
@click.option("--mem", default="16G", show_default=True, help="--mem per node.")
@click.option("--time", "time_limit", default="01:00:00", show_default=True)
@click.option("--shared-dir", default=".", show_default=True,
              help="A folder every node sees (the scheduler file goes there).")
@click.option("--log-dir", default=None, help="Where the job's output goes (default: "
              "--shared-dir).")
@click.option("--job-name", default="mgpu", show_default=True)
@click.option("--wait", default=300, show_default=True, type=int,
              help="Seconds any start-up wait may take.")
@click.option("--partition", default=None)
@click.option("--account", default=None)
def slurm_script_cmd(workflow: tuple[str, ...], nodes: int, gpus_per_node: int,
                     workers_per_node: int | None, cpus_per_worker: int, mem: str,
                     time_limit: str, shared_dir: str, log_dir: str | None, job_name: str,
                     wait: int, partition: str | None, account: str | None) -> None:
    """Print the batch script that runs WORKFLOW (an `mgpu run` job, e.g. `-- run jaccard
    graph.txt.gz --out j.npz`) on a scheduler and workers started inside the job.

    Submit it with `sbatch`: it starts the scheduler on the first node, one worker per GPU
    (or CPU workers) with srun, waits for all of them with a timeout, runs the job against
    them and shuts everything down, whatever the job's outcome.
    """
    from mgpu.deploy import slurm_script

    try:
        text = slurm_script(list(workflow), nodes=nodes, gpus_per_node=gpus_per_node,
                            workers_per_node=workers_per_node, cpus_per_worker=cpus_per_worker,
                            mem=mem, time=time_limit,
                            shared_dir=str(Path(shared_dir).resolve()),
                            log_dir=str(Path(log_dir).resolve()) if log_dir else None,
                            job_name=job_name, wait=wait, partition=partition,
                            account=account)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(text, nl=False)


@main.group()
def bench() -> None:
    """Benchmarks (the current results are in docs/benchmarks.md)."""


# Real datasets the partition benchmark reads, relative to the data folder.
_PARTITION_SETS = (
    "graphs/facebook_combined.txt.gz",
    "graphs/email-Enron.txt.gz",
    "graphs/ca-HepPh.txt.gz",
    "graphs/p2p-Gnutella31.txt.gz",
    "graphs/soc-Slashdot0902.txt.gz",
    "bow/ap.dat.gz",
    "matrices/memplus.mtx.gz",
    "matrices/bcsstk13.mtx.gz",
    "matrices/s3rmt3m3.mtx.gz",
    "ratings/ml-latest-small-2016_ratings.csv.gz",
    "singlecell/visium_mouse_spaceranger3",
)


@bench.command("partition")
@click.option("--data", "data_dir", type=click.Path(exists=True, file_okay=False),
              default=None, help="Folder of the real datasets (default: ../shared/data or "
              "$MGPU_DATA).")
@click.option("--parts", default="4,16", show_default=True, help="Comma-separated part counts.")
def bench_partition(data_dir: str | None, parts: str) -> None:
    """nnz imbalance of row and column splits of the real datasets (a Markdown table).

    The bound column is 1 + w/(nnz/P), with w the largest row/column: the most that a split
    whose parts differ by at most w (as mgpu's do) can be off.
    """
    from mgpu import io
    from mgpu.partition import axis_counts, imbalance, part_sums, split_counts

    root = _data_root(data_dir)
    if not root.is_dir():
        raise click.ClickException(f"no data folder at {root}; pass --data")
    ps = _parse_ints(parts, "--parts")
    click.echo("| dataset | shape | nnz | axis | P | max w | nnz/P | imbalance | "
               "1 + w/(nnz/P) | split ms |")
    click.echo("|---|---|---|---|---|---|---|---|---|---|")
    for rel in _PARTITION_SETS:
        path = root / rel
        if not path.exists():
            click.echo(f"| {rel} | missing | | | | | | | | |")
            continue
        data = io.load(str(path))
        S = getattr(data, "matrix", data)
        for axis in (0, 1):
            counts = axis_counts(S, axis)
            w = int(counts.max(initial=0))
            for p in ps:
                t = time.perf_counter()
                b = split_counts(counts, p)
                ms = 1e3 * (time.perf_counter() - t)
                imb = imbalance(part_sums(counts, b))
                mean = S.nnz / p
                click.echo(f"| {Path(rel).name} | {S.shape[0]:,}×{S.shape[1]:,} | {S.nnz:,} | "
                           f"{'rows' if axis == 0 else 'cols'} | {p} | {w:,} | {mean:,.0f} | "
                           f"{imb:.4f} | {1 + w / mean:.4f} | {ms:.1f} |")


# Real matrices the SDDMM benchmark runs on, relative to the data folder.
_SDDMM_SETS = (
    "bow/ap.dat.gz",
    "singlecell/visium_mouse_spaceranger3",
    "graphs/soc-Slashdot0902.txt.gz",
    "graphs/email-Enron.txt.gz",
)


def _data_root(data_dir: str | None) -> Path:
    return Path(data_dir or os.environ.get("MGPU_DATA") or Path.cwd().parent / "shared" / "data")


@bench.command("sddmm")
@click.option("--data", "data_dir", type=click.Path(file_okay=False), default=None,
              help="Folder of the real datasets (default: ../shared/data or $MGPU_DATA); "
              "missing ones are skipped.")
@click.option("--powerlaw", default="300000x100000", show_default=True, metavar="ROWSxCOLS",
              help="Shape of the synthetic power-law matrix ('none' to skip).")
@click.option("--nnz", default=6e7, show_default=True, type=float,
              help="Nonzeros drawn for --powerlaw (repeats merge, so somewhat fewer remain).")
@click.option("--k", "ks", default="32,128,512", show_default=True, help="Values of K.")
@click.option("--device", type=click.Choice(["auto", "cpu", "gpu"]), default="auto",
              show_default=True, help="Where to run (auto: the GPU when one is visible).")
@click.option("--repeats", default=None, type=int, help="Timed repeats (median reported).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write every measurement to this JSON file.")
def bench_sddmm(data_dir: str | None, powerlaw: str, nnz: float, ks: str, device: str,
                repeats: int | None, json_path: str | None) -> None:
    """SDDMM GFLOP/s of mgpu and its peers on real and power-law matrices, one run."""
    import json

    from tqdm import tqdm

    from mgpu import io
    from mgpu.bench import sddmm as b
    from mgpu.distributed import visible_gpus
    from mgpu.synthetic import powerlaw_csr

    Ks = _parse_ints(ks, "--k")
    on_gpu = device == "gpu" or (device == "auto" and visible_gpus() > 0)
    sets: list[tuple[str, Any]] = []
    root = _data_root(data_dir)
    for rel in _SDDMM_SETS:
        if (root / rel).exists():
            data = io.load(str(root / rel))
            sets.append((Path(rel).name, getattr(data, "matrix", data)))
    if powerlaw.lower() != "none":
        m, n = _parse_shape(powerlaw)
        t0 = time.perf_counter()
        S = powerlaw_csr(m, n, int(nnz), seed=0)
        click.echo(f"power-law {m:,} x {n:,}: {S.nnz:,} nonzeros, density {S.nnz / m / n:.4%}, "
                   f"longest row {int(np.diff(S.indptr).max()):,} "
                   f"(generated in {time.perf_counter() - t0:.0f} s)")
        sets.append((f"power-law {m:,}×{n:,}", S))
    results = []
    for label, S in tqdm(sets, desc="matrices", file=sys.stderr, disable=None):
        S = S.tocsr().astype(np.float32)
        S.sum_duplicates()
        if on_gpu:
            rows = b.bench_gpu(S, Ks, repeats=repeats or 10)
        else:
            rows = b.bench_cpu(S, Ks, repeats=repeats or 3)
        for r in rows:
            r["matrix"] = label
        results.extend(rows)
        click.echo(b.markdown(rows, label))
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=1))
        click.echo(f"measurements written to {json_path}")


@bench.command("sddmm-stream")
@click.option("--shape", default="17000000x17000000", show_default=True, metavar="ROWSxCOLS",
              help="S's shape (A has ROWS rows, B COLS rows).")
@click.option("--row-nnz", default=12, show_default=True, type=int,
              help="Nonzeros in every row of S.")
@click.option("--k", "K", default=640, show_default=True, type=int, help="Columns of A and B.")
@click.option("--working-memory", default=None,
              help="Device bytes for the tiles (default: 80% of what the GPU has available).")
@click.option("--cpu/--no-cpu", "cpu_peer", default=True, show_default=True,
              help="Also run mgpu's CPU backend on the same operands.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the measurement to this JSON file.")
def bench_sddmm_stream(shape: str, row_nnz: int, K: int, working_memory: str | None,
                       cpu_peer: bool, json_path: str | None) -> None:
    """SDDMM of host operands larger than the GPU, streamed through it in tiles.

    The defaults make float32 operands of about 89 GB (A and B 43.5 GB each), more than an
    80 GB GPU holds; the host needs about 95 GB free.
    """
    import json

    from tqdm import tqdm

    from mgpu.bench import sddmm as b
    from mgpu.distributed import visible_gpus

    if visible_gpus() == 0:
        raise click.ClickException("mgpu bench sddmm-stream needs a visible GPU.")
    m, n = _parse_shape(shape)
    t0 = time.perf_counter()
    S, A, B = b.stream_operands(m, n, row_nnz, K)
    inputs = A.nbytes + B.nbytes + S.data.nbytes + S.indices.nbytes + S.indptr.nbytes
    click.echo(f"S {m:,}×{n:,} with {S.nnz:,} nonzeros, K={K}: {inputs / 1e9:.1f} GB of "
               f"operands (made in {time.perf_counter() - t0:.0f} s)")
    with tqdm(total=S.nnz, desc="streamed SDDMM", unit="nz", unit_scale=True, file=sys.stderr,
              disable=None) as bar:
        row = b.bench_streamed(S, A, B, working_memory=working_memory, cpu_peer=False,
                               progress=bar.update)
    click.echo(
        f"GPU: {row['device_bytes'] / 2**30:.1f} GiB ({row['device_available'] / 2**30:.1f} "
        f"available); operands {row['input_bytes'] / 2**30:.1f} GiB; budget "
        f"{row['budget'] / 2**30:.1f} GiB: {row['panels']} panel(s) of B × {row['blocks']} "
        f"block(s) of S\n"
        f"streamed: {row['gpu_s']:.2f} s ({row['gpu_gflops']:.1f} GFLOP/s, "
        f"{row['bus_bytes'] / row['gpu_s'] / 1e9:.1f} GB/s of operands to the device), "
        f"max rel err {row['max_rel_err']:.1e} against float64")
    if row.get("streamed_s"):
        click.echo(f"  of which {row['to_device_s']:.2f} s copying to the device, "
                   f"{row['kernel_s']:.2f} s in the kernel and back, "
                   f"{row['streamed_s'] - row['to_device_s'] - row['kernel_s']:.2f} s cutting "
                   f"tiles on the host, {row['gpu_s'] - row['streamed_s']:.2f} s checking "
                   "the operands")
    if cpu_peer:
        row.update(b.run_cpu_peer(S, A, B, row["gpu_s"]))
        click.echo(f"CPU backend: {row['cpu_s']:.2f} s; streamed GPU {row['speedup_vs_cpu']:.2f}× "
                   f"(max rel err {row['cpu_max_rel_err']:.1e} against float64)")
    if json_path:
        Path(json_path).write_text(json.dumps(row, indent=1))
        click.echo(f"measurement written to {json_path}")


def _corpus(input: str | None, corpus: str, density: float, dense: bool = False
            ) -> tuple[Any, str]:
    """The kNN benchmarks' data: INPUT's rows (a 10x folder: spots × genes) or a power-law
    corpus (the peer timings' generator), float64, empty rows dropped (they have no cosine
    neighbours)."""
    import scipy.sparse as sp

    from mgpu.synthetic import powerlaw_corpus

    if input is not None:
        from mgpu import io

        data = io.load(input)
        if hasattr(data, "matrix"):  # 10x: features × barcodes
            data = data.matrix.T
        X = data.reshape(data.shape[0], -1) if isinstance(data, np.ndarray) else data
        X = np.asarray(X, dtype=np.float64) if dense and isinstance(X, np.ndarray) else X
        X = X.toarray() if dense and sp.issparse(X) else X
        if not dense:
            X = sp.csr_matrix(X, dtype=np.float64)
        label = Path(input).name + (" (dense)" if dense else "")
    else:
        n_docs, n_terms = _parse_shape(corpus)
        X = powerlaw_corpus(n_docs, n_terms, density, seed=0).astype(np.float64)
        label = f"power-law {n_docs:,}×{n_terms:,}"
    keep = np.flatnonzero(np.count_nonzero(X, axis=1) if isinstance(X, np.ndarray)
                          else np.diff(X.indptr))
    return X[keep], label


@bench.command("knn")
@click.argument("input", required=False, type=click.Path(exists=True))
@click.option("--corpus", default="100000x50000", show_default=True, metavar="DOCSxTERMS",
              help="Shape of the synthetic power-law corpus (without INPUT).")
@click.option("--density", default=0.002, show_default=True, type=float,
              help="Density of the corpus.")
@click.option("--dense", is_flag=True, help="Run INPUT as dense vectors (e.g. MNIST).")
@click.option("--queries", "n_queries", default=2000, show_default=True, type=int,
              help="Queries (the corpus's first rows).")
@click.option("-k", "--k", "k", default=10, show_default=True, type=int)
@click.option("--metrics", default="cosine,euclidean,manhattan", show_default=True,
              help="Comma-separated metrics.")
@click.option("--device", type=click.Choice(["cpu", "gpu"]), default="cpu", show_default=True,
              help="cpu: mgpu's CPU path against scikit-learn; gpu: mgpu's kernels (float32) "
              "against the cuSPARSE routes, the naive union kernel and scikit-learn.")
@click.option("--sklearn-queries", default=1000, show_default=True, type=int,
              help="GPU runs: queries timed through scikit-learn (a tenth for NAMM metrics).")
@click.option("--repeats", default=1, show_default=True, type=int, help="Timed runs (median).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write every measurement to this JSON file.")
def bench_knn(input: str | None, corpus: str, density: float, dense: bool, n_queries: int,
              k: int, metrics: str, device: str, sklearn_queries: int, repeats: int,
              json_path: str | None) -> None:
    """Exact kNN queries/s of mgpu and its peers on one corpus, one run.

    INPUT is any file mgpu.io.load reads (a 10x folder gives spots × genes); without it a
    power-law corpus of --corpus/--density is generated (the peer timings' generator).
    """
    import json

    from mgpu.bench import knn as b
    from mgpu.ops.distances import resolve_metric

    names = [m.strip() for m in metrics.split(",") if m.strip()]
    for m in names:
        try:
            resolve_metric(m, 2, func="bench knn")
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--metrics") from None
    t0 = time.perf_counter()
    X, label = _corpus(input, corpus, density, dense)
    n_docs = X.shape[0]
    if not 1 <= k <= n_docs or not 1 <= n_queries:
        raise click.BadParameter(f"-k must be in [1, {n_docs}] and --queries >= 1")
    n_queries = min(n_queries, n_docs)
    nnz = np.count_nonzero(X) if isinstance(X, np.ndarray) else X.nnz
    click.echo(f"{label}: {X.shape[0]:,}×{X.shape[1]:,}, {nnz:,} nonzeros (ready in "
               f"{time.perf_counter() - t0:.1f} s), {n_queries:,} queries, k={k}, "
               f"{os.cpu_count()} CPU cores")
    if device == "gpu":
        rows = b.bench_gpu(X, X[:n_queries], k, tuple(names), sklearn_queries=sklearn_queries,
                           repeats=max(repeats, 3))
        click.echo(b.markdown_gpu(rows, label))
    else:
        rows = b.bench_cpu(X, X[:n_queries], k, tuple(names), repeats=repeats)
        click.echo(b.markdown(rows, label))
    for r in rows:
        r["corpus"] = label
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))
        click.echo(f"measurements written to {json_path}")


@bench.command("knn-scaling")
@click.argument("input", required=False, type=click.Path(exists=True))
@click.option("--corpus", default="300000x100000", show_default=True, metavar="DOCSxTERMS",
              help="Shape of the synthetic power-law corpus (without INPUT).")
@click.option("--density", default=0.002, show_default=True, type=float,
              help="Density of the corpus.")
@click.option("--queries", "n_queries", default=16384, show_default=True, type=int,
              help="Queries (the corpus's first rows).")
@click.option("-k", "--k", "k", default=10, show_default=True, type=int)
@click.option("--metric", default="cosine", show_default=True)
@click.option("--workers", default="1,2,4", show_default=True,
              help="Comma-separated worker counts (GPUs, on a GPU machine).")
@click.option("--tiles-per-worker", default=1, show_default=True, type=int,
              help="Row tiles of the index per worker.")
@click.option("--device", type=click.Choice(["auto", "cpu", "gpu"]), default="auto",
              show_default=True, help="Worker kind (auto: GPU workers when GPUs are visible).")
@click.option("--repeats", default=3, show_default=True, type=int, help="Timed calls (median).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write every measurement to this JSON file.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG of speedup against workers.")
def bench_knn_scaling(input: str | None, corpus: str, density: float, n_queries: int, k: int,
                      metric: str, workers: str, tiles_per_worker: int, device: str,
                      repeats: int, json_path: str | None, plot: str | None) -> None:
    """Distributed exact kNN on 1, 2, 4, … workers with the index resident on them.

    Reports queries/s of the public call on the dask index, the speedup against one worker,
    the nnz imbalance of the tiles and whether every worker count returns the ids of the
    one-device call, all from one run.
    """
    import json

    from mgpu.bench import knn as b
    from mgpu.ops.distances import resolve_metric

    try:
        ring, _ = resolve_metric(metric, 2, func="bench knn-scaling")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--metric") from None
    counts = _worker_counts(workers, device)
    for name, v in (("-k", k), ("--queries", n_queries), ("--tiles-per-worker", tiles_per_worker),
                    ("--repeats", repeats)):
        if v < 1:
            raise click.BadParameter(f"must be >= 1, got {v}", param_hint=name)
    if plot is not None:
        _need_matplotlib()
    t0 = time.perf_counter()
    X, label = _corpus(input, corpus, density)
    if k > X.shape[0]:
        raise click.BadParameter(f"must be at most the {X.shape[0]:,} rows", param_hint="-k")
    Q = X[: min(n_queries, X.shape[0])]
    click.echo(f"{label}: {X.shape[0]:,}×{X.shape[1]:,}, {X.nnz:,} nonzeros (ready in "
               f"{time.perf_counter() - t0:.0f} s), {Q.shape[0]:,} queries, k={k}, {ring.name}")
    gpus = {"auto": None, "cpu": False, "gpu": True}[device]
    rows = b.bench_scaling(X, Q, k, ring.name, counts, tiles_per_worker=tiles_per_worker,
                           repeats=repeats, gpus=gpus, progress=click.echo)
    click.echo(b.scaling_markdown(rows, label))
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))
        click.echo(f"measurements written to {json_path}")
    if plot:
        _plot_scaling([r for r in rows if isinstance(r["workers"], int)],
                      f"kNN ({ring.name}, k={k}), {label}", plot,
                      lambda r: f"{r['qps']:,.0f} q/s")
        click.echo(f"plot written to {plot}")


@run.command("jaccard")
@click.argument("input", type=click.Path(exists=True))
@click.option("--weighted", is_flag=True, help="Use the edge weights (Σ min / Σ max).")
@click.option("--directed-ok/--strict", "symmetrize", default=True, show_default=True,
              help="Use G + Gᵀ for a directed edge list (SNAP lists are often one-way), or "
              "refuse it.")
@click.option("--top", default=10, show_default=True, type=int,
              help="Print this many strongest edges.")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False),
              help="Where to write the weights (scipy .npz, G's pattern).")
@click.option("--parts", default=None, type=int,
              help="Row blocks over the cluster (default: four per worker).")
@click.option("--address", default=None, help="Scheduler to join (default: embedded cluster).")
@click.option("--gpus/--no-gpus", default=None, help="Force or forbid GPU workers.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write the histogram of the weights to this PNG.")
def run_jaccard(input: str, weighted: bool, symmetrize: bool, top: int, out_path: str,
                parts: int | None, address: str | None, gpus: bool | None,
                plot: str | None) -> None:
    """Jaccard weights of every edge of a graph, computed on the cluster.

    INPUT is a SNAP edge list (plain or gzip; read as undirected) or any adjacency matrix
    mgpu.io.load reads. Prints the distribution and the strongest edges (original node ids).
    """
    import scipy.sparse as sp
    from tqdm import tqdm

    from mgpu import io
    from mgpu.distributed import connect
    from workflows import jaccard as wf

    if plot is not None:
        _need_matplotlib()
    out = _npz_out(out_path, "the weights")
    t0 = time.perf_counter()
    try:
        if io.detect_format(input) == "snap":
            G, ids = io.load_snap(input, relabel=True, return_ids=True, dtype=np.float64)
        else:
            data = io.load(input)
            G = sp.csr_matrix(getattr(data, "matrix", data))
            ids = np.arange(G.shape[0])
    except (ValueError, FileNotFoundError, TypeError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{Path(input).name}: {G.shape[0]:,} nodes, {G.nnz:,} stored edges "
               f"(loaded in {time.perf_counter() - t0:.1f} s)")
    with connect(address, gpus=gpus) as client:
        t0 = time.perf_counter()
        n_parts = parts or 4 * max(1, len(client.scheduler_info()["workers"]))
        try:
            from mgpu.ops.jaccard import check_graph

            checked = check_graph(G, "jaccard", weighted=weighted, symmetrize=symmetrize)
        except (TypeError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
        with tqdm(total=checked.nnz, unit="edge", desc="jaccard", file=sys.stderr,
                  disable=None) as bar:
            J = wf.edge_weights(checked, weighted=weighted, symmetrize=False, parts=n_parts,
                                client=client, progress=bar.update)
        elapsed = time.perf_counter() - t0
    tmp = out.with_name(out.name + ".partial.npz")
    sp.save_npz(tmp, J, compressed=True)
    tmp.replace(out)  # nothing half written under the final name
    h = wf.histogram(J)
    click.echo(f"weights of {h['edges']:,} edges in {elapsed:.1f} s "
               f"({J.nnz / max(elapsed, 1e-9):,.0f} edge entries/s), written to {out}")
    click.echo(f"mean {h['mean']:.4f}, median {h['median']:.4f}; weight 0: {h['zero']:.1%}, "
               f"weight 1: {h['one']:.1%}")
    for u, v, w in wf.top_edges(J, top):
        click.echo(f"  {int(ids[u])} -- {int(ids[v])}: {w:.4f}")
    if plot is not None:
        wf.plot(J, plot, f"Jaccard weights, {Path(input).name} ({h['edges']:,} edges)")
        click.echo(f"plot written to {plot}")


@run.command("als")
@click.argument("ratings", type=click.Path(exists=True, dir_okay=False))
@_workflow_placement("steps", "the users", "the ratings",
                     " (the CPU and the GPU from the same start, and their per-step times "
                     "compared)")
@click.option("-k", "--k", "k", default=32, show_default=True, type=int)
@click.option("--iters", default=100, show_default=True, type=int, help="Gradient steps.")
@click.option("--lr", default=0.01, show_default=True, type=float, help="Adam step size.")
@click.option("--reg", default=0.1, show_default=True, type=float, help="L2 penalty.")
@click.option("--test-fraction", default=0.1, show_default=True, type=float)
@click.option("--seed", default=0, show_default=True)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder for <device>-factors.npz and history.json.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write test RMSE against the step to this PNG.")
def run_als(ratings: str, device: str, parts: int | None, n_workers: int | None,
            address: str | None, k: int, iters: int, lr: float, reg: float,
            test_fraction: float, seed: int, out_dir: str, plot: str | None) -> None:
    """Matrix factorisation of a ratings file by SDDMM + SpMM gradient steps.

    Every step computes the predictions at the training ratings (mgpu.sddmm) and the two
    gradients (mgpu.spmm of the residual with V, of its transpose with U); the step's time and
    the test RMSE are reported, per device. On a cluster (the default) each worker keeps its
    users' ratings and rows of U, and only V moves.
    """
    import json

    from tqdm import tqdm

    from mgpu.distributed import connect
    from mgpu.io import load_ratings
    from workflows import als

    if plot is not None:
        _need_matplotlib()
    try:
        R = load_ratings(ratings).matrix
        train, test = als.split(R, test_fraction, seed)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    devices = _cluster_or_devices(device, parts, n_workers, address)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    click.echo(f"{Path(ratings).name}: {R.shape[0]:,} users x {R.shape[1]:,} items, "
               f"{train.nnz:,} training and {test.nnz:,} test ratings; k={k}, {iters} steps")
    histories: dict[str, list[dict[str, float]]] = {}
    for dev in devices:
        tr, te = train, test
        if dev == "gpu":
            import cupyx.scipy.sparse as csp

            tr, te = csp.csr_matrix(train), csp.csr_matrix(test)
        with tqdm(total=iters, unit="step", desc=dev, file=sys.stderr, disable=None) as bar:
            def progress(rec: dict[str, float], bar=bar) -> None:
                bar.update(1)
                bar.set_postfix(test_rmse=f"{rec['test_rmse']:.4f}")

            try:
                if dev == "cluster":
                    with connect(address, n_workers=n_workers) as client:
                        click.echo(f"cluster: {_describe(client)}")
                        model = als.train_distributed(tr, te, parts=parts, client=client,
                                                      k=k, reg=reg, lr=lr, iters=iters,
                                                      seed=seed, progress=progress)
                else:
                    model = als.train(tr, te, k=k, reg=reg, lr=lr, iters=iters, seed=seed,
                                      progress=progress)
            except FloatingPointError as exc:  # diverged: nothing of this run is written
                raise click.ClickException(f"{dev}: {exc}") from None
        hist = model.history
        histories[dev] = hist
        steps = np.array([h["step_s"] for h in hist[1:]] or [hist[0]["step_s"]])
        U, V = (np.asarray(A.get() if hasattr(A, "get") else A) for A in (model.U, model.V))
        tmp = out / f".{dev}-factors.partial.npz"
        np.savez(tmp, U=U, V=V, mean=model.mean)
        tmp.replace(out / f"{dev}-factors.npz")
        click.echo(f"{dev}: test RMSE {hist[-1]['test_rmse']:.4f} after {iters} steps "
                   f"(best {min(h['test_rmse'] for h in hist):.4f}); SDDMM + SpMM step median "
                   f"{np.median(steps) * 1e3:.2f} ms")
    if len(histories) == 2:
        med = {d: float(np.median([h["step_s"] for h in hist[1:]] or [hist[0]["step_s"]]))
               for d, hist in histories.items()}
        click.echo(f"GPU step {med['cpu'] / med['gpu']:.1f}x faster than the CPU backend")
    tmp = out / ".history.partial.json"
    tmp.write_text(json.dumps(histories, indent=1))
    tmp.replace(out / "history.json")
    if plot is not None:
        als.plot(histories, plot, f"SDDMM + SpMM matrix factorisation, {Path(ratings).name}")
        click.echo(f"plot written to {plot}")


@run.command("gap")
@click.argument("corpus", type=click.Path(exists=True, dir_okay=False))
@click.option("--vocab", type=click.Path(exists=True, dir_okay=False), default=None,
              help="One word per line (plain or gzip), for the topics' top words.")
@_workflow_placement("updates", "the documents", "the corpus", "")
@click.option("--topics", default=20, show_default=True, type=int)
@click.option("--iters", default=50, show_default=True, type=int)
@click.option("--alpha", default=1.1, show_default=True, type=float,
              help="Shape of the Gamma prior of the loadings (>= 1).")
@click.option("--beta", default=10.0, show_default=True, type=float,
              help="Scale of the Gamma prior of the loadings.")
@click.option("--seed", default=0, show_default=True)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder for <device>-topics.npz, topics.json and history.json.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write the log-likelihood per token against the iteration to this PNG.")
def run_gap(corpus: str, vocab: str | None, device: str, parts: int | None,
            n_workers: int | None, address: str | None, topics: int, iters: int,
            alpha: float, beta: float, seed: int, out_dir: str, plot: str | None) -> None:
    """GaP topic model of a bag-of-words corpus (documents x words counts).

    CORPUS is any bag-of-words file mgpu.io.load reads (UCI docword, LDA-C). Every update is
    an SDDMM (the Poisson rates at the nonzero counts) followed by an SpMM; on a cluster the
    documents stay on the workers and only the topics move.
    """
    import gzip
    import json

    import scipy.sparse as sp
    from tqdm import tqdm

    from mgpu import io
    from mgpu.distributed import connect
    from workflows import gap

    if plot is not None:
        _need_matplotlib()
    try:
        S = sp.csr_matrix(io.load(corpus))
        model_args = dict(iters=iters, alpha=alpha, beta=beta, seed=seed)
        if topics < 1 or iters < 1 or alpha < 1 or beta <= 0:
            raise ValueError("--topics and --iters must be >= 1, --alpha >= 1, --beta > 0")
    except (ValueError, TypeError) as exc:
        raise click.ClickException(str(exc)) from None
    words = None
    if vocab is not None:
        opener = gzip.open if vocab.endswith(".gz") else open
        with opener(vocab, "rt") as f:
            words = [w.strip() for w in f if w.strip()]
    devices = _cluster_or_devices(device, parts, n_workers, address)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    click.echo(f"{Path(corpus).name}: {S.shape[0]:,} documents x {S.shape[1]:,} words, "
               f"{S.nnz:,} nonzero counts; {topics} topics, {iters} iterations")
    histories: dict[str, list[dict[str, float]]] = {}
    listing: dict[str, list[list[str]]] = {}
    for dev in devices:
        data = S
        if dev == "gpu":
            import cupyx.scipy.sparse as csp

            data = csp.csr_matrix(S)
        with tqdm(total=iters, unit="iter", desc=dev, file=sys.stderr, disable=None) as bar:
            def progress(rec: dict[str, float], bar=bar) -> None:
                bar.update(1)
                bar.set_postfix(loglik=f"{rec['loglik_per_token']:.4f}")

            if dev == "cluster":
                with connect(address, n_workers=n_workers) as client:
                    click.echo(f"cluster: {_describe(client)}")
                    model = gap.fit_distributed(data, topics, parts=parts, client=client,
                                                progress=progress, **model_args)
                    click.echo(_tile_placement(client, model.tiles))
            else:
                model = gap.fit(data, topics, progress=progress, **model_args)
        histories[dev] = model.history
        listing[dev] = gap.top_words(model.L, words)
        X, L = (np.asarray(A.get() if hasattr(A, "get") else A) for A in (model.X, model.L))
        tmp = out / f".{dev}-topics.partial.npz"
        np.savez(tmp, X=X, L=L)
        tmp.replace(out / f"{dev}-topics.npz")
        steps = [h["step_s"] for h in model.history[1:]] or [model.history[0]["step_s"]]
        click.echo(f"{dev}: log-likelihood per token {model.history[-1]['loglik_per_token']:.4f}"
                   f"; iteration median {np.median(steps) * 1e3:.2f} ms")
    first = listing[devices[0]]
    for t, ws in enumerate(first[:10]):
        click.echo(f"  topic {t:2d}: {' '.join(ws)}")
    for name, payload in (("history.json", histories), ("topics.json", listing)):
        tmp = out / f".{name}.partial"
        tmp.write_text(json.dumps(payload, indent=1))
        tmp.replace(out / name)
    if plot is not None:
        gap.plot(histories, plot, f"GaP topic model, {Path(corpus).name}")
        click.echo(f"plot written to {plot}")


@bench.command("gap")
@click.argument("corpus", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--corpus-shape", "shape", default="300000x100000", show_default=True,
              metavar="DOCSxTERMS", help="Synthetic power-law corpus (without CORPUS).")
@click.option("--density", default=0.002, show_default=True, type=float,
              help="Density of the synthetic corpus.")
@click.option("--topics", default=20, show_default=True, type=int)
@click.option("--iters", default=12, show_default=True, type=int)
@click.option("--workers", default="1,2,4", show_default=True,
              help="Comma-separated worker counts (GPUs, on a GPU machine).")
@click.option("--device", type=click.Choice(["auto", "cpu", "gpu"]), default="auto",
              show_default=True, help="Worker kind (auto: GPU workers when GPUs are visible).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write every measurement to this JSON file.")
def bench_gap(corpus: str | None, shape: str, density: float, topics: int, iters: int,
              workers: str, device: str, json_path: str | None) -> None:
    """Per-iteration time of the GaP topic model (2 SDDMM + 2 SpMM + the log-likelihood's
    SDDMM an iteration) on one device and on 1, 2, 4, … workers, in one run."""
    import json

    import scipy.sparse as sp

    from mgpu import io
    from mgpu.synthetic import powerlaw_corpus
    from workflows import gap

    counts = _worker_counts(workers, device)
    if topics < 1:
        raise click.BadParameter(f"must be >= 1, got {topics}", param_hint="--topics")
    if iters < 3:  # the median leaves out the first two iterations
        raise click.BadParameter(f"must be >= 3, got {iters}", param_hint="--iters")
    if corpus is not None:
        S, label = sp.csr_matrix(io.load(corpus)), Path(corpus).name
    else:
        n_docs, n_terms = _parse_shape(shape)
        S = powerlaw_corpus(n_docs, n_terms, density, seed=0)
        label = f"power-law {n_docs:,}×{n_terms:,}"
    click.echo(f"{label}: {S.shape[0]:,} documents x {S.shape[1]:,} words, {S.nnz:,} nonzero "
               f"counts; {topics} topics, {iters} iterations")
    gpus = {"auto": None, "cpu": False, "gpu": True}[device]
    rows = gap.scaling(S, topics, iters, counts, gpus=gpus, progress=click.echo)
    click.echo(gap.scaling_markdown(rows, label))
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))
        click.echo(f"measurements written to {json_path}")


@bench.command("mf")
@click.argument("ratings", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--synthetic", default=None, metavar="USERSxITEMS:RATINGS",
              help="Planted low-rank ratings instead of a file, e.g. 480189x17770:2e7 "
              "(Netflix's shape; noise 0.5, so the best test RMSE is about 0.5).")
@_mf_options
@click.option("--gpu-warps", default=None, type=int,
              help="Cap a GPU block's warps (mgpu.mf.gpu-warps), to give the GPUs a smaller "
              "share of themselves as the thesis does to compare sides of similar speed.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write every mode's summary and history to this JSON file.")
def bench_mf(ratings: str | None, synthetic: str | None, modes: str, k: int, lr: float,
             reg: float, epochs: int, target_rmse: float | None, test_fraction: float,
             seed: int, address: str | None, cpu_threads: int | None, plot: str | None,
             one_cluster: bool, gpu_warps: int | None, json_path: str | None) -> None:
    """Time to a target test RMSE of every mode, from one start, with the cost model's
    accuracy: the HSGD* comparison and ablation (linear model against HSGD*'s, with and
    without stealing)."""
    import json

    from mgpu.bench import mf as b
    from mgpu.io import load_ratings
    from mgpu.synthetic import planted_ratings

    if (ratings is None) == (synthetic is None):
        raise click.UsageError("give a RATINGS file or --synthetic USERSxITEMS:RATINGS")
    if gpu_warps is not None and gpu_warps < 1:
        raise click.BadParameter("must be >= 1", param_hint="--gpu-warps")
    if synthetic is not None:
        try:
            shape, count = synthetic.split(":")
            n_users, n_items = _parse_shape(shape)
            n_ratings = int(float(count))
        except (ValueError, click.BadParameter):
            raise click.BadParameter(f"expected USERSxITEMS:RATINGS, got {synthetic!r}",
                                     param_hint="--synthetic") from None
        noise = 0.5
        R = planted_ratings(n_users, n_items, n_ratings, noise=noise, seed=seed)
        label = f"planted ratings {n_users:,}×{n_items:,} (noise {noise})"
        target = 1.2 * noise if target_rmse is None else target_rmse
    else:
        try:
            R = load_ratings(ratings).matrix
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        label = Path(ratings).name
        target = 0.98 if target_rmse is None else target_rmse
    with dask.config.set({"mgpu.mf.gpu-warps": gpu_warps} if gpu_warps else {}):
        mfs = _mf_train(R, label, modes, k, lr, reg, epochs, target, test_fraction, seed,
                        address, cpu_threads, plot, one_cluster)
    rows = [b.summary(mf, target or None) for mf in mfs.values()]
    click.echo(b.markdown(rows, target or None))
    calls = b.calls_markdown(rows)
    if calls:
        click.echo("\nWhere a block call's time went (ms per call, medians over the epochs "
                   "after the first; busy counts from the call's sending to its end, per "
                   "slot):\n" + calls)
    if json_path:
        Path(json_path).write_text(json.dumps(
            {"data": label, "k": k, "gpu_warps": gpu_warps, "rows": rows,
             "history": {m: mf.history_ for m, mf in mfs.items()}}, indent=1))
        click.echo(f"measurements written to {json_path}")


@bench.command("sgd")
@click.option("--shape", default="480189x17770", show_default=True, metavar="USERSxITEMS",
              help="Users × items of the synthetic ratings (default: Netflix's).")
@click.option("--ratings", "n_ratings", default=100_000_000, show_default=True, type=int)
@click.option("--k", "ks", default="32,128,256", show_default=True,
              help="Comma-separated numbers of factors.")
@click.option("--conflicts", default="none,1,4", show_default=True,
              help="Comma-separated bounds on the updates in flight on the busiest row "
              "('none': every warp the GPU holds; mgpu.mf.gpu-conflicts is what MF uses).")
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32",
              show_default=True)
@click.option("--repeats", default=5, show_default=True, type=int)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write every measurement to this JSON file.")
def bench_sgd(shape: str, n_ratings: int, ks: str, conflicts: str, dtype: str, repeats: int,
              json_path: str | None) -> None:
    """Updates/s of the GPU SGD block kernel of matrix factorisation (one pass = every rating
    once, power-law user and item degrees, drawn on the GPU)."""
    import json

    from mgpu.bench import sgd as b
    from mgpu.distributed import visible_gpus

    if visible_gpus() == 0:
        raise click.UsageError("bench sgd times the GPU kernel; no GPU is visible.")
    n_users, n_items = _parse_shape(shape)
    k_list = _parse_ints(ks, "--k")
    if n_ratings < 1 or repeats < 1 or max(k_list) > 256:
        raise click.BadParameter("--ratings and --repeats must be >= 1 and every k <= 256")
    try:
        bounds = tuple(None if c.strip() == "none" else float(c) for c in conflicts.split(","))
    except ValueError:
        raise click.BadParameter(f"expected numbers or 'none', got {conflicts!r}",
                                 param_hint="--conflicts") from None
    rows = b.bench_gpu(n_users, n_items, n_ratings, k_list, conflicts=bounds,
                       dtype=np.dtype(dtype), repeats=repeats)
    click.echo(b.markdown(rows))
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))
        click.echo(f"measurements written to {json_path}")


@bench.command("spmv")
@click.argument("inputs", nargs=-1, type=click.Path(exists=True))
@click.option("--powerlaw", "powerlaw", multiple=True, metavar="ROWSxCOLS:NNZ[:REXP[:CEXP]]",
              help="Add a synthetic power-law matrix (repeatable), e.g. 1000000x1000000:2e7; "
              "REXP and CEXP are the row and column degree exponents (default 0.6 and 0.8; "
              "0:0 gives uniform rows, REXP above 1 a few rows with most of the nonzeros).")
@click.option("--banded", "banded", multiple=True, metavar="NxWIDTH",
              help="Add an N x N band of WIDTH diagonals (repeatable), e.g. 4000000x11: every "
              "row the same length, neighbouring columns.")
@click.option("--device", type=click.Choice(["auto", "cpu", "gpu"]), default="auto",
              show_default=True)
@click.option("--repeats", default=10, show_default=True, type=int, help="Timed runs (median).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write every measurement to this JSON file.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write time against nnz (both methods) to this PNG.")
def bench_spmv_cmd(inputs: tuple[str, ...], powerlaw: tuple[str, ...], banded: tuple[str, ...],
                   device: str, repeats: int, json_path: str | None, plot: str | None) -> None:
    """Merge-path SpMV against cuSPARSE (GPU) or scipy (CPU) on real and synthetic matrices,
    and how closely the time follows nnz (the merge path's promise)."""
    import json

    import scipy.sparse as sp

    from mgpu import io
    from mgpu.bench import spmv as b
    from mgpu.synthetic import band_csr, powerlaw_csr

    if plot is not None:
        _need_matplotlib()
    mats = []
    for path in inputs:
        data = io.load(path)
        mats.append((Path(path).name, sp.csr_matrix(getattr(data, "matrix", data))))
    for spec in powerlaw:
        try:
            shape, nnz, *exps = spec.split(":")
            if len(exps) > 2:
                raise ValueError("expected ROWSxCOLS:NNZ[:REXP[:CEXP]]")
            m, n = _parse_shape(shape)
            rexp, cexp = [float(e) for e in exps] + [0.6, 0.8][len(exps):]
            label = f"power-law {m:,}x{n:,}" + (f" ({rexp:g}/{cexp:g})" if exps else "")
            mats.append((label, powerlaw_csr(m, n, int(float(nnz)), row_exponent=rexp,
                                             col_exponent=cexp, seed=0)))
        except ValueError as exc:
            raise click.BadParameter(f"{spec!r}: {exc}", param_hint="--powerlaw") from None
    for spec in banded:
        try:
            n, width = _parse_shape(spec)
            mats.append((f"band {n:,}x{width}", band_csr(n, width)))
        except ValueError as exc:
            raise click.BadParameter(f"{spec!r}: {exc}", param_hint="--banded") from None
    if not mats:
        raise click.UsageError("give matrix files (INPUTS), --powerlaw ROWSxCOLS:NNZ and/or "
                               "--banded NxWIDTH")
    rows = b.bench_spmv(mats, repeats, device=device)
    click.echo(b.markdown(rows))
    files = rows[:len(inputs)]  # the matrices read from INPUTS come first
    if len(files) > 1 and len(files) < len(rows):
        click.echo(f"The {len(files)} matrices from files alone: {b.correlations(files)}")
    r = b.nnz_time_correlation(rows)
    if json_path:
        Path(json_path).write_text(json.dumps({"rows": rows, "nnz_time_correlation": r},
                                              indent=1))
        click.echo(f"measurements written to {json_path}")
    if plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

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
        fig.savefig(plot, dpi=120)
        plt.close(fig)
        click.echo(f"plot written to {plot}")


@bench.command("jaccard")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--device", type=click.Choice(["cpu", "gpu"]), default="cpu", show_default=True)
@click.option("--repeats", default=5, show_default=True, type=int, help="Timed runs (median).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write every measurement to this JSON file.")
def bench_jaccard(inputs: tuple[str, ...], device: str, repeats: int,
                  json_path: str | None) -> None:
    """Jaccard weights of real graphs: mgpu's kernel against the SpGEMM route (A·A at A's
    pattern; scipy on the CPU, cuSPARSE through cupyx on the GPU), edges per second."""
    import json

    from mgpu import io
    from mgpu.bench import jaccard as b

    rows = []
    for path in inputs:
        G = io.load_snap(path, symmetric=True, dtype=np.float64) \
            if io.detect_format(path) == "snap" else io.load(path)
        r = b.bench_graph(G, device, repeats)
        r["graph"] = Path(path).name
        rows.append(r)
        click.echo(b.markdown([r]).splitlines()[-1] if len(rows) > 1 else b.markdown([r]))
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))
        click.echo(f"measurements written to {json_path}")


@bench.command("sddmm-scaling")
@click.argument("input", required=False, type=click.Path(exists=True))
@click.option("--powerlaw", default=None, metavar="ROWSxCOLS",
              help="Use a synthetic power-law matrix of this shape instead of INPUT "
              "(the issue's: 300000x100000 with --nnz 6e7).")
@click.option("--nnz", default=6e7, show_default=True, type=float,
              help="Nonzeros drawn for --powerlaw.")
@click.option("--k", "Ks", default="128", show_default=True,
              help="Columns of A and B, comma-separated for several.")
@click.option("--workers", default="1,2,4", show_default=True,
              help="Comma-separated worker counts (GPUs, on a GPU machine).")
@click.option("--tiles-per-worker", default=1, show_default=True, type=int,
              help="Tiles of S per worker (more lets a fast worker take more).")
@click.option("--device", type=click.Choice(["auto", "cpu", "gpu"]), default="auto",
              show_default=True, help="Worker kind (auto: GPU workers when GPUs are visible).")
@click.option("--repeats", default=5, show_default=True, type=int, help="Timed calls (median).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write every measurement to this JSON file.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG of speedup against workers.")
def bench_sddmm_scaling(input: str | None, powerlaw: str | None, nnz: float, Ks: str,
                        workers: str, tiles_per_worker: int, device: str, repeats: int,
                        json_path: str | None, plot: str | None) -> None:
    """Distributed SDDMM on 1, 2, 4, … workers with S and the factors resident on them.

    Reports the median time of a call, GFLOP/s, the speedup against the first worker count
    and the nnz imbalance of the tiles, all from one run.
    """
    import json

    from mgpu.bench import sddmm as b

    counts = _worker_counts(workers, device)
    K_list = _parse_ints(Ks, "--k")
    for name, v in (("--tiles-per-worker", tiles_per_worker), ("--repeats", repeats)):
        if v < 1:
            raise click.BadParameter(f"must be >= 1, got {v}", param_hint=name)
    if plot is not None:
        _need_matplotlib()
    gpus = {"auto": None, "cpu": False, "gpu": True}[device]
    t0 = time.perf_counter()
    S, label = _load_input(input, powerlaw, nnz, 0)
    S = S.tocsr().astype(np.float32)
    S.sum_duplicates()
    click.echo(f"{label}: {S.shape[0]:,} x {S.shape[1]:,}, {S.nnz:,} nonzeros "
               f"(ready in {time.perf_counter() - t0:.0f} s)")
    rows = b.bench_scaling(S, K_list, counts, tiles_per_worker=tiles_per_worker,
                           repeats=repeats, gpus=gpus, progress=click.echo)
    click.echo(b.scaling_markdown(rows, label))
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))
        click.echo(f"measurements written to {json_path}")
    if plot is not None:
        K = K_list[-1]
        _plot_scaling([r for r in rows if r["K"] == K and isinstance(r["workers"], int)],
                      f"SDDMM, {label}, K={K}", plot, lambda r: f"{r['gflops']:.0f} GFLOP/s")
        click.echo(f"plot written to {plot}")


def _parse_ints(text: str, hint: str) -> tuple[int, ...]:
    """A comma-separated list of positive integers (``1,2,4``), or a usage error naming it."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise click.BadParameter(f"expected positive integers such as 1,2,4, got {text!r}",
                                 param_hint=hint) from None
    if not values or min(values) < 1:
        raise click.BadParameter(f"every value must be >= 1, got {text!r}", param_hint=hint)
    return values


def _worker_counts(workers: str, device: str) -> tuple[int, ...]:
    """--workers as counts, refused before any work when GPU workers are more than GPUs."""
    from mgpu.distributed import visible_gpus

    counts = _parse_ints(workers, "--workers")
    n_gpus = visible_gpus()
    if (device == "gpu" or (device == "auto" and n_gpus)) and max(counts) > n_gpus:
        raise click.UsageError(f"--workers asks for {max(counts)} GPU workers but {n_gpus} "
                               "GPU(s) are visible; lower it or pass --device cpu.")
    return counts


def _plot_scaling(rows: list[dict[str, Any]], title: str, path: str,
                  rate: Callable[[dict[str, Any]], str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w = [r["workers"] for r in rows]
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(w, [r["speedup"] for r in rows], "o-", label="measured")
    ax.plot(w, [x / w[0] for x in w], "k--", lw=1, label="linear")
    for r in rows:
        ax.annotate(rate(r), (r["workers"], r["speedup"]),
                    textcoords="offset points", xytext=(4, -12), fontsize="small")
    ax.set_xlabel(f"{rows[0]['kind']} workers" if rows else "workers")
    ax.set_ylabel(f"speedup against {w[0]}" if w else "speedup")
    ax.set_xticks(w)
    ax.set_title(title, fontsize="medium")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":  # pragma: no cover
    main()
