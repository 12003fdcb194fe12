"""The balance of mgpu's nnz-balanced splits: ``mgpu run partition`` and ``mgpu bench
partition``.

:func:`spread` places a matrix on a cluster and checks the chunks by computing the row norms
on the workers; :func:`split_rows` times the splits of real datasets and compares their
imbalance with the bound 1 + w/(nnz/P), w the largest row or column.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["PARTITION_SETS", "per_worker", "split_markdown", "split_rows", "spread"]

# Real datasets the partition benchmark reads, relative to the data folder.
PARTITION_SETS = (
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


def spread(S: Any, parts: int | None, axis: int, client: Any,
           progress: Callable[[int], Any] | None = None) -> dict[str, Any]:
    """Place ``S`` on the workers of ``client`` in nnz-balanced chunks along ``axis`` and
    check them.

    Returns a dict: ``nnz`` (per chunk), ``sizes`` (rows or columns per chunk), ``bounds``
    (the chunks' first index, and the end), ``owners`` (the worker holding each chunk),
    ``max_rel_err`` (row norms on the workers against the same done here, over the rows whose
    norm is finite; infinite where the two disagree on which are not) and ``nonfinite_rows``
    (how many rows have a NaN or infinite norm).
    """
    import mgpu
    from mgpu.backends import to_host
    from mgpu.distributed import chunk_nnz, chunk_workers, from_scipy

    x = from_scipy(S, parts, axis=axis, client=client, progress=progress)
    per_chunk = chunk_nnz(x).ravel()
    where = chunk_workers(x, client)
    got = to_host(mgpu.row_norms(x, norm="l2").compute())
    want = mgpu.row_norms(S.tocsr(), norm="l2")
    err, nonfinite = _rel_err(got, want)
    owners = [where.get((i, 0) if axis == 0 else (0, i), ("-",))[0]
              for i in range(len(per_chunk))]
    return {"nnz": per_chunk, "sizes": x.chunks[axis], "owners": owners,
            "bounds": np.concatenate([[0], np.cumsum(x.chunks[axis])]), "max_rel_err": err,
            "nonfinite_rows": nonfinite}


def _rel_err(got: np.ndarray, want: np.ndarray) -> tuple[float, int]:
    """The largest relative difference of the finite row norms, and how many rows are NaN or
    infinite; where the two disagree on which rows those are, the difference is infinite
    (a NaN in either used to make the check pass: NaN compares false with any bound).

    >>> _rel_err(np.array([1.0, np.nan]), np.array([1.0, np.nan]))
    (0.0, 1)
    >>> _rel_err(np.array([1.0, 2.0]), np.array([1.0, np.nan]))
    (inf, 1)
    """
    fin = np.isfinite(want)
    if not np.array_equal(fin, np.isfinite(got)) or not np.array_equal(
            np.isnan(want), np.isnan(got)):
        return float("inf"), int((~fin).sum())
    err = np.abs(got[fin] - want[fin]) / np.maximum(np.abs(want[fin]), 1e-30)
    return float(np.max(err, initial=0.0)), int((~fin).sum())


def per_worker(placed: dict[str, Any]) -> dict[str, int]:
    """Nonzeros per worker of a :func:`spread`, by worker address."""
    out: dict[str, int] = {}
    for w, v in zip(placed["owners"], placed["nnz"]):
        out[w] = out.get(w, 0) + int(v)
    return out


def split_rows(root: Path, parts: Sequence[int],
               sets: Sequence[str] = PARTITION_SETS) -> Iterator[dict[str, Any]]:
    """For each dataset under ``root`` (None where it is missing), each axis and each part
    count: the imbalance of mgpu's split, its bound, and the split's time."""
    from mgpu import io
    from mgpu.partition import axis_counts, imbalance, part_sums, split_counts

    for rel in sets:
        path = root / rel
        if not path.exists():
            yield {"dataset": rel, "missing": True}
            continue
        data = io.load(str(path))
        S = getattr(data, "matrix", data)
        for axis in (0, 1):
            counts = axis_counts(S, axis)
            w = int(counts.max(initial=0))
            for p in parts:
                t = time.perf_counter()
                b = split_counts(counts, p)
                ms = 1e3 * (time.perf_counter() - t)
                mean = S.nnz / p
                yield {"dataset": Path(rel).name, "shape": S.shape, "nnz": S.nnz, "axis": axis,
                       "parts": p, "max_w": w, "mean": mean,
                       "imbalance": imbalance(part_sums(counts, b)), "bound": 1 + w / mean,
                       "split_ms": ms}


def split_markdown(rows: Iterator[dict[str, Any]]) -> Iterator[str]:
    """The lines of :func:`split_rows` as a Markdown table, as they come."""
    yield ("| dataset | shape | nnz | axis | P | max w | nnz/P | imbalance | 1 + w/(nnz/P) | "
           "split ms |")
    yield "|---|---|---|---|---|---|---|---|---|---|"
    for r in rows:
        if r.get("missing"):
            yield f"| {r['dataset']} | missing | | | | | | | | |"
            continue
        m, n = r["shape"]
        yield (f"| {r['dataset']} | {m:,}×{n:,} | {r['nnz']:,} | "
               f"{'rows' if r['axis'] == 0 else 'cols'} | {r['parts']} | {r['max_w']:,} | "
               f"{r['mean']:,.0f} | {r['imbalance']:.4f} | {r['bound']:.4f} | "
               f"{r['split_ms']:.1f} |")
