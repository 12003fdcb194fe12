"""SpGEMM of operands held on the workers, SPMD: ``mgpu.spgemm(A, B)`` with A and B both dask
arrays of row tiles.

The task path (:func:`mgpu.distributed.spgemm.spgemm` with ``parts``) sends B to every worker
through Dask's host transfers on every call, and cuts A on the client. Here A and B already
lie on the workers (:func:`mgpu.from_scipy`), and one task per worker holding A's tiles
(:func:`mgpu.distributed.spmd.spmd`) does the rest, in one of two ways
(``mgpu.spgemm.held-operands``; ``auto`` takes the first where it fits every GPU):

- **gather**: every rank gathers every tile of A and of B from the others through the
  communicator (NCCL between GPUs, the host channel between CPU workers), so that each
  device holds both whole: B because a row of C needs all of it, A so that C's rows can be
  shared out by their work. Every rank counts each row's work (its intermediate products,
  as :func:`mgpu.partition.spgemm_row_work` counts them) and cuts the rows at prefix sums
  of it (:func:`mgpu.partition.split_counts`): the same cut on every rank, without a
  message. Each rank multiplies its share of the rows by B with the one-device product.
- **ring**: every rank keeps its own tiles of A, and the ranks' tiles of B go round the ring
  (``comm.sendrecv``), two blocks of B on a device at a time. Each visiting tile ``B_k``
  (rows ``k0..k1`` of B) meets the columns ``k0..k1`` of the rank's tiles of A, and its
  products are added to their tiles of C (a SpAdd a step). C comes in A's own tiles, whose
  work is whatever A's cut gives it.

C is a dask array of those tiles; its chunks are futures held where they were made. A tile
lost with its worker is not made again (the product was one collective job): the error says
so, and calling ``mgpu.spgemm`` again makes it anew.
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

from mgpu import config
from mgpu.backends import (array_module, is_sparse, spadd_lookup, sparse_module, synchronize,
                           to_host)
from mgpu.distributed.cluster import completed, current_client
from mgpu.distributed.inputs import check_dask_input, row_nnz, row_tiles
from mgpu.distributed.spmd import spmd
from mgpu.ops.spgemm import check_csr_values, spgemm_local
from mgpu.ops.validation import float_dtype, same_kind
from mgpu.partition import split_counts

logger = logging.getLogger(__name__)

__all__ = ["spgemm_spmd"]

_FUNC = "spgemm"
_MODES = ("auto", "gather", "ring")

# (job key, tile id) -> a tile of C, from the end of the job until the task that takes it
# into Dask's keeping (:func:`_take`) runs on the same worker
_HELD: dict[tuple[str, int], Any] = {}
_LOCK = threading.Lock()


def _drop(key: str) -> int:
    """Forget what job ``key`` left on this worker (after a failure); how many tiles."""
    with _LOCK:
        mine = [k for k in _HELD if k[0] == key]
        for k in mine:
            del _HELD[k]
    return len(mine)


def _take(key: str, tile_id: int, rows: tuple[int, int], worker: str) -> Any:
    """Tile ``tile_id`` of C, from this worker's keeping into Dask's."""
    with _LOCK:
        tile = _HELD.pop((key, tile_id), None)
    if tile is None:
        raise RuntimeError(
            f"spgemm: rows {rows[0]}..{rows[1] - 1} of C were made by worker {worker}, which "
            "left the cluster before they were collected (or this task ran elsewhere). The "
            "product was one SPMD job: call mgpu.spgemm(A, B) again.")
    return tile


def _local_tiles(parts: list[Any], n_cols: int, dt: np.dtype, name: str
                 ) -> tuple[list[Any], str | None]:
    """This rank's tiles as CSR of its device in ``dt`` (dense chunks made CSR), each checked
    as the one-device product checks an operand (index arrays, NaN and infinity, naming the
    row of the whole matrix), or the reason one is refused: every rank learns it before any
    waits in a collective, and each rank checks only its own tiles."""
    out = []
    for p in parts:
        X = p.data
        X = X.tocsr() if is_sparse(X) else sparse_module(X).csr_matrix(X)
        rows = p.rows.stop - p.rows.start
        if tuple(X.shape) != (rows, n_cols):
            return [], (f"The '{name}' parameter of {_FUNC} has a tile ({p.index}) of shape "
                        f"{tuple(X.shape)} where its rows {p.rows.start}..{p.rows.stop - 1} "
                        f"of a matrix of {n_cols} columns make {(rows, n_cols)}.")
        if X.dtype != dt:
            X = X.astype(dt)
        try:
            check_csr_values(X, name, _FUNC, p.rows.start)
        except ValueError as exc:
            return [], str(exc)
        out.append(X)
    return out, None


def _room() -> int:
    """The bytes this GPU rank's device has available."""
    from mgpu.backends.memory import gpu_available

    return gpu_available()[0]


def _block_bytes(every: list[Any], which: int, n_cols: int, dt: np.dtype) -> int:
    """The bytes of the largest rank's tiles of ``which`` (0: A, 1: B) as one packed block
    (row lengths, column indices, values), the size every rank's block is padded to."""
    idx = 4 if n_cols < 2**31 else 8
    rows = max(sum(t[1][1] - t[1][0] for t in r[0][which]) for r in every)
    nnz = max(sum(t[2] for t in r[0][which]) for r in every)
    return rows * 8 + nnz * (idx + dt.itemsize)


def _plan(every: list[Any], shapes: tuple[tuple[int, int], ...], dt: np.dtype, gpu: bool,
          mode: str) -> str:
    """How the ranks run the product, from what every rank told (its tiles' sizes, its
    refusal, its GPU's available bytes), so the same on every rank: "gather" (A and B whole
    on every rank) or "ring" (B's tiles passed round); or the refusal, raised."""
    from dask.utils import format_bytes

    from mgpu.backends.memory import DeviceMemoryError

    for _, error, _ in every:
        if error is not None:
            raise ValueError(error)
    held = [[sum(t[2] for t in r[0][w]) for r in every] for w in (0, 1)]
    if gpu:
        for name, z in zip("AB", held):
            if sum(z) >= 2**31:
                raise ValueError(f"{_FUNC}: {name} has {sum(z):,} nonzeros, more than a cupyx "
                                 "matrix's 32-bit indices hold. Pass it as a scipy matrix "
                                 "with parts=N (C's tiles then come in row blocks).")
    if mode == "ring" or not gpu:
        return "ring" if mode == "ring" else "gather"
    idx = 4 if max(s[1] for s in shapes) < 2**31 else 8
    # for a moment held twice: as gathered (each rank's part padded to the largest) and as
    # assembled in tile order
    need = sum((2 * s[0] + 2) * 8 + (len(z) * max(z) + sum(z)) * (idx + dt.itemsize)
               for s, z in zip(shapes, held))
    short = [(r, e[2]) for r, e in enumerate(every) if need > e[2]]
    if not short:
        return "gather"
    rank, available = short[0]
    message = (f"{_FUNC}: A and B gathered take {format_bytes(need)} on every GPU; rank "
               f"{rank}'s has {format_bytes(available)} available")
    if mode == "gather":
        raise DeviceMemoryError(f"{message}. Set mgpu.spgemm.held-operands to 'ring' or "
                                "'auto' (B's tiles passed round instead), or free memory on "
                                "the workers' GPUs.")
    # the ring: each rank's own tiles are there already; two blocks of B at a time
    ring = 2 * _block_bytes(every, 1, shapes[1][1], dt)
    short = [(r, e[2]) for r, e in enumerate(every) if ring > e[2]]
    if short:
        raise DeviceMemoryError(f"{message}, and passing B's tiles round takes "
                                f"{format_bytes(ring)} beside A's (rank {short[0][0]}'s has "
                                f"{format_bytes(short[0][1])}). Cut B into more tiles over "
                                "more GPU workers, or free memory on their GPUs.")
    return "ring"


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


def _gather_product(comm: Any, a_tiles: list[Any], b_tiles: list[Any], every: list[Any],
                    shapes: tuple[tuple[int, int], ...], dt: np.dtype, to_host_: bool
                    ) -> list[tuple[int, int, int, Any, int]]:
    """A and B gathered whole on this rank, C's rows cut at prefix sums of their work, this
    rank's share multiplied: [(tile id, first row, last row + 1, C, products)], one tile."""
    A = _gathered(comm, a_tiles, every, 0, shapes[0], dt)
    B = _gathered(comm, b_tiles, every, 1, shapes[1], dt)
    work = _row_work(A, B)
    bounds = split_counts(work, comm.size)
    r0, r1 = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
    C = synchronize(spgemm_local(A[r0:r1], B, None, to_host_))
    return [(comm.rank, r0, r1, C, int(work[r0:r1].sum()))]


def _packed(xp: Any, tiles: list[Any], rows: int, nnz: int, idx_dt: Any, dt: np.dtype
            ) -> list[Any]:
    """A rank's tiles as one block (row lengths, column indices, values) padded to ``rows``
    and ``nnz`` (the largest rank's), so that every rank sends and receives one shape."""
    lens = xp.zeros(max(rows, 1), dtype=np.int64)
    cols = xp.zeros(max(nnz, 1), dtype=idx_dt)
    vals = xp.zeros(max(nnz, 1), dtype=dt)
    r = z = 0
    for X in tiles:
        lens[r:r + X.shape[0]] = xp.diff(X.indptr)
        cols[z:z + X.nnz] = X.indices
        vals[z:z + X.nnz] = X.data
        r, z = r + X.shape[0], z + X.nnz
    return [lens, cols, vals]


def _unpacked(block: list[Any], tiles: list[Any], n_cols: int) -> list[tuple[Any, int, int]]:
    """The tiles of a block (:func:`_packed`) as (CSR, first row, last row + 1), from their
    owner's list of (tile index, rows, nnz)."""
    lens, cols, vals = block
    xp = array_module(vals)
    out, r, z = [], 0, 0
    for _, (k0, k1), nnz in tiles:
        indptr = xp.zeros(k1 - k0 + 1, dtype=np.int64)
        xp.cumsum(lens[r:r + k1 - k0], out=indptr[1:])
        if xp is not np:  # cupyx CSR holds 32-bit index arrays only
            indptr = indptr.astype(np.int32)
        X = sparse_module(vals).csr_matrix((vals[z:z + nnz], cols[z:z + nnz], indptr),
                                           shape=(k1 - k0, n_cols))
        out.append((X, k0, k1))
        r, z = r + k1 - k0, z + nnz
    return out


def _ring_product(comm: Any, a_parts: list[Any], a_tiles: list[Any], b_tiles: list[Any],
                  every: list[Any], n_cols: int, dt: np.dtype, to_host_: bool
                  ) -> list[tuple[int, int, int, Any, int]]:
    """B's tiles passed round the ring of ranks (``comm.sendrecv``), each rank adding the
    products of its own tiles of A with each visiting tile of B, A's columns of that tile's
    rows (``A[:, k0:k1] @ B_k``), into its tiles of C (a SpAdd a step): one tile of C per
    tile of A, in A's own cut. Only two blocks of B are on a rank at a time."""
    xp, size, rank = comm.xp, comm.size, comm.rank
    blocks = [e[0][1] for e in every]
    rows = max(sum(t[1][1] - t[1][0] for t in b) for b in blocks)
    nnz = max(sum(t[2] for t in b) for b in blocks)
    idx_dt = np.int32 if n_cols < 2**31 else np.int64
    block = _packed(xp, b_tiles, rows, nnz, idx_dt, dt)
    C: list[Any] = [None] * len(a_tiles)
    work = [0] * len(a_tiles)
    for step in range(size):
        for Bk, k0, k1 in _unpacked(block, blocks[(rank - step) % size], n_cols):
            for t, X in enumerate(a_tiles):
                part = X[:, k0:k1]
                if part.nnz == 0 or Bk.nnz == 0:
                    continue
                work[t] += int(xp.diff(Bk.indptr)[part.indices].sum())
                prod = spgemm_local(part, Bk, None, False)
                C[t] = prod if C[t] is None else spadd_lookup(C[t], prod, 1.0, 1.0)
        if step < size - 1:
            block = [comm.sendrecv(x, (rank + 1) % size, (rank - 1) % size) for x in block]
    out = []
    for p, X, c, w in zip(a_parts, a_tiles, C, work):
        if c is None:
            c = sparse_module(X).csr_matrix((X.shape[0], n_cols), dtype=dt)
        out.append((p.index, p.rows.start, p.rows.stop,
                    synchronize(to_host(c) if to_host_ else c), w))
    return out


def _rank(comm: Any, a_parts: list[Any], b_parts: list[Any], shape_a: tuple[int, int],
          shape_b: tuple[int, int], dt: str, to_host_: bool, key: str, mode: str
          ) -> dict[str, Any]:
    """One worker's part of :func:`spgemm_spmd`: its tiles of C, kept on this worker.
    Returns how the product ran ("gather" or "ring"), the seconds of its exchanges and
    products, and (tile id, first row, last row + 1, nnz, intermediate products, the
    worker's address) for each tile."""
    import distributed

    dt = np.dtype(dt)
    gpu = comm.xp is not np
    a_tiles, error = _local_tiles(a_parts, shape_a[1], dt, "A")
    b_tiles, b_error = _local_tiles(b_parts, shape_b[1], dt, "B")
    sizes = [[(p.index, (p.rows.start, p.rows.stop), int(X.nnz)) for p, X in zip(ps, ts)]
             for ps, ts in ((a_parts, a_tiles), (b_parts, b_tiles))]
    # every rank learns every refusal and every GPU's room before any waits in a collective
    every = comm.allgather_obj((sizes, error or b_error, _room() if gpu else None))
    how = _plan(every, (shape_a, shape_b), dt, gpu, mode)
    t0 = time.perf_counter()
    if how == "gather":
        tiles = _gather_product(comm, a_tiles, b_tiles, every, (shape_a, shape_b), dt,
                                to_host_)
    else:
        tiles = _ring_product(comm, a_parts, a_tiles, b_tiles, every, shape_b[1], dt,
                              to_host_)
    seconds = time.perf_counter() - t0
    with _LOCK:
        for tile, _, _, C, _ in tiles:
            _HELD[(key, tile)] = same_kind(C, a_parts[0].data) if a_parts else C
    address = distributed.get_worker().address
    return {"how": how, "seconds": seconds,
            "tiles": [(tile, r0, r1, int(C.nnz), w, address) for tile, r0, r1, C, w in tiles]}


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
    mode = config.get("spgemm.held-operands")
    if mode not in _MODES:
        raise ValueError(f"The config key mgpu.spgemm.held-operands must be one of "
                         f"{sorted(_MODES)}. Got {mode!r} instead.")
    dt = float_dtype(np.result_type(A.dtype, B.dtype))
    A = row_tiles(A, _FUNC)
    B = _same_tiles(B, A.numblocks[0])
    shape_a = (int(A.shape[0]), int(A.shape[1]))
    shape_b = (int(B.shape[0]), int(B.shape[1]))
    key = f"mgpu-spgemm-spmd-{uuid.uuid4().hex}"
    try:
        ranks = spmd(_rank, A, B, args=(shape_a, shape_b, dt.str, bool(to_host), key, mode),
                     client=client, name="spgemm", restarts=0)
        tiles = sorted((t for r in ranks for t in r["tiles"]), key=lambda t: t[1:3])
        name = f"mgpu-spgemm-{key[-32:]}"
        futures = [client.submit(_take, key, t[0], (t[1], t[2]), t[5], key=(name, i, 0),
                                 workers=[t[5]], allow_other_workers=True, pure=False)
                   for i, t in enumerate(tiles)]
        for fut in completed(futures, "spgemm's tiles of C", client):
            if fut.status in ("error", "cancelled"):
                fut.result()
    except BaseException:
        try:
            client.run(_drop, key)
        except Exception:  # a worker left meanwhile: what it held left with it
            logger.debug("dropping %s failed", key, exc_info=True)
        raise
    products = [t[4] for t in tiles]
    logger.info("%s: %d x %d times %d x %d on %d worker(s), SPMD (%s): %d intermediate "
                "products in %d tile(s) of C, largest/mean %.3f; exchanges and products "
                "%.1f-%.1f ms a worker", _FUNC, *shape_a, *shape_b, len(ranks),
                {"gather": "A and B gathered", "ring": "B passed round"}[ranks[0]["how"]],
                sum(products), len(tiles), max(products) * len(tiles) / max(1, sum(products)),
                1e3 * min(r["seconds"] for r in ranks), 1e3 * max(r["seconds"] for r in ranks))
    like = A._meta if not to_host else sp.csr_matrix((0, 0), dtype=dt)
    like = same_kind(sparse_module(like).csr_matrix((0, 0), dtype=dt), A._meta)
    return da.Array({f.key: f for f in futures}, name,
                    chunks=(tuple(t[2] - t[1] for t in tiles), (shape_b[1],)), dtype=dt,
                    meta=like)
