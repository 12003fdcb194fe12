"""``mgpu bench ann-scaling``: the graph index sharded over a cluster's workers against the
index on one device, in one run.

The one-device index (no cluster; the GPU with ``gpu``) is built and searched first, then
an embedded cluster of each number of ``workers`` is started, the rows and the queries are placed
on it in as many row tiles (not timed), and the index is fitted on the dask array in each
``partition`` (:class:`mgpu.models.GraphIndex`'s parameter):

- ``clusters``: each query searched in its ``probes`` nearest shards, one SPMD job a call;
  the queries are the dask array on the workers, and so are the answers. Two times are
  given: the whole call of ``kneighbors``, from the client to the answers held on the
  workers, and the job's own (its slowest rank, from the queries on its device to its
  merged lists: without Dask's start of the job and the answers' taking into its keeping);
- ``rows``: every shard searches every query; the queries go from the client (numpy).

Recall@k is scored on the first ``truth_queries`` queries, against mgpu's exact kNN on one
device; every search is of all the queries, the median of ``repeats`` calls after an
untimed one.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mgpu.backends import to_device, to_host
from mgpu.backends.timing import time_cpu
from mgpu.bench.ann import _searched, _timed, recall

__all__ = ["bench_ann_scaling", "scaling_markdown"]


def _one(method: str, workers: int | None, candidates: int, build_s: float, ids: np.ndarray,
         seconds: float, truth: np.ndarray, n_queries: int,
         job_seconds: float | None = None) -> dict[str, Any]:
    nt = truth.shape[0]
    return {"method": method, "workers": workers, "candidates": candidates,
            "build_s": build_s, "qps": n_queries / seconds,
            "job_qps": None if job_seconds is None else n_queries / job_seconds,
            "recall": recall(ids[:nt], truth), "note": None}


def bench_ann_scaling(X: np.ndarray, Q: np.ndarray, *, workers: Sequence[int], k: int = 10,
                      metric: str = "euclidean", degree: int = 32,
                      build_candidates: int = 64, candidates: Sequence[int] = (16, 32, 64),
                      probes: Sequence[int] = (1, 2),
                      partitions: Sequence[str] = ("clusters", "rows"),
                      truth_queries: int = 10000, repeats: int = 3, gpu: bool = False,
                      batch: int = 1024, progress: Callable[[str], None] | None = None
                      ) -> list[dict[str, Any]]:
    """Recall@k and queries/s of the one-device index and of the index sharded over each
    number of ``workers`` (each of ``partitions``; ``probes`` for ``clusters``), at each
    ``candidates``, on dense index rows X and queries Q (numpy): a row each, with the
    build's seconds. ``gpu``: float32 rows on the GPU and GPU workers.
    """
    import mgpu
    from mgpu.models import GraphIndex

    say = progress or (lambda line: None)
    X = np.ascontiguousarray(X, dtype=np.float32 if gpu else np.float64)
    Q = np.ascontiguousarray(Q, dtype=X.dtype)
    Xm, Qm = (to_device(X), to_device(Q)) if gpu else (X, Q)
    nt, nq = min(truth_queries, Q.shape[0]), Q.shape[0]
    _, truth = mgpu.knn(Xm, Qm[:nt], k, metric=metric)
    truth = to_host(truth)
    params = dict(metric=metric, degree=degree, candidates=max(build_candidates, k),
                  batch=batch)
    index = GraphIndex(k, **params)
    if gpu:  # the kernels compiled (NVRTC, once a process) before the build is timed
        _timed(lambda: index.fit(Xm[:min(64, Xm.shape[0])]), gpu)
    _, build_s = _timed(lambda: index.fit(Xm), gpu)
    one = "1 GPU" if gpu else "one process (CPU)"
    rows = []
    for c in candidates:
        index.set_params(candidates=max(c, k))
        (_, ids), s = _searched(lambda: index.kneighbors(Qm), repeats, gpu)
        rows.append(_one(one, None, c, build_s, to_host(ids), s, truth, nq))
        say(f"one device, candidates {c}: {rows[-1]['qps']:,.0f} q/s, recall@{k} "
            f"{rows[-1]['recall']:.3f} (build {build_s:.2f} s)")
    del index, Xm, Qm  # the one-device index leaves the GPU the first worker shares
    for n in workers:
        rows += _sharded(X, Q, n, k, params, candidates, probes, partitions, truth, repeats,
                         gpu, say)
    return rows


def _sharded(X: np.ndarray, Q: np.ndarray, workers: int, k: int, params: dict[str, Any],
             candidates: Sequence[int], probes: Sequence[int], partitions: Sequence[str],
             truth: np.ndarray, repeats: int, gpu: bool, say: Callable[[str], None]
             ) -> list[dict[str, Any]]:
    """The rows of one cluster size."""
    from mgpu.distributed import connect
    from mgpu.models import GraphIndex

    rows, nq = [], Q.shape[0]
    where = ("GPU" if gpu else "CPU worker") + ("s" if workers > 1 else "")
    with connect(n_workers=workers, gpus=gpu) as client:
        Xd, Qd = (_placed(client, A, workers, gpu) for A in (X, Q))
        for partition in partitions:
            index = GraphIndex(k, partition=partition, **params)
            if gpu:  # each worker's kernels compiled before the build is timed
                index.fit(_placed(client, X[:64 * workers], workers, gpu))
            _, build_s = _timed(lambda: index.fit(Xd))
            for p in probes if partition == "clusters" else (None,):
                method = (f"{workers} {where}, clusters, probes {p}" if p is not None
                          else f"{workers} {where}, rows")
                index.set_params(probes=p or 1)
                for c in candidates:
                    index.set_params(candidates=max(c, k))
                    queries = Qd if p is not None else Q
                    # queries on the workers are answered there: gathered here to score
                    ids = np.asarray(index.kneighbors(queries, return_distance=False))
                    s = time_cpu(lambda: index.kneighbors(queries, return_distance=False),
                                 repeats=repeats, warmup=0)
                    job = None
                    if p is not None:  # the timed calls' jobs (the index's shard handle)
                        job = float(np.median(index._shards.seconds[-repeats:]))
                    rows.append(_one(method, workers, c, build_s, ids, s, truth, nq, job))
                    say(f"{method}, candidates {c}: {rows[-1]['qps']:,.0f} q/s"
                        + ("" if job is None else f" ({rows[-1]['job_qps']:,.0f} in the job)")
                        + f", recall@{k} {rows[-1]['recall']:.3f} (build {build_s:.2f} s)")
            del index
    return rows


def _placed(client: Any, A: np.ndarray, workers: int, gpu: bool) -> Any:
    """A's rows as a dask array of ``workers`` row tiles held on the cluster, one a worker
    (sent straight from here; CuPy tiles on GPU workers)."""
    import dask.array as da
    from distributed import wait

    from mgpu.distributed.cluster import workers_now

    names = sorted(workers_now(client))
    bounds = np.linspace(0, A.shape[0], workers + 1).round().astype(np.int64)
    parts = [client.scatter(A[bounds[i]:bounds[i + 1]], workers=[names[i % len(names)]],
                            hash=False) for i in range(workers)]
    D = da.concatenate([da.from_delayed(f, (int(bounds[i + 1] - bounds[i]), A.shape[1]),
                                        dtype=A.dtype, meta=np.empty((0, 0), A.dtype))
                        for i, f in enumerate(parts)])
    if gpu:
        import cupy

        D = D.map_blocks(cupy.asarray, dtype=A.dtype, meta=cupy.empty((0, 0), A.dtype))
    D = client.persist(D)
    wait(D)
    del parts  # the host tiles go once the placed ones are made
    return D


def scaling_markdown(rows: Sequence[dict[str, Any]], k: int = 10) -> str:
    """The rows as a Markdown table, with each row's ratio to the one-device index's
    (``workers`` None) queries/s at the same candidates.

    >>> print(scaling_markdown([
    ...     {"method": "1 GPU", "workers": None, "candidates": 32, "build_s": 1.0,
    ...      "qps": 1000.0, "job_qps": None, "recall": 0.95, "note": None},
    ...     {"method": "4 GPUs, rows", "workers": 4, "candidates": 32, "build_s": 0.5,
    ...      "qps": 1500.0, "job_qps": None, "recall": 0.97, "note": None}]))
    | method | candidates | build s | queries/s | in the job | × one device | recall@10 |
    |---|---|---|---|---|---|---|
    | 1 GPU | 32 | 1.00 | 1,000 | | 1.00 | 0.950 |
    | 4 GPUs, rows | 32 | 0.50 | 1,500 | | 1.50 | 0.970 |
    """
    base = {r["candidates"]: r["qps"] for r in rows if r["workers"] is None}
    lines = [f"| method | candidates | build s | queries/s | in the job | × one device | "
             f"recall@{k} |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        job = "" if r["job_qps"] is None else f"{r['job_qps']:,.0f}"
        ratio = r["qps"] / base[r["candidates"]] if r["candidates"] in base else None
        lines.append(f"| {r['method']} | {r['candidates']} | {r['build_s']:.2f} | "
                     f"{r['qps']:,.0f} | {job} | "
                     f"{'' if ratio is None else f'{ratio:.2f}'} | {r['recall']:.3f} |")
    return "\n".join(lines)
