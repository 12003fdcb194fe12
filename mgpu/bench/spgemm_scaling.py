"""SpGEMM across workers (``mgpu bench spgemm-scaling``): ``mgpu.spgemm`` on 1, 2, 4, …
workers against the one-device product, in one run.

The one-device call (no cluster; the GPU when GPU workers are used) comes first, then an
embedded cluster of each size, where two calls are timed:

- ``parts=N``: scipy A and B, as a caller holding them would pass them; the time is the
  whole public call, from cutting A at prefix sums of the work to the wait for the last
  tile;
- held (SPMD): A and B placed on the workers beforehand (``mgpu.from_scipy``, not timed),
  as an application that keeps its matrices on the cluster holds them; the time is the
  whole call of ``mgpu.spgemm(A, B)`` on the two dask arrays, from the job's start to C's
  tiles held on the workers; once with A and B gathered on every worker (the default where
  they fit), once with B's tiles passed round the ring of workers.

Every C is checked against the one-device C on the workers that hold it: each tile's shape
and nnz, and a few of its rows, gathered and compared exactly (column indices equal, values
within the rounding of a float sum).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from numbers import Integral
from typing import Any

import numpy as np
import scipy.sparse as sp

from mgpu.backends import is_gpu_array, synchronize, to_host
from mgpu.bench.spgemm import choose_form, products
from mgpu.partition import imbalance, part_sums, spgemm_row_work

logger = logging.getLogger(__name__)

__all__ = ["HELD", "ONE_DEVICE", "PARTS", "RING", "bench_scaling", "operands", "scaling_markdown", "tile_rows_checked"]

ONE_DEVICE = "one device, no cluster"
"""The ``workers`` of the row timed without a cluster."""
PARTS = "parts=N"
"""The ``call`` of a row timed with scipy A and B (``mgpu.spgemm(A, B, parts=N)``)."""
HELD = "held, SPMD"
"""The ``call`` of a row timed with A and B held on the workers
(``mgpu.spgemm(from_scipy(A, N), from_scipy(B, N))``, placed before the timing)."""
RING = "held, ring"
"""The same call with ``mgpu.spgemm.held-operands`` set to ``ring``: B's tiles passed round
the workers instead of A and B gathered on each."""

_FUNC = "bench_scaling"


def operands(M: sp.spmatrix, form: str, name: str, dtype: Any = np.float32
             ) -> tuple[sp.csr_matrix, sp.csr_matrix, str]:
    """The operands of the run on the input ``name``: A (``M`` as CSR of ``dtype`` without
    duplicates), B (A for A·A, Aᵀ as CSR for A·Aᵀ) and the form taken (:func:`choose_form`
    of ``form``).

    Examples
    --------
    >>> A, B, how = operands(sp.random(6, 4, density=0.5, random_state=0), "auto", "m.mtx")
    >>> how, A.dtype.name, B.shape
    ('AAt', 'float32', (4, 6))
    """
    how = choose_form(form, M.shape, name)
    A = sp.csr_matrix(M, dtype=dtype)
    A.sum_duplicates()
    return A, (A if how == "AA" else A.T.tocsr()), how


def _positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"The '{name}' parameter of {_FUNC} must be a positive integer. "
                         f"Got {value!r} instead.")
    return int(value)


def _checked(A: Any, B: Any, workers: Sequence[int], tiles_per_worker: int, repeats: int
             ) -> tuple[sp.csr_matrix, sp.csr_matrix, tuple[int, ...]]:
    """The operands as canonical scipy CSR and the worker counts, refused before any run."""
    for name, M in (("A", A), ("B", B)):
        if not sp.issparse(M):
            raise TypeError(f"The '{name}' parameter of {_FUNC} must be a scipy sparse matrix. "
                            f"Got {type(M).__name__} instead.")
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"The 'A' and 'B' parameters of {_FUNC} must have A.shape[1] == "
                         f"B.shape[0]. Got {A.shape} and {B.shape} instead.")
    try:
        counts = tuple(workers)
    except TypeError:
        counts = ()
    if not counts or any(isinstance(n, bool) or not isinstance(n, Integral) or n < 1
                         for n in counts):
        raise ValueError(f"The 'workers' parameter of {_FUNC} must be a non-empty sequence of "
                         f"positive integers such as (1, 2, 4). Got {workers!r} instead.")
    tiles = _positive(tiles_per_worker, "tiles_per_worker")
    _positive(repeats, "repeats")
    if max(counts) * tiles > A.shape[0]:
        raise ValueError(f"The 'workers' parameter of {_FUNC} asks for {max(counts)} × "
                         f"{tiles} row tiles, more than A's {A.shape[0]} rows. Pass fewer "
                         "workers or tiles per worker, or a larger A.")
    out = []
    for M in (A, B):
        M = sp.csr_matrix(M)
        M.sum_duplicates()  # sorted and without duplicates: the rows compare exactly
        out.append(M)
    return out[0], (out[0] if B is A else out[1]), tuple(int(n) for n in counts)


def tile_rows_checked(work: np.ndarray, r0: int, r1: int) -> list[int]:
    """The rows of the tile ``[r0, r1)`` whose C is compared with one device's: the first,
    middle and last row with work (intermediate products) and the row with the most, as
    offsets in the tile; the first, middle and last row where no row has work.

    Examples
    --------
    >>> tile_rows_checked(np.array([0, 0, 3, 0, 9, 1, 0, 2, 0]), 1, 8)
    [1, 3, 6]
    >>> tile_rows_checked(np.zeros(5, dtype=np.int64), 0, 5)
    [0, 2, 4]
    """
    w = np.asarray(work[r0:r1])
    busy = np.flatnonzero(w)
    pick = busy if busy.size else np.arange(r1 - r0)
    if pick.size == 0:
        return []
    rows = {int(pick[0]), int(pick[(pick.size - 1) // 2]), int(pick[-1])}
    if busy.size:
        rows.add(int(np.argmax(w)))
    return sorted(rows)


def _probe(tile: Any, rows: list[int]) -> tuple[tuple[int, int], int, list[tuple[Any, Any]]]:
    """On the worker that holds a tile of C: its shape, nnz and the given rows (column
    indices and values, copied to the host), nothing else of it."""
    ptr = to_host(tile.indptr[rows + [r + 1 for r in rows]]) if rows else []
    got = [(to_host(tile.indices[s:e]), to_host(tile.data[s:e]))
           for s, e in zip(ptr[:len(rows)], ptr[len(rows):])]
    return tuple(int(d) for d in tile.shape), int(tile.nnz), got


def _row_agrees(A: sp.csr_matrix, B: sp.csr_matrix, ref: sp.csr_matrix, i: int,
                cols: np.ndarray, vals: np.ndarray) -> bool:
    """Whether row ``i`` of a C equals the reference's: the same columns, and values within
    twice the rounding bound of a float sum of k products (each result's error at most
    (k + 1)·eps·Σ|a||b|, k the nonzeros of A's row), so the order of the sums may differ."""
    s, e = ref.indptr[i], ref.indptr[i + 1]
    if not np.array_equal(cols, ref.indices[s:e]):
        return False
    a = A[i]
    weight = abs(B[a.indices][:, ref.indices[s:e]]).astype(np.float64).T \
        @ np.abs(a.data.astype(np.float64))
    tol = 2 * (a.nnz + 1) * np.finfo(ref.dtype).eps * np.ravel(weight)
    diff = np.abs(vals.astype(np.float64) - ref.data[s:e].astype(np.float64))
    return bool(np.all(diff <= tol))


def _same_c(C: Any, ref: sp.csr_matrix, A: sp.csr_matrix, B: sp.csr_matrix,
            work: np.ndarray, client: Any) -> tuple[bool, int, int]:
    """Whether the dask C of a cluster call equals the one-device ``ref``, checked by a task
    per tile on the worker that holds it (:func:`_probe`): every tile's shape and nnz, and
    the rows :func:`tile_rows_checked` picks, which alone travel. Also the rows compared and
    C's nnz (the tiles' sum)."""
    graph = dict(C.__dask_graph__())
    futures = [graph[key] for (key,) in C.__dask_keys__()]
    bounds = np.concatenate([[0], np.cumsum(C.chunks[0])]).astype(np.int64)
    picks = [tile_rows_checked(work, int(r0), int(r1))
             for r0, r1 in zip(bounds[:-1], bounds[1:])]
    probes = client.gather(client.map(_probe, futures, picks, pure=False))
    same, checked, total = True, 0, 0
    for r0, r1, rows, (shape, nnz, got) in zip(bounds[:-1], bounds[1:], picks, probes):
        same &= shape == (int(r1 - r0), ref.shape[1])
        same &= nnz == int(ref.indptr[r1] - ref.indptr[r0])
        total += nnz
        for r, (cols, vals) in zip(rows, got):
            same &= _row_agrees(A, B, ref, int(r0 + r), cols, vals)
        checked += len(rows)
    return bool(same), checked, total


def _ring(At: Any, Bt: Any) -> Any:
    """The product of held operands with B's tiles passed round the workers."""
    import dask

    import mgpu

    with dask.config.set({"mgpu.spgemm.held-operands": "ring"}):
        return mgpu.spgemm(At, Bt)


def _median_wall(call: Callable[[], Any], repeats: int) -> float:
    """The median wall time of ``call()``, each result dropped before the next call."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t0)
        del out
    return float(np.median(times))


def _one_device(A: sp.csr_matrix, B: sp.csr_matrix, gpu: bool, repeats: int
                ) -> tuple[sp.csr_matrix, float]:
    """The one-device C (on the host, for the checks) and the median time of the call: on
    the GPU of cupyx operands already there, synchronised after the call."""
    import mgpu

    if not gpu:
        ref = mgpu.spgemm(A, B)
        return ref, _median_wall(lambda: mgpu.spgemm(A, B), repeats)
    import cupy
    import cupyx.scipy.sparse as csp

    Ag = csp.csr_matrix(A)
    Bg = Ag if B is A else csp.csr_matrix(B)
    ref = to_host(synchronize(mgpu.spgemm(Ag, Bg)))  # the warm-up call
    t = _median_wall(lambda: synchronize(mgpu.spgemm(Ag, Bg)), repeats)
    del Ag, Bg
    cupy.get_default_memory_pool().free_all_blocks()  # the workers' GPU 0 is this one
    return ref, t


def bench_scaling(A: sp.spmatrix, B: sp.spmatrix, workers: Sequence[int], *,
                  tiles_per_worker: int = 1, repeats: int = 3, gpus: bool | None = None,
                  progress: Callable[[str], Any] | None = None) -> list[dict[str, Any]]:
    """``C = A @ B`` on one device and spread over 1, 2, 4, … workers, in one run.

    First the one-device call without a cluster: ``mgpu.spgemm`` of cupyx operands already
    on the GPU (synchronised after the call) where GPU workers are used, of the scipy
    operands otherwise. Then, for each worker count n, an embedded cluster
    (``mgpu.distributed.connect(n_workers=n, gpus=gpus)``), a warm-up call and ``repeats``
    timed calls of each of:

    - :data:`PARTS`: ``mgpu.spgemm(A, B, parts=n * tiles_per_worker, client=client)`` with
      the scipy A and B: a timed call includes cutting A at prefix sums of the work on the
      client, sending the tiles and B to the workers, the products, and the wait for the
      last tile;
    - :data:`HELD`: ``mgpu.spgemm(At, Bt)`` of A and B placed on the workers in
      ``n * tiles_per_worker`` row tiles each (``mgpu.from_scipy``, before the timing): the
      SPMD product, whose workers gather A and B through their communicator;
    - :data:`RING`: the same with ``mgpu.spgemm.held-operands`` set to ``ring`` (what a B
      too large to gather on every GPU takes): B's tiles passed round the workers, C in A's
      tiles.

    C stays on the workers; each result is dropped before the next call.

    The warm-up call's C is checked against the one-device C by a task per tile on the
    worker that holds it: the tile's shape and nnz against the reference's rows, and the
    first, middle and last of its rows with work and its heaviest row
    (:func:`tile_rows_checked`), gathered and compared with the same rows of the one-device
    C: the same columns, the values within twice the rounding bound of a float sum
    (the order of the sums may differ between kernels).

    Parameters
    ----------
    A : sparse matrix of shape (n_rows, n_inner)
        scipy, any format; used as canonical CSR in its own dtype (float32 is what the GPU
        benchmarks use).
    B : sparse matrix of shape (n_inner, n_cols)
        scipy, any format (``B is A`` for A·A).
    workers : sequence of int
        Cluster sizes, in the order they run.
    tiles_per_worker : int, default=1
        Row tiles of A per worker (``parts = n * tiles_per_worker``, at most A's rows).
    repeats : int, default=3
        Timed calls per row (the median is reported), after a warm-up call.
    gpus : bool, optional
        GPU workers, and the one device a GPU; default: when GPUs are visible.
    progress : callable, optional
        Called with a line as each row is done.

    Returns
    -------
    rows : list of dict
        One per run, the one device's first: ``workers`` (:data:`ONE_DEVICE` or the count),
        ``kind`` ('GPU' or 'CPU'), ``call`` (:data:`PARTS`, :data:`HELD` or :data:`RING`;
        '' for the one device), ``tiles`` (of C), ``dtype, shape_a,
        shape_b, nnz_a, nnz_b, products`` (intermediate products; 2 flops each),
        ``nnz_c, median_s, gflops, speedup_vs_one_device`` (the one device's median over
        this row's), ``speedup_vs_1_worker`` (the 1-worker row's of the same call over this row's,
        None without one, and for the one device), ``imbalance`` (the largest tile's work
        over the mean tile's, work being a row's intermediate products as
        :func:`mgpu.partition.spgemm_row_work` counts them), ``same_c`` (C equal to the
        one device's as checked above; None for the one device) and ``rows_checked``.

    Raises
    ------
    TypeError
        A or B is not a scipy sparse matrix.
    ValueError
        Shapes that do not match, a parameter out of its range, or more tiles than A has
        rows; before anything runs.

    Examples
    --------
    >>> A = sp.random(400, 300, density=0.02, format="csr", random_state=0, dtype=np.float32)
    >>> rows = bench_scaling(A, A.T, (1, 2), gpus=False, repeats=1)  # doctest: +SKIP
    >>> [(r["workers"], r["call"], r["same_c"]) for r in rows][:3]  # doctest: +SKIP
    [('one device, no cluster', '', None), (1, 'parts=N', True), (1, 'held, SPMD', True)]
    """
    import mgpu
    from mgpu.distributed import connect, from_scipy, visible_gpus

    A, B, counts = _checked(A, B, workers, tiles_per_worker, repeats)
    use_gpus = visible_gpus() > 0 if gpus is None else bool(gpus)
    flops = products(A, B)
    work = spgemm_row_work(A, B)
    base = {"dtype": A.dtype.name, "shape_a": list(A.shape), "shape_b": list(B.shape),
            "nnz_a": int(A.nnz), "nnz_b": int(B.nnz), "products": flops}
    out: list[dict[str, Any]] = []

    def record(n: Any, kind: str, tiles: int, nnz_c: int, t: float, imb: float,
               same: bool | None, checked: int, call: str = "") -> None:
        row = dict(base, workers=n, kind=kind, call=call, tiles=tiles, nnz_c=nnz_c, median_s=t,
                   gflops=2.0 * flops / t / 1e9 if t > 0 else None,
                   speedup_vs_one_device=out[0]["median_s"] / t if out else 1.0,
                   speedup_vs_1_worker=None, imbalance=imb, same_c=same, rows_checked=checked)
        out.append(row)
        cluster = isinstance(n, int)
        line = (f"{n} {kind}" + (f" worker(s), {call}, {tiles} tile(s)" if cluster else "")
                + f": {t * 1e3:.2f} ms, {_fmt(row['gflops'], '.2f')} GFLOP/s")
        if cluster:
            line += (f", {row['speedup_vs_one_device']:.2f}× one device, work imbalance "
                     f"{imb:.4f}, C {'identical' if same else 'DIFFERS'} ({checked} rows "
                     "compared)")
        logger.info("spgemm scaling: %s", line)
        if progress is not None:
            progress(line)

    ref, t = _one_device(A, B, use_gpus, repeats)
    record(ONE_DEVICE, "GPU" if use_gpus else "CPU", 1, int(ref.nnz), t, 1.0, None, 0)
    for n in counts:
        with connect(n_workers=n, gpus=gpus) as client:
            parts = n * tiles_per_worker
            # the operands held on the workers (placed once, not timed): the SPMD call
            At = from_scipy(A, parts, client=client)
            Bt = At if B is A else from_scipy(B, parts, client=client)
            calls = {PARTS: lambda: mgpu.spgemm(A, B, parts=parts, client=client),
                     HELD: lambda: mgpu.spgemm(At, Bt), RING: lambda: _ring(At, Bt)}
            for how, call in calls.items():
                C = call()
                # the report's words only: C's meta is cupyx when its tiles are on GPUs
                kind = "GPU" if is_gpu_array(C._meta) else "CPU"
                same, checked, nnz_c = _same_c(C, ref, A, B, work, client)
                bounds = np.concatenate([[0], np.cumsum(C.chunks[0])]).astype(np.int64)
                tiles = len(C.chunks[0])
                del C
                t = _median_wall(call, repeats)
                record(n, kind, tiles, nnz_c, t, imbalance(part_sums(work, bounds)), same,
                       checked, how)
            del At, Bt
    for how in (PARTS, HELD, RING):
        one = next((r for r in out[1:] if r["workers"] == 1 and r["call"] == how), None)
        for r in out[1:]:
            if one is not None and r["call"] == how:
                r["speedup_vs_1_worker"] = one["median_s"] / r["median_s"]
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def scaling_markdown(rows: Sequence[dict[str, Any]], label: str) -> str:
    """The rows of :func:`bench_scaling` as a Markdown table.

    Examples
    --------
    >>> one = {"workers": ONE_DEVICE, "kind": "GPU", "tiles": 1, "products": 2 * 10**8,
    ...        "nnz_c": 10**8, "median_s": 0.4, "gflops": 1.0, "imbalance": 1.0,
    ...        "speedup_vs_one_device": 1.0, "speedup_vs_1_worker": None, "same_c": None}
    >>> four = dict(one, workers=4, call=HELD, tiles=4, median_s=0.125, gflops=3.2,
    ...             imbalance=1.002, speedup_vs_one_device=3.2, speedup_vs_1_worker=3.6,
    ...             same_c=True)
    >>> print(scaling_markdown([one, four], "A·Aᵀ").splitlines()[-1])
    | A·Aᵀ | 4 GPU | held, SPMD | 4 | 1.0020 | 200,000,000 | 100,000,000 | 125.00 | 3.20 | \
3.20× | 3.60× | yes |
    """
    head = ("| product | workers | call | tiles | work imbalance (max/mean) | products | nnz(C) | "
            "median ms | GFLOP/s | speedup vs one device | speedup vs 1 worker | "
            "C equal to one device |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        same = r["same_c"]
        speed = [_fmt(r[k], ".2f") + ("×" if r[k] is not None else "")
                 for k in ("speedup_vs_one_device", "speedup_vs_1_worker")]
        lines.append(f"| {label} | {r['workers']} {r['kind']} | {r.get('call') or '–'} | "
                     f"{r['tiles']} | "
                     f"{r['imbalance']:.4f} | {r['products']:,} | {r['nnz_c']:,} | "
                     f"{r['median_s'] * 1e3:.2f} | {_fmt(r['gflops'], '.2f')} | "
                     f"{speed[0]} | {speed[1]} | "
                     + ("– |" if same is None else ("yes |" if same else "NO |")))
    return "\n".join(lines)
