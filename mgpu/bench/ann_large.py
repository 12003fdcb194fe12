"""``mgpu bench ann-large``: a graph index larger than one GPU's memory, made, built and
searched on a cluster's workers, in one run.

The rows never pass through the client: each worker makes its own row tile of dense rows
around ``centres`` shared centres (those of :func:`mgpu.synthetic.clustered_rows`: standard
normal times 4, each row a centre plus standard normal noise; float32 on GPU workers), and
the queries are rows of the same centres made on the client. The size is given in rows, or
(GPU workers) as a multiple of one worker's device memory: the index's rows and graph
(``rows × (dims × 4 + degree × 4)`` bytes) then need that many GPUs' memory, and no one
GPU holds it.

In order: the exact k nearest of the first ``truth_queries`` queries, by mgpu's exact kNN
across the same workers (timed: its queries/s is the exact search's row of the table);
the index fitted on the dask array of tiles (:class:`mgpu.models.GraphIndex`, sharded by
``partition``), its build timed; then every query searched at each ``candidates`` (and,
cut by clusters, each ``probes``), the median of ``repeats`` calls after an untimed one,
recall@k scored on the first ``truth_queries``. Cut by clusters, the tiles are let go once
the shards hold their rows, and the queries are a dask array on the workers, answered
there; cut by rows, the shards are the tiles, and the queries go from the client.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mgpu.backends import to_device
from mgpu.backends.memory import gpu_available
from mgpu.backends.timing import time_cpu
from mgpu.bench.ann import recall

__all__ = ["bench_ann_large", "large_markdown"]

_STEP = 1 << 20  # rows a worker makes at a time
# rows a tile: a worker's rows are made in tiles of at most this many, each within what the
# exact kNN prepares at once on a device
_TILE = 1 << 23


def _rows_near(centres: np.ndarray, n: int, seed: int, gpu: bool) -> Any:
    """``n`` float32 rows, each a random centre plus standard normal noise (CuPy with
    ``gpu``), made ``_STEP`` rows at a time."""
    if gpu:  # cuRAND's generator: randint, and normal values made as float32
        import cupy as xp

        rng = xp.random.RandomState(seed)
    else:
        xp = np
        rng = np.random.RandomState(seed)
    C = xp.asarray(centres, dtype=np.float32)
    out = xp.empty((n, C.shape[1]), dtype=np.float32)
    for lo in range(0, n, _STEP):
        m = int(min(_STEP, n - lo))
        noise = (rng.standard_normal((m, C.shape[1]), dtype=np.float32) if gpu else
                 rng.standard_normal((m, C.shape[1])).astype(np.float32))
        out[lo:lo + m] = C[rng.randint(0, C.shape[0], m)] + noise
    return out


def _made(client: Any, centres: np.ndarray, bounds: np.ndarray, names: list[str],
          seed: int, gpu: bool) -> Any:
    """The dask array of the rows, made and held by the workers (rows ``bounds[i]`` to
    ``bounds[i + 1]`` on ``names[i]``, in tiles of at most ``_TILE`` rows)."""
    import dask.array as da
    from distributed import wait

    d = centres.shape[1]
    cuts = []  # (first row, end, worker) of each tile
    for i, w in enumerate(names):
        first, end = int(bounds[i]), int(bounds[i + 1])
        cuts += [(lo, min(end, lo + _TILE), w) for lo in range(first, end, _TILE)]
    shared = client.scatter(centres, broadcast=True)  # sent to each worker once
    futures = [client.submit(_rows_near, shared, hi - lo, seed + 1 + j, gpu, workers=[w],
                             allow_other_workers=False, pure=False)
               for j, (lo, hi, w) in enumerate(cuts)]
    wait(futures)
    for f in futures:
        if f.status == "error":
            f.result()  # raises the worker's error (its device's memory ran out, say)
    meta = np.empty((0, 0), dtype=np.float32)
    meta = to_device(meta) if gpu else meta  # the tiles' kind: CuPy on GPU workers
    X = da.concatenate([da.from_delayed(f, (hi - lo, d), dtype=np.float32, meta=meta)
                        for f, (lo, hi, _) in zip(futures, cuts)])
    X = client.persist(X)
    wait(X)
    return X


def bench_ann_large(*, rows: int | None = None, memory: float | None = None, dims: int = 128,
                    centres: int = 100, workers: int = 4, gpu: bool = False, k: int = 10,
                    metric: str = "euclidean", degree: int = 32, build_candidates: int = 64,
                    candidates: Sequence[int] = (64, 128, 256),
                    probes: Sequence[int] = (1, 2), partition: str = "clusters",
                    queries: int = 100000, truth_queries: int = 10000, repeats: int = 3,
                    batch: int = 4096, seed: int = 0,
                    progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Make, build and search the index on an embedded cluster of ``workers`` (GPU workers
    with ``gpu``): ``rows`` rows of ``dims`` columns, or (``gpu``) as many as make the
    index ``memory`` times one worker's device memory. A dict: the sizes, the build's
    seconds, each shard's rows, and ``results``, a row a search (the exact kNN's first).
    """
    from mgpu.bench.ann_scaling import _placed
    from mgpu.distributed import connect
    from mgpu.distributed.cluster import workers_now
    from mgpu.models import GraphIndex

    if (rows is None) == (memory is None):
        raise ValueError("give one of rows and memory")
    if memory is not None and not gpu:
        raise ValueError("memory (a multiple of one GPU's memory) needs GPU workers")
    say = progress or (lambda line: None)
    per_row = dims * 4 + degree * 4  # a row's float32 values and its links (int32)
    where = f"{workers} GPU{'s' if workers > 1 else ''}" if gpu else \
        f"{workers} CPU worker{'s' if workers > 1 else ''}"
    rng = np.random.default_rng(seed)
    C = rng.standard_normal((centres, dims)) * 4
    Q = _rows_near(C, queries, seed, False)  # the tiles' seeds follow: no tile repeats them
    nt = min(truth_queries, queries)
    with connect(n_workers=workers, gpus=gpu) as client:
        names = sorted(workers_now(client))[:workers]
        # one worker's device memory (its capacity: CuPy's pool limit, where smaller)
        device = (client.run(gpu_available, workers=names[:1])[names[0]][1] if gpu
                  else None)
        n = int(rows) if rows is not None else int(np.ceil(memory * device / per_row))
        if n < len(names):
            raise ValueError(f"{n} rows cannot be cut into a tile on each of "
                             f"{len(names)} workers")
        say(f"{n:,} rows x {dims}: the index (rows and graph) is {n * per_row / 1e9:.1f} GB"
            + ("" if device is None else
               f", {n * per_row / device:.2f} x one worker's GPU ({device / 1e9:.1f} GB)"))
        bounds = np.linspace(0, n, len(names) + 1).round().astype(np.int64)
        t0 = time.perf_counter()
        X = _made(client, C, bounds, names, seed, gpu)
        say(f"made on the workers in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        import mgpu

        _, truth = mgpu.knn(X, Q[:nt], k, metric=metric)
        truth_s = time.perf_counter() - t0
        say(f"exact kNN of {nt:,} queries across {where}: {truth_s:.1f} s")
        results = [{"method": f"mgpu exact kNN ({where})", "candidates": None,
                    "probes": None, "qps": nt / truth_s, "job_qps": None, "recall": 1.0}]
        index = GraphIndex(k, metric=metric, degree=degree, candidates=build_candidates,
                           batch=batch, partition=partition)
        if gpu:  # each worker's kernels compiled before the build is timed
            index.fit(_placed(client, Q[:64 * len(names)], len(names), gpu))
        shown = [0.0]

        def built(done: int, total: int) -> None:
            if done == total or done / total >= shown[0] + 0.1:
                shown[0] = done / total
                say(f"built {done / total:.0%} ({time.perf_counter() - t0:.0f} s)")

        t0 = time.perf_counter()
        index.fit(X, progress=built)
        build_s = time.perf_counter() - t0
        shards = list(index._shards.rows)
        say(f"build: {build_s:.1f} s, shards of {', '.join(f'{r:,}' for r in shards)} rows")
        if partition == "clusters":
            del X  # the shards hold their rows: the tiles go
            queries_in: Any = _placed(client, Q, len(names), gpu)
        else:
            queries_in = Q
        for p in probes if partition == "clusters" else (None,):
            method = f"mgpu graph, {where}, " + (f"clusters, probes {p}" if p else "rows")
            index.set_params(probes=p or 1)
            for c in candidates:
                index.set_params(candidates=max(c, k))
                ids = np.asarray(index.kneighbors(queries_in, return_distance=False))
                s = time_cpu(lambda: index.kneighbors(queries_in, return_distance=False),
                             repeats=repeats, warmup=0)
                job = float(np.median(index._shards.seconds[-repeats:])) if p else None
                results.append({"method": method, "candidates": c, "probes": p,
                                "qps": queries / s,
                                "job_qps": None if job is None else queries / job,
                                "recall": recall(ids[:nt], truth)})
                say(f"{method}, candidates {c}: {results[-1]['qps']:,.0f} q/s, "
                    f"recall@{k} {results[-1]['recall']:.3f}")
    return {"rows": n, "dims": dims, "centres": centres, "workers": len(names),
            "gpu": gpu, "index_bytes": n * per_row, "device_bytes": device,
            "partition": partition, "build_s": build_s, "shards": shards,
            "truth_queries": nt, "queries": queries, "k": k, "metric": metric,
            "results": results}


def large_markdown(result: dict[str, Any]) -> str:
    """The run as a line of sizes and a Markdown table, a row a search.

    >>> print(large_markdown({"rows": 1000, "dims": 8, "index_bytes": 64000,
    ...     "device_bytes": None, "build_s": 1.5, "shards": [600, 400], "k": 10,
    ...     "results": [{"method": "exact", "candidates": None, "qps": 10.0,
    ...                  "job_qps": None, "recall": 1.0},
    ...                 {"method": "graph", "candidates": 32, "qps": 900.0,
    ...                  "job_qps": 1000.0, "recall": 0.95}]}))
    1,000 rows x 8, index 0.0 GB; build 1.5 s; shards of 600, 400 rows
    <BLANKLINE>
    | method | candidates | queries/s | in the job | recall@10 |
    |---|---|---|---|---|
    | exact | | 10 | | 1.000 |
    | graph | 32 | 900 | 1,000 | 0.950 |
    """
    device = result["device_bytes"]
    head = (f"{result['rows']:,} rows x {result['dims']}, index "
            f"{result['index_bytes'] / 1e9:.1f} GB"
            + ("" if device is None else
               f" ({result['index_bytes'] / device:.2f} x one GPU's {device / 1e9:.1f} GB)")
            + f"; build {result['build_s']:.1f} s; shards of "
            + ", ".join(f"{r:,}" for r in result["shards"]) + " rows")
    lines = [head, "", f"| method | candidates | queries/s | in the job | recall@{result['k']} |",
             "|---|---|---|---|---|"]
    for r in result["results"]:
        job = "" if r["job_qps"] is None else f"{r['job_qps']:,.0f}"
        c = "" if r["candidates"] is None else str(r["candidates"])
        lines.append(f"| {r['method']} | {c} | {r['qps']:,.0f} | {job} | {r['recall']:.3f} |")
    return "\n".join(lines)
