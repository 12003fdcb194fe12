"""SpGEMM of operands held on the workers, SPMD: ``mgpu.spgemm(A, B)`` with A and B both dask
arrays of row tiles.

The task path (:func:`mgpu.distributed.spgemm.spgemm` with ``parts``) sends B to every worker
through Dask's host transfers on every call, and cuts A on the client. Here A and B already
lie on the workers (:func:`mgpu.from_scipy`), and one task per worker holding A's tiles
(:func:`mgpu.distributed.spmd.spmd`) does the rest:

1. every rank gathers every tile of A and of B from the others through the communicator
   (NCCL between GPUs, the host channel between CPU workers), so that each device holds
   both whole: B because a row of C needs all of it, A so that C's rows can be shared out
   by their work;
2. every rank counts each row's work (its intermediate products, as
   :func:`mgpu.partition.spgemm_row_work` counts them) and cuts the rows at prefix sums of
   it (:func:`mgpu.partition.split_counts`): the same cut on every rank, without a message;
3. each rank multiplies its share of A's rows by B with the one-device product and keeps
   its rows of C on its device.

C is a dask array of those tiles, one per worker in rank order; its chunks are futures held
where they were made. A tile lost with its worker is not made again (the product was one
collective job): the error says so, and calling ``mgpu.spgemm`` again makes it anew.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

import dask.array as da
import numpy as np
import scipy.sparse as sp

from mgpu.backends import array_module, is_sparse, sparse_module, synchronize, to_host
from mgpu.distributed.cluster import completed, current_client
from mgpu.distributed.inputs import check_dask_input, row_nnz, row_tiles
from mgpu.distributed.spmd import spmd
from mgpu.ops.spgemm import check_sparse_pair, spgemm_local
from mgpu.ops.validation import float_dtype, same_kind
from mgpu.partition import split_counts

logger = logging.getLogger(__name__)

__all__ = ["spgemm_spmd"]

_FUNC = "spgemm"

# (job key, rank) -> that rank's tile of C, from the end of the job until the task that
# takes it into Dask's keeping (:func:`_take`) runs on the same worker
_HELD: dict[tuple[str, int], Any] = {}
_LOCK = threading.Lock()


def _drop(key: str) -> int:
    """Forget what job ``key`` left on this worker (after a failure); how many tiles."""
    with _LOCK:
        mine = [k for k in _HELD if k[0] == key]
        for k in mine:
            del _HELD[k]
    return len(mine)


def _take(key: str, rank: int, rows: tuple[int, int], worker: str) -> Any:
    """Rank ``rank``'s tile of C, from this worker's keeping into Dask's."""
    with _LOCK:
        tile = _HELD.pop((key, rank), None)
    if tile is None:
        raise RuntimeError(
            f"spgemm: rows {rows[0]}..{rows[1] - 1} of C were made by worker {worker}, which "
            "left the cluster before they were collected (or this task ran elsewhere). The "
            "product was one SPMD job: call mgpu.spgemm(A, B) again.")
    return tile


def _local_tiles(parts: list[Any], n_cols: int) -> tuple[list[Any], str | None]:
    """This rank's tiles as CSR of its device (dense chunks made CSR), or the reason one is
    refused (every rank learns it before any rank waits in a collective)."""
    out = []
    for p in parts:
        X = p.data
        X = X.tocsr() if is_sparse(X) else sparse_module(X).csr_matrix(X)
        rows = p.rows.stop - p.rows.start
        if tuple(X.shape) != (rows, n_cols):
            return [], (f"tile {p.index} has shape {tuple(X.shape)} where its rows "
                        f"{p.rows.start}..{p.rows.stop - 1} of a matrix of {n_cols} "
                        f"columns make {(rows, n_cols)}")
        out.append(X)
    return out, None


def _room() -> int:
    """The bytes this GPU rank's device has available."""
    from mgpu.backends.memory import gpu_available

    return gpu_available()[0]


def _refusal(every: list[Any], shapes: tuple[tuple[int, int], ...], dt: np.dtype,
             gpu: bool) -> BaseException | None:
    """Why the operands cannot be gathered on every rank, from what every rank told (its
    tiles' sizes, its error, its GPU's available bytes): the same answer on every rank."""
    from dask.utils import format_bytes

    from mgpu.backends.memory import DeviceMemoryError

    for rank, (_, error, _) in enumerate(every):
        if error is not None:
            return ValueError(f"{_FUNC} refused a tile of rank {rank}'s: {error}.")
    if not gpu:
        return None
    held = [[sum(t[2] for t in r[0][w]) for r in every] for w in (0, 1)]
    for name, z in zip("AB", held):
        if sum(z) >= 2**31:
            return ValueError(f"{_FUNC}: {name} has {sum(z):,} nonzeros, more than a cupyx "
                              "matrix's 32-bit indices hold. Pass it as a scipy matrix with "
                              "parts=N (C's tiles then come in row blocks).")
    idx = 4 if max(s[1] for s in shapes) < 2**31 else 8
    # for a moment held twice: as gathered (each rank's part padded to the largest) and as
    # assembled in tile order
    need = sum((2 * s[0] + 2) * 8 + (len(z) * max(z) + sum(z)) * (idx + dt.itemsize)
               for s, z in zip(shapes, held))
    for rank, (_, _, available) in enumerate(every):
        if need > available:
            return DeviceMemoryError(
                f"{_FUNC}: A and B gathered take {format_bytes(need)} on every GPU; rank "
                f"{rank}'s has {format_bytes(available)} available. Pass B as a scipy "
                "matrix with parts=N instead (or free memory on the workers' GPUs).")
    return None


def _gathered(comm: Any, tiles: list[Any], every: list[Any], which: int,
              shape: tuple[int, int], dt: np.dtype) -> Any:
    """The whole matrix ``which`` (0: A, 1: B) on this rank's device, from every rank's
    tiles (``every``: each rank's (tile index, rows, nnz) lists), in tile order."""
    xp = comm.xp
    idx_dt = np.int32 if shape[1] < 2**31 else np.int64
    if tiles:
        lens = xp.concatenate([xp.diff(X.indptr).astype(np.int64) for X in tiles])
        cols = xp.concatenate([X.indices.astype(idx_dt, copy=False) for X in tiles])
        vals = xp.concatenate([X.data.astype(dt, copy=False) for X in tiles])
    else:  # a rank holds at least one tile of A; this is B's side of a rank without any
        lens, cols, vals = (xp.zeros(0, dtype=d) for d in (np.int64, idx_dt, dt))
    held = [m[0][which] for m in every]
    total = sum(t[2] for r in held for t in r)
    # the ranks' pieces, in rank order, each rank's tiles in its own order
    lens = comm.allgather(lens) if shape[0] else lens
    if total:
        cols, vals = comm.allgather(cols), comm.allgather(vals)
    order, row_at, nz_at = [], 0, 0
    for r in held:
        for index, (r0, r1), nnz in r:
            order.append((index, row_at, r1 - r0, nz_at, nnz))
            row_at, nz_at = row_at + r1 - r0, nz_at + nnz
    order.sort()
    if [o[1] for o in order] != sorted(o[1] for o in order):  # tiles not in row order
        lens = xp.concatenate([lens[a:a + n] for _, a, n, _, _ in order])
        cols = xp.concatenate([cols[a:a + z] for _, _, _, a, z in order])
        vals = xp.concatenate([vals[a:a + z] for _, _, _, a, z in order])
    indptr = xp.zeros(shape[0] + 1, dtype=np.int64)
    xp.cumsum(lens, out=indptr[1:])
    module = sparse_module(vals)
    if module is not sp:  # cupyx CSR holds 32-bit index arrays only
        indptr = indptr.astype(np.int32)
    return module.csr_matrix((vals, cols, indptr), shape=shape)


def _row_work(A: Any, B: Any) -> np.ndarray:
    """Each row's intermediate products on A's device, to the host (int64):
    :func:`mgpu.partition.spgemm_row_work` for operands of either device."""
    xp = array_module(A.data)
    cum = xp.zeros(A.nnz + 1, dtype=np.int64)
    xp.cumsum(xp.diff(B.indptr).astype(np.int64)[A.indices], out=cum[1:])
    return np.asarray(to_host(cum[A.indptr[1:]] - cum[A.indptr[:-1]]))


def _rank(comm: Any, a_parts: list[Any], b_parts: list[Any], shape_a: tuple[int, int],
          shape_b: tuple[int, int], dt: str, to_host_: bool, key: str
          ) -> tuple[int, int, int, int, str, float, float]:
    """One worker's part of :func:`spgemm_spmd`: its rows of C, kept on this worker.
    Returns (first row, last row + 1, nnz, intermediate products) of its tile, the worker's
    address, and the seconds spent gathering A and B and on the product."""
    import distributed

    dt = np.dtype(dt)
    gpu = comm.xp is not np
    a_tiles, error = _local_tiles(a_parts, shape_a[1])
    b_tiles, b_error = _local_tiles(b_parts, shape_b[1])
    error = (error and f"A: {error}") or (b_error and f"B: {b_error}")
    sizes = [[(p.index, (p.rows.start, p.rows.stop), int(X.nnz)) for p, X in zip(ps, ts)]
             for ps, ts in ((a_parts, a_tiles), (b_parts, b_tiles))]
    # every rank learns every refusal and every GPU's room before any waits in a collective
    every = comm.allgather_obj((sizes, error, _room() if gpu else None))
    refusal = _refusal(every, (shape_a, shape_b), dt, gpu)
    if refusal is not None:
        raise refusal
    t0 = time.perf_counter()
    A = _gathered(comm, a_tiles, every, 0, shape_a, dt)
    B = _gathered(comm, b_tiles, every, 1, shape_b, dt)
    del a_tiles, b_tiles
    A, B = check_sparse_pair(A, B, _FUNC, product=True)
    t1 = time.perf_counter()
    work = _row_work(A, B)
    bounds = split_counts(work, comm.size)
    r0, r1 = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
    C = synchronize(spgemm_local(A[r0:r1], B, None, to_host_))
    if a_parts:  # csr_array tiles in, csr_array tiles out, as on one device
        C = same_kind(C, a_parts[0].data)
    with _LOCK:
        _HELD[(key, comm.rank)] = C
    return (r0, r1, int(C.nnz), int(work[r0:r1].sum()), distributed.get_worker().address,
            t1 - t0, time.perf_counter() - t1)


def _same_tiles(B: da.Array, count: int) -> da.Array:
    """B in ``count`` row tiles (spmd lays every collection out by A's tiles), re-cut at nnz
    prefix sums when it has another count (its pieces then move through Dask at every call:
    place B in as many tiles as A to keep it where it is)."""
    B = row_tiles(B, _FUNC)
    if B.numblocks[0] == count:
        return B
    sizes = tuple(int(s) for s in np.diff(split_counts(row_nnz(B), count)))
    logger.debug("%s: B's %d row tiles re-cut into A's %d", _FUNC, B.numblocks[0], count)
    return B.rechunk((sizes, (int(B.shape[1]),)))


def spgemm_spmd(A: da.Array, B: da.Array, *, to_host: bool = False, client: Any = None
                ) -> da.Array:
    """``A @ B`` for A and B both dask arrays on a cluster, SPMD (see the module's text).

    A and B are cut by rows only, or re-cut so (:func:`mgpu.distributed.inputs.row_tiles`);
    B is re-cut into as many row tiles as A has. The call runs the product and waits for it;
    C's tiles stay on the workers (cupyx CSR on GPU workers, scipy with ``to_host`` or on
    CPU workers), one per worker of A's tiles, cut at prefix sums of the rows' work.
    Errors in A's or B's tiles (NaN, infinity, indices out of range) surface here, from
    the job, naming the row of the whole matrix.
    """
    check_dask_input(A, "A", _FUNC)
    check_dask_input(B, "B", _FUNC)
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"The 'B' parameter of {_FUNC} must have A.shape[1] = {A.shape[1]} "
                         f"rows (one per column of A). Got shape {tuple(B.shape)} instead, "
                         f"with A of shape {tuple(A.shape)}.")
    client = client or current_client()
    if client is None:
        raise ValueError(f"{_FUNC} of two dask arrays runs on the cluster that holds them, "
                         "and there is none: call mgpu.connect() first, or pass client=.")
    dt = float_dtype(np.result_type(A.dtype, B.dtype))
    A = row_tiles(A, _FUNC)
    B = _same_tiles(B, A.numblocks[0])
    shape_a = (int(A.shape[0]), int(A.shape[1]))
    shape_b = (int(B.shape[0]), int(B.shape[1]))
    key = f"mgpu-spgemm-spmd-{uuid.uuid4().hex}"
    try:
        tiles = spmd(_rank, A, B, args=(shape_a, shape_b, dt.str, bool(to_host), key),
                     client=client, name="spgemm", restarts=0)
        workers = [t[4] for t in tiles]
        name = f"mgpu-spgemm-{key[-32:]}"
        futures = [client.submit(_take, key, r, (t[0], t[1]), w, key=(name, r, 0),
                                 workers=[w], allow_other_workers=True, pure=False)
                   for r, (t, w) in enumerate(zip(tiles, workers))]
        for fut in completed(futures, "spgemm's tiles of C", client):
            if fut.status in ("error", "cancelled"):
                fut.result()
    except BaseException:
        try:
            client.run(_drop, key)
        except Exception:  # a worker left meanwhile: what it held left with it
            logger.debug("dropping %s failed", key, exc_info=True)
        raise
    logger.info("%s: %d x %d times %d x %d on %d worker(s), SPMD: %d intermediate products, "
                "largest/mean %.3f; gathering A and B %.1f ms, the products %.1f-%.1f ms",
                _FUNC, *shape_a, *shape_b, len(tiles), sum(t[3] for t in tiles),
                max(t[3] for t in tiles) * len(tiles) / max(1, sum(t[3] for t in tiles)),
                1e3 * max(t[5] for t in tiles), 1e3 * min(t[6] for t in tiles),
                1e3 * max(t[6] for t in tiles))
    like = A._meta if not to_host else sp.csr_matrix((0, 0), dtype=dt)
    like = same_kind(sparse_module(like).csr_matrix((0, 0), dtype=dt), A._meta)
    return da.Array({f.key: f for f in futures}, name,
                    chunks=(tuple(t[1] - t[0] for t in tiles), (shape_b[1],)), dtype=dt,
                    meta=like)
