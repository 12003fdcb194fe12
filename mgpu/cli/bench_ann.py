"""``mgpu bench ann``: the proximity-graph index against exact kNN and the CPU graph
indexes, one run (:mod:`mgpu.bench.ann`); ``mgpu bench ann-scaling``: the index sharded
over a cluster against one device (:mod:`mgpu.bench.ann_scaling`); ``mgpu bench ann-large``:
an index too big for one GPU, sharded (:mod:`mgpu.bench.ann_large`)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
import numpy as np

from mgpu.cli import _options as opt
from mgpu.cli import _plots
from mgpu.cli._errors import Command
from mgpu.cli._inputs import load_vectors
from mgpu.cli._output import plotted, write_json

_METRICS = ("euclidean", "sqeuclidean", "cosine", "inner_product")


def _clustered(shape: tuple[int, int]) -> tuple[np.ndarray, str]:
    """--clustered ROWSxDIMS: the rows (mgpu.synthetic.clustered_rows) and their label."""
    from mgpu.synthetic import clustered_rows

    return clustered_rows(*shape), f"clustered {shape[0]:,} x {shape[1]} (100 centres)"


def _held_out(X: Any, queries: int) -> tuple[Any, Any]:
    """The index rows and the last ``queries`` rows, held out as queries."""
    if X.shape[0] <= queries:
        raise click.UsageError(f"--queries {queries} leaves no index: the input has "
                               f"{X.shape[0]:,} rows")
    return X[:-queries], X[-queries:]


@click.command("ann", cls=Command)
@click.argument("input", required=False, type=click.Path(exists=True))
@click.option("--clustered", default=None, type=opt.Shape(), metavar="ROWSxDIMS",
              help="Synthetic dense rows around 100 centres instead of INPUT.")
@click.option("--tfidf", default=None, type=opt.Shape(), metavar="ROWSxTERMS",
              help="Synthetic sparse TF-IDF rows of 100 topics (mgpu.synthetic.topic_tfidf) "
                   "instead of INPUT.")
@click.option("--queries", default=1000, show_default=True, type=click.IntRange(1),
              help="Rows held out as queries (the last ones of INPUT).")
@click.option("--metric", default="euclidean", show_default=True,
              type=click.Choice(_METRICS))
@opt.k(10, "Neighbours a query asks for (recall@k).")
@click.option("--degree", default=32, show_default=True, type=click.IntRange(2),
              help="Links a vertex keeps (hnswlib's and Faiss's M is half of it).")
@click.option("--build-candidates", default=64, show_default=True, type=click.IntRange(1),
              help="Candidates of the build's searches (the peers' efConstruction).")
@opt.int_list("--candidates", "16,32,64,128",
              "Candidates of the searches timed, comma-separated (the peers' efSearch).")
@click.option("--batch", default=1024, show_default=True, type=click.IntRange(1),
              help="Rows the graph's build inserts at a time.")
@click.option("--gpu", is_flag=True,
              help="mgpu's graph index and exact kNN on the GPU (float32); peers on the CPU.")
@opt.repeats(3, "Timed calls of each search (median), after one untimed call.")
@opt.json_out()
@opt.plot("queries/s against recall@k of each method")
def bench_ann_cmd(input: str | None, clustered: tuple[int, int] | None,
                  tfidf: tuple[int, int] | None, queries: int,
                  metric: str, k: int, degree: int, build_candidates: int,
                  candidates: tuple[int, ...], batch: int, gpu: bool, repeats: int,
                  json_path: str | None, plot: str | None) -> None:
    """Recall@k and queries/s of mgpu's proximity-graph index (mgpu.models.GraphIndex) at
    each --candidates, against mgpu's exact kNN (the ground truth) and, where installed,
    hnswlib and Faiss's HNSW on all cores, on INPUT's rows (a dense vectors file or a
    sparse matrix), --clustered or --tfidf ones; with each index's build time.
    """
    from mgpu.bench.ann import bench_ann, markdown

    if sum(x is not None for x in (input, clustered, tfidf)) != 1:
        raise click.UsageError("give one of an input file (INPUT), --clustered ROWSxDIMS "
                               "and --tfidf ROWSxTERMS")
    if input is not None:
        X, label = load_vectors(input), click.format_filename(input)
    elif tfidf is not None:
        from mgpu.synthetic import topic_tfidf

        X = topic_tfidf(*tfidf)
        label = f"TF-IDF {tfidf[0]:,} x {tfidf[1]:,} (100 topics)"
    else:
        X, label = _clustered(clustered)
    index, held = _held_out(X, queries)
    click.echo(f"{label}: index of {index.shape[0]:,} rows, {queries:,} queries, "
               f"{metric}, k={k}")
    rows = bench_ann(index, held, k=k, metric=metric, degree=degree,
                     build_candidates=build_candidates, candidates=candidates,
                     repeats=repeats, gpu=gpu, batch=batch, progress=click.echo)
    click.echo(markdown(rows, k))
    write_json(json_path, {"input": label, "metric": metric, "k": k, "gpu": gpu,
                           "batch": batch, "rows": rows})
    if plot is not None:
        _plots.ann(rows, f"{label}, {metric}, k={k}", plot)
    plotted(plot)


def _sharded_options(candidates: str, batch: int) -> Callable[[Any], Any]:
    """The options of the sharded index's benchmarks: recall's queries, the metric and k,
    the graph's build, the searches timed (``--candidates`` and ``--batch`` defaults
    given), their repeats and the JSON file."""
    options = [
        click.option("--truth-queries", default=10000, show_default=True,
                     type=click.IntRange(1),
                     help="The first queries scored against exact neighbours (recall@k)."),
        click.option("--metric", default="euclidean", show_default=True,
                     type=click.Choice(("euclidean", "sqeuclidean", "cosine"))),
        opt.k(10, "Neighbours a query asks for (recall@k)."),
        click.option("--degree", default=32, show_default=True, type=click.IntRange(2),
                     help="Links a vertex keeps."),
        click.option("--build-candidates", default=64, show_default=True,
                     type=click.IntRange(1), help="Candidates of the build's searches."),
        opt.int_list("--candidates", candidates, "Candidates of the searches timed."),
        opt.int_list("--probes", "1,2",
                     "Shards a query is searched in, partitioned by clusters."),
        click.option("--batch", default=batch, show_default=True, type=click.IntRange(1),
                     help="Rows the graph's build inserts at a time."),
        opt.repeats(3, "Timed calls of each search (median), after one untimed call."),
        opt.json_out(),
    ]

    def apply(f: Any) -> Any:
        for option in reversed(options):
            f = option(f)
        return f

    return apply


@click.command("ann-scaling", cls=Command)
@click.argument("input", required=False, type=click.Path(exists=True))
@click.option("--clustered", default=None, type=opt.Shape(), metavar="ROWSxDIMS",
              help="Synthetic dense rows around 100 centres instead of INPUT.")
@click.option("--queries", default=100000, show_default=True, type=click.IntRange(1),
              help="Rows held out as queries (the last ones), all searched in every call.")
@opt.worker_counts("4")
@click.option("--partitions", default="clusters,rows", show_default=True,
              help="How the sharded index is cut: clusters, rows, or both.")
@_sharded_options("16,32,64", 1024)
@click.option("--gpu", is_flag=True, help="GPU workers, float32 rows, one GPU as the base.")
@opt.plot("queries/s against recall@k, one device and sharded")
def bench_ann_scaling_cmd(input: str | None, clustered: tuple[int, int] | None, queries: int,
                          truth_queries: int, workers: tuple[int, ...], metric: str, k: int,
                          degree: int, build_candidates: int, candidates: tuple[int, ...],
                          probes: tuple[int, ...], partitions: str, batch: int, gpu: bool,
                          repeats: int, json_path: str | None, plot: str | None) -> None:
    """Recall@k and queries/s of mgpu's graph index sharded over each of --workers (cut by
    clusters, each query searched in its --probes nearest shards; cut by rows, every shard
    searching every query) against the same index on one device, in one run, on INPUT's
    dense rows or --clustered ones.
    """
    from mgpu.bench.ann_scaling import bench_ann_scaling, scaling_markdown

    cuts = tuple(p.strip() for p in partitions.split(",") if p.strip())
    if not cuts or set(cuts) - {"clusters", "rows"}:
        raise click.BadParameter(f"{partitions!r}: give clusters, rows, or clusters,rows",
                                 param_hint="--partitions")
    if (input is None) == (clustered is None):
        raise click.UsageError("give one of an input file (INPUT) and --clustered ROWSxDIMS")
    if input is not None:
        X, label = load_vectors(input), click.format_filename(input)
        if not isinstance(X, np.ndarray):
            raise click.UsageError(f"{label} holds sparse rows; the sharded index cut by "
                                   "clusters takes dense ones")
    else:
        X, label = _clustered(clustered)
    index, held = _held_out(X, queries)
    click.echo(f"{label}: index of {index.shape[0]:,} rows, {queries:,} queries, {metric}, "
               f"k={k}, workers {', '.join(map(str, workers))}")
    rows = bench_ann_scaling(index, held, workers=workers, k=k, metric=metric, degree=degree,
                             build_candidates=build_candidates, candidates=candidates,
                             probes=probes, partitions=cuts, truth_queries=truth_queries,
                             repeats=repeats, gpu=gpu, batch=batch, progress=click.echo)
    click.echo(scaling_markdown(rows, k))
    write_json(json_path, {"input": label, "metric": metric, "k": k, "gpu": gpu,
                           "workers": list(workers), "rows": rows})
    if plot is not None:
        _plots.ann(rows, f"{label}, {metric}, k={k}", plot)
    plotted(plot)


@click.command("ann-large", cls=Command)
@click.option("--rows", default=None, type=click.IntRange(1),
              help="Rows of the index (give this or --memory).")
@click.option("--memory", default=None, type=click.FloatRange(0, min_open=True),
              help="Rows enough that the index (rows and graph) is this multiple of one "
                   "worker's GPU memory (with --gpu; give this or --rows).")
@click.option("--dims", default=128, show_default=True, type=click.IntRange(1),
              help="Columns of the rows.")
@click.option("--centres", default=100, show_default=True, type=click.IntRange(1),
              help="Centres the rows lie around.")
@opt.worker_count(4)
@click.option("--partition", default="clusters", show_default=True,
              type=click.Choice(("clusters", "rows")),
              help="How the index is cut over the workers (GraphIndex's partition).")
@click.option("--queries", default=100000, show_default=True, type=click.IntRange(1),
              help="Queries, all searched in every call.")
@_sharded_options("64,128,256", 4096)
@click.option("--gpu", is_flag=True, help="GPU workers, float32 rows.")
@opt.plot("queries/s against recall@k, the graph index and the exact kNN")
def bench_ann_large_cmd(rows: int | None, memory: float | None, dims: int, centres: int,
                        workers: int, partition: str, probes: tuple[int, ...],
                        queries: int, truth_queries: int, metric: str, k: int, degree: int,
                        build_candidates: int, candidates: tuple[int, ...], batch: int,
                        gpu: bool, repeats: int, json_path: str | None,
                        plot: str | None) -> None:
    """A graph index too big for one GPU (--memory times its memory) or of --rows rows,
    made on the workers of an embedded cluster (rows around --centres centres; the client
    never holds them), built sharded over them (--partition) and searched: recall@k and
    queries/s at each --candidates (and --probes), and mgpu's exact kNN across the same
    workers, in one run.
    """
    from mgpu.bench.ann_large import bench_ann_large, large_markdown

    if (rows is None) == (memory is None):
        raise click.UsageError("give one of --rows and --memory")
    if memory is not None and not gpu:
        raise click.UsageError("--memory (a multiple of one GPU's memory) needs --gpu")
    result = bench_ann_large(rows=rows, memory=memory, dims=dims, centres=centres,
                             workers=workers, gpu=gpu, k=k, metric=metric, degree=degree,
                             build_candidates=build_candidates, candidates=candidates,
                             probes=probes, partition=partition, queries=queries,
                             truth_queries=truth_queries, repeats=repeats, batch=batch,
                             progress=click.echo)
    click.echo(large_markdown(result))
    write_json(json_path, result)
    if plot is not None:
        _plots.ann(result["results"], f"{result['rows']:,} x {dims} sharded over {workers} "
                   f"{'GPUs' if gpu else 'CPU workers'}, {metric}, k={k}", plot)
    plotted(plot)
