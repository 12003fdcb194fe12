"""``mgpu bench``: the benchmarks behind docs/benchmarks.md, each one run of
:mod:`mgpu.bench` printed as a Markdown table (and written as JSON with ``--json``)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
import dask.config
import numpy as np

from mgpu.cli import _options as opt
from mgpu.cli import _plots
from mgpu.cli._errors import Group, data_error
from mgpu.cli._inputs import data_root, load_corpus, load_input, load_matrix, load_ratings
from mgpu.cli._mf import mf_options, train
from mgpu.cli._output import bar, plotted, write_json
from mgpu.cli.bench_ann import bench_ann_cmd, bench_ann_large_cmd, bench_ann_scaling_cmd
from mgpu.cli.bench_comm import _GPUS, _check_gpu_workers, bench_allreduce
from mgpu.cli.bench_sgd import bench_sgd, bench_sgd_seeds
from mgpu.cli.bench_spgemm import bench_spgemm_cmd, bench_spgemm_scaling_cmd



@click.group(cls=Group)
def bench() -> None:
    """Benchmarks (the current results are in docs/benchmarks.md)."""


bench.add_command(bench_allreduce, "allreduce")
bench.add_command(bench_ann_cmd, "ann")
bench.add_command(bench_ann_scaling_cmd, "ann-scaling")
bench.add_command(bench_ann_large_cmd, "ann-large")
bench.add_command(bench_sgd, "sgd")
bench.add_command(bench_sgd_seeds, "sgd-seeds")
bench.add_command(bench_spgemm_cmd, "spgemm")
bench.add_command(bench_spgemm_scaling_cmd, "spgemm-scaling")


def _need_gpu(what: str, usage: bool = False) -> None:
    from mgpu.distributed import visible_gpus

    if visible_gpus() == 0:
        raise (click.UsageError if usage else click.ClickException)(what)


@bench.command("partition")
@opt.data_dir(exists=True)
@opt.int_list("--parts", "4,16", "Comma-separated part counts.")
def bench_partition(data_dir: str | None, parts: tuple[int, ...]) -> None:
    """nnz imbalance of row and column splits of the real datasets (a Markdown table).

    The bound column is 1 + w/(nnz/P), with w the largest row/column: the most that a split
    whose parts differ by at most w (as mgpu's do) can be off.
    """
    from mgpu.bench.partition import split_markdown, split_rows

    root = data_root(data_dir)
    if not root.is_dir():
        raise click.ClickException(f"no data folder at {root}; pass --data")
    for line in split_markdown(split_rows(root, parts)):
        click.echo(line)


@bench.command("sddmm")
@opt.data_dir(exists=False)
@opt.powerlaw("300000x100000", "Shape of the synthetic power-law matrix ('none' to skip).",
              skippable=True)
@opt.nnz(6e7, "Nonzeros drawn for --powerlaw (repeats merge, so somewhat fewer remain).")
@opt.ks("32,128,512", "Values of K.")
@opt.device(("auto", "cpu", "gpu"), "auto", "Where to run (auto: the GPU when one is visible).")
@opt.repeats(None, "Timed repeats (median reported).")
@click.option("--breakdown", is_flag=True,
              help="GPU only: also print where a checked call's time goes (validation, "
                   "planning, flag, memory, launch and its time in cuLaunchKernel, output, "
                   "wait, and the device's time) for the smallest real matrix, at each K, "
                   "and with a plan, its time before the launch and the launch's.")
@opt.json_out()
def bench_sddmm(data_dir: str | None, powerlaw: tuple[int, int] | None, nnz: float,
                ks: tuple[int, ...], device: str, repeats: int | None, breakdown: bool,
                json_path: str | None) -> None:
    """SDDMM GFLOP/s of mgpu and its peers on real and power-law matrices, one run."""
    from mgpu.bench import sddmm as b
    from mgpu.distributed import visible_gpus

    on_gpu = device == "gpu" or (device == "auto" and visible_gpus() > 0)
    root = data_root(data_dir)
    sets = [(Path(rel).name, load_matrix(str(root / rel))) for rel in b.SDDMM_SETS
            if (root / rel).exists()]
    if powerlaw is not None:
        from mgpu.synthetic import powerlaw_csr

        m, n = powerlaw
        t0 = time.perf_counter()
        S = powerlaw_csr(m, n, int(nnz), seed=0)
        click.echo(f"power-law {m:,} x {n:,}: {S.nnz:,} nonzeros, density {S.nnz / m / n:.4%}, "
                   f"longest row {int(np.diff(S.indptr).max()):,} "
                   f"(generated in {time.perf_counter() - t0:.0f} s)")
        sets.append((f"power-law {m:,}×{n:,}", S))
    results = []
    for label, S in bar(iterable=sets, desc="matrices"):
        rows = b.bench_matrix(S, ks, on_gpu=on_gpu, repeats=repeats, label=label)
        results.extend(rows)
        click.echo(b.markdown(rows, label))
    real = [(label, S) for label, S in sets if not label.startswith("power-law")]
    if breakdown and on_gpu and real:
        label, S = min(real, key=lambda item: item[1].nnz)
        for K in ks:
            click.echo(b.breakdown_text(label, K, b.call_breakdown(S, K)))
    write_json(json_path, results)


@bench.command("sddmm-stream")
@click.option("--shape", default="17000000x17000000", show_default=True, type=opt.Shape(),
              metavar="ROWSxCOLS", help="S's shape (A has ROWS rows, B COLS rows).")
@click.option("--row-nnz", default=12, show_default=True, type=int,
              help="Nonzeros in every row of S.")
@click.option("--k", "K", default=640, show_default=True, type=int, help="Columns of A and B.")
@click.option("--working-memory", default=None,
              help="Device bytes for the tiles (default: 80% of what the GPU has available).")
@click.option("--cpu/--no-cpu", "cpu_peer", default=True, show_default=True,
              help="Also run mgpu's CPU backend on the same operands.")
@opt.json_out("the measurement")
def bench_sddmm_stream(shape: tuple[int, int], row_nnz: int, K: int,
                       working_memory: str | None, cpu_peer: bool,
                       json_path: str | None) -> None:
    """SDDMM of host operands larger than the GPU, streamed through it in tiles.

    The defaults make float32 operands of about 89 GB (A and B 43.5 GB each), more than an
    80 GB GPU holds; the host needs about 95 GB free.
    """
    from mgpu.bench import sddmm as b

    _need_gpu("mgpu bench sddmm-stream needs a visible GPU.")
    m, n = shape
    t0 = time.perf_counter()
    S, A, B = b.stream_operands(m, n, row_nnz, K)
    inputs = A.nbytes + B.nbytes + S.data.nbytes + S.indices.nbytes + S.indptr.nbytes
    click.echo(f"S {m:,}×{n:,} with {S.nnz:,} nonzeros, K={K}: {inputs / 1e9:.1f} GB of "
               f"operands (made in {time.perf_counter() - t0:.0f} s)")
    with bar(total=S.nnz, desc="streamed SDDMM", unit="nz", unit_scale=True) as pb:
        row = b.bench_streamed(S, A, B, working_memory=working_memory, cpu_peer=False,
                               progress=pb.update)
    click.echo(b.streamed_report(row))
    if cpu_peer:
        row.update(b.run_cpu_peer(S, A, B, row["gpu_s"]))
        click.echo(f"CPU backend: {row['cpu_s']:.2f} s; streamed GPU {row['speedup_vs_cpu']:.2f}× "
                   f"(max rel err {row['cpu_max_rel_err']:.1e} against float64)")
    write_json(json_path, row, "measurement")


def _float32_input(input: str | None, powerlaw: tuple[int, int] | None, nnz: float
                   ) -> tuple[Any, str]:
    """INPUT or the power-law matrix as float32 CSR without duplicates, and its label."""
    t0 = time.perf_counter()
    S, label = load_input(input, powerlaw, nnz, 0)
    S = S.tocsr().astype(np.float32)
    S.sum_duplicates()
    click.echo(f"{label}: {S.shape[0]:,} x {S.shape[1]:,}, {S.nnz:,} nonzeros "
               f"(ready in {time.perf_counter() - t0:.0f} s)")
    return S, label


@bench.command("sddmm-scaling")
@click.argument("input", required=False, type=click.Path(exists=True))
@opt.powerlaw(help="Use a synthetic power-law matrix of this shape instead of INPUT (the "
              "issue's: 300000x100000 with --nnz 6e7).")
@opt.nnz(6e7)
@opt.ks("128", "Columns of A and B, comma-separated for several.")
@opt.worker_counts()
@opt.tiles_per_worker
@opt.worker_kind
@opt.protocol
@opt.repeats(5, "Timed calls (median).")
@opt.json_out()
@opt.plot("speedup against workers")
def bench_sddmm_scaling(input: str | None, powerlaw: tuple[int, int] | None, nnz: float,
                        ks: tuple[int, ...], workers: tuple[int, ...], tiles_per_worker: int,
                        device: str, repeats: int, json_path: str | None,
                        plot: str | None) -> None:
    """Distributed SDDMM on 1, 2, 4, … workers with S and the factors resident on them.

    Reports the median time of a call, GFLOP/s, the speedup against the first worker count
    and the nnz imbalance of the tiles, all from one run.
    """
    from mgpu.bench import sddmm as b

    counts = _check_gpu_workers(workers, device)
    S, label = _float32_input(input, powerlaw, nnz)
    rows = b.bench_scaling(S, ks, counts, tiles_per_worker=tiles_per_worker,
                           repeats=repeats, gpus=_GPUS[device], progress=click.echo)
    click.echo(b.scaling_markdown(rows, label))
    write_json(json_path, rows)
    if plot is not None:
        K = ks[-1]
        _plots.scaling([r for r in rows if r["K"] == K and isinstance(r["workers"], int)],
                       f"SDDMM, {label}, K={K}", plot, lambda r: f"{r['gflops']:.0f} GFLOP/s")
    plotted(plot)


@bench.command("sddmm-loop")
@click.argument("input", required=False, type=click.Path(exists=True))
@opt.powerlaw(help="Use a synthetic power-law matrix of this shape instead of INPUT (the "
              "issue's: 1200000x200000 with --nnz 2e8, and 300000x100000 with --nnz 6e7).")
@opt.nnz(6e7)
@opt.k(128, "Columns of A and B.")
@click.option("--steps", default=50, show_default=True, type=click.IntRange(min=1),
              help="SDDMM calls in the loop.")
@opt.worker_counts()
@opt.tiles_per_worker
@opt.worker_kind
@opt.json_out()
def bench_sddmm_loop(input: str | None, powerlaw: tuple[int, int] | None, nnz: float, k: int,
                     steps: int, workers: tuple[int, ...], tiles_per_worker: int, device: str,
                     json_path: str | None) -> None:
    """A loop of SDDMM calls on a resident S, the factors updated between calls: one device
    against one SPMD job (mgpu.spmd) on 1, 2, 4, … workers, in one run.

    The loop fits a positive rank-K model's margins to S's (one SDDMM a step, A's rows
    scaled locally, B's after an all-reduce of the column sums); the table gives the time a
    step, the speedup over one device and the result against one device's.
    """
    from mgpu.bench import sddmm_loop as b

    counts = _check_gpu_workers(workers, device)
    S, label = _float32_input(input, powerlaw, nnz)
    rows = b.bench_loop(S, k, counts, steps=steps, tiles_per_worker=tiles_per_worker,
                        gpus=_GPUS[device], progress=click.echo)
    click.echo(b.markdown(rows))
    write_json(json_path, rows)


@bench.command("knn")
@click.argument("input", required=False, type=click.Path(exists=True))
@opt.corpus_shape("100000x50000")
@opt.density
@click.option("--dense", is_flag=True, help="Run INPUT as dense vectors (e.g. MNIST).")
@click.option("--queries", "n_queries", default=2000, show_default=True,
              type=click.IntRange(min=1), help="Queries (the corpus's first rows).")
@opt.k(10)
@click.option("--metrics", default="cosine,euclidean,manhattan", show_default=True,
              help="Comma-separated metrics.")
@opt.device(("cpu", "gpu"), "cpu", "cpu: mgpu's CPU path against scikit-learn; gpu: mgpu's "
            "kernels (float32) against the cuSPARSE routes, the naive union kernel and "
            "scikit-learn, with mgpu's SpGEMM route (mgpu.spgemm in cuSPARSE's place) "
            "beside them.")
@click.option("--sklearn-queries", default=1000, show_default=True, type=int,
              help="GPU runs: queries timed through scikit-learn (a tenth for NAMM metrics).")
@opt.repeats(1)
@opt.json_out()
def bench_knn(input: str | None, corpus: tuple[int, int], density: float, dense: bool,
              n_queries: int, k: int, metrics: str, device: str, sklearn_queries: int,
              repeats: int, json_path: str | None) -> None:
    """Exact kNN queries/s of mgpu and its peers on one corpus, one run.

    INPUT is any file mgpu.io.load reads (a 10x folder gives spots × genes); without it a
    power-law corpus of --corpus/--density is generated (the peer timings' generator).
    """
    import os

    from mgpu.bench import knn as b
    from mgpu.ops.distances import resolve_metric

    names = [m.strip() for m in metrics.split(",") if m.strip()]
    for m in names:  # refused before the corpus is made
        resolve_metric(m, 2, func="bench knn")
    t0 = time.perf_counter()
    X, label = load_corpus(input, corpus, density, dense)
    if k > X.shape[0]:
        raise click.BadParameter(f"-k must be in [1, {X.shape[0]}] and --queries >= 1")
    n_queries = min(n_queries, X.shape[0])
    nnz = np.count_nonzero(X) if isinstance(X, np.ndarray) else X.nnz
    click.echo(f"{label}: {X.shape[0]:,}×{X.shape[1]:,}, {nnz:,} nonzeros (ready in "
               f"{time.perf_counter() - t0:.1f} s), {n_queries:,} queries, k={k}, "
               f"{os.cpu_count()} CPU cores")
    if device == "gpu":
        rows = b.bench_gpu(X, X[:n_queries], k, tuple(names), sklearn_queries=sklearn_queries,
                           repeats=max(repeats, 3))
        click.echo(b.markdown_gpu(rows, label))
        for r in rows:  # what the timing is made of: the kernel and the fused launches
            rule = r.get("rule") or {}
            tile = f", tiles of {rule['tile_rows']:,} rows" if "tile_rows" in rule else ""
            click.echo(f"mgpu {r['metric']}: the {r.get('kernel')} kernel "
                       f"({rule.get('reason', '')}{tile}); fused: {r['plan']}")
    else:
        rows = b.bench_cpu(X, X[:n_queries], k, tuple(names), repeats=repeats)
        click.echo(b.markdown(rows, label))
    for r in rows:
        r["corpus"] = label
    write_json(json_path, rows)


@bench.command("knn-scaling")
@click.argument("input", required=False, type=click.Path(exists=True))
@opt.corpus_shape("300000x100000")
@opt.density
@click.option("--queries", "n_queries", default=16384, show_default=True,
              type=click.IntRange(min=1), help="Queries (the corpus's first rows).")
@opt.k(10)
@click.option("--metric", default="cosine", show_default=True)
@opt.worker_counts()
@opt.tiles_per_worker
@opt.worker_kind
@opt.protocol
@opt.repeats(3, "Timed calls (median).")
@opt.json_out()
@opt.plot("speedup against workers")
def bench_knn_scaling(input: str | None, corpus: tuple[int, int], density: float,
                      n_queries: int, k: int, metric: str, workers: tuple[int, ...],
                      tiles_per_worker: int, device: str, repeats: int,
                      json_path: str | None, plot: str | None) -> None:
    """Distributed exact kNN on 1, 2, 4, … workers with the index resident on them.

    Reports queries/s of the public call on the dask index, the speedup against one worker,
    the nnz imbalance of the tiles and whether every worker count returns the ids of the
    one-device call, all from one run.
    """
    from mgpu.bench import knn as b
    from mgpu.ops.distances import resolve_metric

    ring, _ = resolve_metric(metric, 2, func="bench knn-scaling")
    counts = _check_gpu_workers(workers, device)
    t0 = time.perf_counter()
    X, label = load_corpus(input, corpus, density)
    if k > X.shape[0]:
        raise click.BadParameter(f"must be at most the {X.shape[0]:,} rows", param_hint="-k")
    Q = X[: min(n_queries, X.shape[0])]
    click.echo(f"{label}: {X.shape[0]:,}×{X.shape[1]:,}, {X.nnz:,} nonzeros (ready in "
               f"{time.perf_counter() - t0:.0f} s), {Q.shape[0]:,} queries, k={k}, {ring.name}")
    rows = b.bench_scaling(X, Q, k, ring.name, counts, tiles_per_worker=tiles_per_worker,
                           repeats=repeats, gpus=_GPUS[device], progress=click.echo)
    click.echo(b.scaling_markdown(rows, label))
    write_json(json_path, rows)
    if plot is not None:
        _plots.scaling([r for r in rows if isinstance(r["workers"], int)],
                       f"kNN ({ring.name}, k={k}), {label}", plot,
                       lambda r: f"{r['qps']:,.0f} q/s")
    plotted(plot)


@bench.command("knn-graph")
@click.argument("input", required=False, type=click.Path(exists=True))
@opt.corpus_shape("300000x100000")
@opt.density
@opt.k(10, "Neighbours per row (the row itself excluded).")
@click.option("--metric", default="cosine", show_default=True)
@opt.worker_counts()
@click.option("--weak-rows", default=75000, show_default=True, type=click.IntRange(min=0),
              help="Rows per worker of the weak-scaling runs (0: none).")
@opt.worker_kind
@opt.json_out()
def bench_knn_graph(input: str | None, corpus: tuple[int, int], density: float, k: int,
                    metric: str, workers: tuple[int, ...], weak_rows: int, device: str,
                    json_path: str | None) -> None:
    """The kNN graph of a corpus (every row a query) on one device and SPMD on 1, 2, 4, …
    workers, in one run.

    Reports the seconds of each, the speedup against one device and whether the ids equal
    the one-device graph's; with --weak-rows, weak scaling too (that many rows per worker:
    efficiency is the pairs of rows compared per second per worker against one worker's).
    """
    from mgpu.bench.knn_graph import bench_graph, graph_markdown
    from mgpu.ops.distances import resolve_metric

    ring, _ = resolve_metric(metric, 2, func="bench knn-graph")
    counts = _check_gpu_workers(workers, device)
    t0 = time.perf_counter()
    X, label = load_corpus(input, corpus, density)
    if k >= X.shape[0]:
        raise click.BadParameter(f"must be below the {X.shape[0]:,} rows", param_hint="-k")
    click.echo(f"{label}: {X.shape[0]:,}×{X.shape[1]:,}, {X.nnz:,} nonzeros (ready in "
               f"{time.perf_counter() - t0:.0f} s), k={k}, {ring.name}")
    rows = bench_graph(X, k, ring.name, counts, weak_rows=weak_rows, gpus=_GPUS[device],
                       progress=click.echo)
    click.echo(graph_markdown(rows, label, ring.name, k))
    for r in rows:
        r["corpus"] = label
    write_json(json_path, rows)


@bench.command("gap")
@click.argument("corpus", required=False, type=click.Path(exists=True, dir_okay=False))
@opt.corpus_shape("300000x100000", "--corpus-shape", "shape")
@opt.density
@click.option("--topics", default=20, show_default=True, type=click.IntRange(min=1))
@click.option("--iters", default=12, show_default=True, type=int)
@opt.worker_counts()
@opt.worker_kind
@opt.protocol
@click.option("--weak", is_flag=True, help="Also weak scaling: the corpus stacked N times "
              "(the same documents per worker) on N workers, each against one device.")
@opt.json_out()
def bench_gap(corpus: str | None, shape: tuple[int, int], density: float, topics: int,
              iters: int, workers: tuple[int, ...], device: str, weak: bool,
              json_path: str | None) -> None:
    """Per-iteration time of the GaP topic model (2 SDDMM + 2 SpMM an iteration) on one
    device and fitted SPMD on 1, 2, 4, … workers of one cluster, in one run: the ratios to
    one device and the largest relative difference of the log-likelihood per token to one
    device's, every iteration."""
    from mgpu.bench.gap import scaling, scaling_markdown
    from mgpu.synthetic import powerlaw_corpus
    counts = _check_gpu_workers(workers, device)
    if iters < 3:  # the median leaves out the first two iterations
        raise click.BadParameter(f"must be >= 3, got {iters}", param_hint="--iters")
    t0 = time.perf_counter()
    if corpus is not None:
        S, label = load_matrix(corpus).tocsr(), Path(corpus).name
    else:
        S = powerlaw_corpus(*shape, density, seed=0)
        label = f"power-law {shape[0]:,}×{shape[1]:,}"
    click.echo(f"{label}: {S.shape[0]:,} documents x {S.shape[1]:,} words, {S.nnz:,} nonzero "
               f"counts (ready in {time.perf_counter() - t0:.0f} s); {topics} topics, "
               f"{iters} iterations")
    rows = scaling(S, topics, iters, counts, gpus=_GPUS[device], weak=weak,
                   progress=click.echo)
    click.echo(scaling_markdown(rows, label))
    write_json(json_path, rows)


def _synthetic_ratings(ctx: click.Context, param: click.Parameter, value: str | None
                       ) -> tuple[int, int, int] | None:
    """--synthetic USERSxITEMS:RATINGS as three ints."""
    if value is None:
        return None
    try:
        shape, count = value.split(":")
        return (*opt.parse_shape(shape), int(float(count)))
    except ValueError:
        raise click.BadParameter(f"expected USERSxITEMS:RATINGS, got {value!r}") from None


@bench.command("mf")
@opt.optional_ratings
@click.option("--synthetic", default=None, metavar="USERSxITEMS:RATINGS",
              callback=_synthetic_ratings,
              help="Planted low-rank ratings instead of a file, e.g. 480189x17770:2e7 "
              "(Netflix's shape; noise 0.5, so the best test RMSE is about 0.5).")
@mf_options
@click.option("--gpu-warps", default=None, type=click.IntRange(min=1),
              help="Cap a GPU block's warps (mgpu.mf.gpu-warps), to give the GPUs a smaller "
              "share of themselves as the thesis does to compare sides of similar speed.")
@opt.json_out("every mode's summary and history")
def bench_mf(ratings: str | None, synthetic: tuple[int, int, int] | None,
             target_rmse: float | None, gpu_warps: int | None, json_path: str | None,
             **kw: Any) -> None:
    """Time to a target test RMSE of every mode, from one start, with the cost model's
    accuracy: the HSGD* comparison and ablation (linear model against HSGD*'s, with and
    without stealing)."""
    from mgpu.bench import mf as b
    from mgpu.synthetic import planted_ratings

    if (ratings is None) == (synthetic is None):
        raise click.UsageError("give a RATINGS file or --synthetic USERSxITEMS:RATINGS")
    if synthetic is not None:
        noise = 0.5
        R = planted_ratings(*synthetic, noise=noise, seed=kw["seed"])
        label = f"planted ratings {synthetic[0]:,}×{synthetic[1]:,} (noise {noise})"
        target = 1.2 * noise if target_rmse is None else target_rmse
    else:
        R, label = load_ratings(ratings).matrix, Path(ratings).name
        target = 0.98 if target_rmse is None else target_rmse
    with dask.config.set({"mgpu.mf.gpu-warps": gpu_warps} if gpu_warps else {}):
        mfs = train(R, label, target=target, **kw)
    rows = [b.summary(mf, target or None) for mf in mfs.values()]
    click.echo(b.markdown(rows, target or None))
    calls = b.calls_markdown(rows)
    if calls:
        click.echo("\nWhere a block call's time went (ms per call, medians over the epochs "
                   "after the first; busy counts from the call's sending to its end, per "
                   "slot):\n" + calls)
    write_json(json_path, {"data": label, "k": kw["k"], "gpu_warps": gpu_warps, "rows": rows,
                           "history": {m: mf.history_ for m, mf in mfs.items()}})


@bench.command("mf-scaling")
@opt.optional_ratings
@click.option("--synthetic", default="480189x17770:2e7", show_default=True,
              metavar="USERSxITEMS:RATINGS", callback=_synthetic_ratings,
              help="Planted low-rank ratings when no RATINGS file is given (Netflix's shape; "
              "the target's size is 480189x17770:1e8).")
@opt.k(128, "Rank of the factors.")
@click.option("--iters", default=20, show_default=True, type=click.IntRange(min=3),
              help="Gradient steps of each fit (the median leaves out the first two).")
@click.option("--lr", default=0.01, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Adam's step size.")
@opt.dtype()
@opt.worker_counts()
@opt.worker_kind
@opt.json_out()
@opt.plot("speedup against workers")
def bench_mf_scaling(ratings: str | None, synthetic: tuple[int, int, int], k: int, iters: int,
                     lr: float, dtype: str, workers: tuple[int, ...], device: str,
                     json_path: str | None, plot: str | None) -> None:
    """GradientMF's step (SDDMM + 2 SpMM + Adam) on one device and on 1, 2, 4, … workers.

    Each cluster fit is one SPMD call (V's gradient all-reduced between the workers, NCCL
    on GPU workers). Reports the median time of a whole step, the speedup against one
    device and the largest relative difference of the training RMSE curve from one
    device's, all from one run.
    """
    from mgpu.bench import mf_scaling as b

    counts = _check_gpu_workers(workers, device)
    t0 = time.perf_counter()
    if ratings is not None:
        R, label = load_ratings(ratings).matrix, Path(ratings).name
    else:
        from mgpu.synthetic import planted_ratings

        R = planted_ratings(*synthetic, noise=0.5, seed=0)
        label = f"planted {synthetic[0]:,}×{synthetic[1]:,}"
    R = R.tocsr().astype(dtype)
    click.echo(f"{label}: {R.shape[0]:,} users × {R.shape[1]:,} items, {R.nnz:,} {dtype} "
               f"ratings (ready in {time.perf_counter() - t0:.0f} s); k={k}, {iters} steps")
    rows = b.scaling(R, k, iters, counts, lr=lr, gpus=_GPUS[device], progress=click.echo)
    click.echo(b.scaling_markdown(rows, label))
    write_json(json_path, rows)
    if plot is not None:
        cluster = [r for r in rows if isinstance(r["workers"], int)]
        # the plot's speedup is against its first worker count, the table's against one device
        base = cluster[0]["median_step_s"] if cluster else 1.0
        _plots.scaling([dict(r, speedup=base / r["median_step_s"]) for r in cluster],
                       f"GradientMF step, {label}, k={k}", plot,
                       lambda r: f"{r['median_step_s'] * 1e3:.1f} ms")
    plotted(plot)


@bench.command("spmv")
@click.argument("inputs", nargs=-1, type=click.Path(exists=True))
@opt.powerlaw_specs
@click.option("--banded", "banded", multiple=True, metavar="NxWIDTH", type=opt.Shape(),
              help="Add an N x N band of WIDTH diagonals (repeatable), e.g. 4000000x11: every "
              "row the same length, neighbouring columns.")
@opt.device(("auto", "cpu", "gpu"), "auto")
@opt.repeats(10)
@opt.json_out()
@opt.plot("time against nnz (both methods)")
def bench_spmv_cmd(inputs: tuple[str, ...], powerlaw: list[Any], banded: tuple[Any, ...],
                   device: str, repeats: int, json_path: str | None, plot: str | None) -> None:
    """Merge-path SpMV against cuSPARSE (GPU) or scipy (CPU) on real and synthetic matrices,
    and how closely the time follows nnz (the merge path's promise)."""
    from mgpu.bench import spmv as b

    if not (inputs or powerlaw or banded):
        raise click.UsageError("give matrix files (INPUTS), --powerlaw ROWSxCOLS:NNZ and/or "
                               "--banded NxWIDTH")
    mats = [(Path(path).name, load_matrix(path).tocsr()) for path in inputs]
    mats += b.synthetic_matrices(powerlaw, banded)
    rows = b.bench_spmv(mats, repeats, device=device)
    text, r = b.report(rows, n_files=len(inputs))
    click.echo(text)
    write_json(json_path, {"rows": rows, "nnz_time_correlation": r})
    if plot is not None:
        _plots.spmv(rows, r, plot)
    plotted(plot)


@bench.command("jaccard")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(exists=True))
@opt.device(("cpu", "gpu"), "cpu")
@opt.repeats(5)
@opt.json_out()
def bench_jaccard(inputs: tuple[str, ...], device: str, repeats: int,
                  json_path: str | None) -> None:
    """Jaccard weights of real graphs: mgpu's kernel against the SpGEMM route (A·A at A's
    pattern; scipy on the CPU, cuSPARSE through cupyx on the GPU), edges per second."""
    from mgpu import io
    from mgpu.bench import jaccard as b

    rows = []
    for path in inputs:
        try:
            G = io.load_snap(path, symmetric=True, dtype=np.float64) \
                if io.detect_format(path) == "snap" else io.load(path)
        except (ValueError, FileNotFoundError, TypeError) as exc:  # a file it cannot read
            raise data_error(exc) from exc
        r = b.bench_graph(G, device, repeats)
        r["graph"] = Path(path).name
        rows.append(r)
        click.echo(b.markdown([r]).splitlines()[-1] if len(rows) > 1 else b.markdown([r]))
    write_json(json_path, rows)


def _size(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """--size: bytes, or a size such as 1GB or 256MiB; at least 4 bytes (one float32)."""
    from dask.utils import parse_bytes

    try:
        n = parse_bytes(value)
    except (ValueError, TypeError):
        raise click.BadParameter(f"expected a size such as 1GB or 256MiB, got {value!r}",
                                 ctx, param) from None
    if n < 4:
        raise click.BadParameter(f"must be at least 4 bytes (one float32), got {value!r}",
                                 ctx, param)
    return n


def _pool_size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """--rmm-pool: a size, refused here when rmm is not installed."""
    import importlib.util

    if value is None:
        return None
    if importlib.util.find_spec("rmm") is None:
        raise click.BadParameter("needs rmm: pip install 'mgpu[ucx]' (or rmm-cu13)", ctx, param)
    return _size(ctx, param, value)


def _protocols(ctx: click.Context, param: click.Parameter, value: str | None
               ) -> tuple[str, ...]:
    """--protocols: a comma-separated list of mgpu.connect's protocols, UCX refused when
    distributed-ucxx is missing; default tcp, and ucx where it is installed."""
    from mgpu.distributed.protocol import PROTOCOLS, UCX_INSTALL, ucx_available

    if value is None:
        return ("tcp", "ucx") if ucx_available() else ("tcp",)
    names = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    bad = [v for v in names if v not in PROTOCOLS]
    if bad or not names:
        raise click.BadParameter(f"expected protocols among {', '.join(sorted(PROTOCOLS))}, "
                                 f"got {value!r}", ctx, param)
    if "ucx" in names and not ucx_available():
        raise click.BadParameter(f"ucx needs distributed-ucxx: {UCX_INSTALL}", ctx, param)
    return names


@bench.command("transfer")
@click.option("--size", default="1GB", show_default=True, callback=_size,
              help="Bytes of the float32 array moved (1GB, 256MiB, ...).")
@click.option("--protocols", default=None, callback=_protocols,
              help="Comma-separated protocols to compare (default: tcp, and ucx when "
              "distributed-ucxx is installed).")
@opt.device(("auto", "cpu", "gpu"), "auto", "Move a CuPy array between two GPU workers "
            "(gpu; auto when GPUs are visible) or a numpy array between two CPU workers.")
@click.option("--rmm-pool", default=None, callback=_pool_size,
              help="GPU workers: an RMM pool of this size on each (e.g. 8GB, at least three "
              "times --size), for every protocol; UCX then maps GPU memory between the "
              "workers once (needs rmm, which mgpu[ucx] brings).")
@opt.repeats(5, "Timed moves (median), after one warm-up move.")
@opt.json_out()
def bench_transfer_cmd(size: int, protocols: tuple[str, ...], device: str,
                       rmm_pool: int | None, repeats: int, json_path: str | None) -> None:
    """GB/s of one array moved by Dask between two workers, over TCP and UCX.

    Each protocol gets its own embedded cluster of two workers; the receiving worker's record
    of the fetch gives the transfer time, and the task's round trip from here is shown
    beside it. Data that stays in Dask (tiles, gathered results) moves this way; the SPMD
    fits' collectives do not (they use NCCL between GPUs).
    """
    from mgpu.bench.transfer import bench_transfer, transfer_markdown
    from mgpu.distributed import visible_gpus

    n_gpus = visible_gpus()
    gpu = device == "gpu" or (device == "auto" and n_gpus > 0)
    if gpu and n_gpus < 2:
        raise click.UsageError(f"bench transfer between GPU workers needs 2 GPUs; {n_gpus} "
                               "visible. Pass --device cpu to move a host array between two "
                               "CPU workers instead.")
    if rmm_pool is not None and not gpu:
        raise click.UsageError("--rmm-pool is for GPU workers; leave it out with --device cpu.")
    from mgpu.distributed.protocol import ucx_available

    if "ucx" not in protocols and not ucx_available():
        click.echo("ucx: not measured, distributed-ucxx is not installed (pip install "
                   "'mgpu[ucx]')")
    click.echo(f"moving {size / 1e9:.3g} GB of float32 between two {'GPU' if gpu else 'CPU'} "
               f"workers over {', '.join(protocols)}; {repeats} repeats"
               + (f", an RMM pool of {rmm_pool / 1e9:.3g} GB on each" if rmm_pool else ""))
    rows = bench_transfer(size, protocols, gpu=gpu, repeats=repeats, rmm_pool=rmm_pool,
                          progress=click.echo)
    click.echo(transfer_markdown(rows))
    write_json(json_path, rows)

