"""``mgpu bench ann``: the proximity-graph index against exact kNN and the CPU graph
indexes, one run (:mod:`mgpu.bench.ann`); ``mgpu bench ann-scaling``: the index sharded
over a cluster against one device (:mod:`mgpu.bench.ann_scaling`)."""
from __future__ import annotations

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


@click.command("ann-scaling", cls=Command)
@click.argument("input", required=False, type=click.Path(exists=True))
@click.option("--clustered", default=None, type=opt.Shape(), metavar="ROWSxDIMS",
              help="Synthetic dense rows around 100 centres instead of INPUT.")
@click.option("--queries", default=100000, show_default=True, type=click.IntRange(1),
              help="Rows held out as queries (the last ones), all searched in every call.")
@click.option("--truth-queries", default=10000, show_default=True, type=click.IntRange(1),
              help="The first queries scored against exact neighbours (recall@k).")
@opt.worker_counts("4")
@click.option("--metric", default="euclidean", show_default=True,
              type=click.Choice(("euclidean", "sqeuclidean", "cosine")))
@opt.k(10, "Neighbours a query asks for (recall@k).")
@click.option("--degree", default=32, show_default=True, type=click.IntRange(2),
              help="Links a vertex keeps.")
@click.option("--build-candidates", default=64, show_default=True, type=click.IntRange(1),
              help="Candidates of the build's searches.")
@opt.int_list("--candidates", "16,32,64", "Candidates of the searches timed.")
@opt.int_list("--probes", "1,2", "Shards a query is searched in, partitioned by clusters.")
@click.option("--partitions", default="clusters,rows", show_default=True,
              help="How the sharded index is cut: clusters, rows, or both.")
@click.option("--batch", default=1024, show_default=True, type=click.IntRange(1),
              help="Rows the graph's build inserts at a time.")
@click.option("--gpu", is_flag=True, help="GPU workers, float32 rows, one GPU as the base.")
@opt.repeats(3, "Timed calls of each search (median), after one untimed call.")
@opt.json_out()
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
