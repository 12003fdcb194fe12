"""SpGEMM across a cluster, and the public ``mgpu.spgemm``.

A row of ``C = A @ B`` needs its row of A and all of B, so B is sent to the cluster once and
every worker fetches it, while A is cut into row tiles; each tile's product runs on a worker
and its rows of C stay there, as a dask array of CSR row tiles.

- ``spgemm(A, B, parts=N)`` with scipy (or cupyx) A and B cuts A at prefix sums of each
  row's *work*, its intermediate products (:func:`mgpu.partition.spgemm_split`), not its
  nnz: one entry of A that meets a long row of B costs as much as that row, so tiles of
  equal nnz can differ in time by orders of magnitude. The call waits for the tiles (their
  errors surface at the call, ``progress`` follows them) and returns them placed, as
  :func:`mgpu.from_scipy` does: C's chunks are futures of the tiles' own keys.
- ``spgemm(A, B)`` with a dask A (row tiles from ``mgpu.from_scipy``, or any dask array of
  sparse or dense chunks) is lazy, tile by tile in A's row chunks, as ``mgpu.spmv`` is.
- ``spgemm(A, B)`` with A and B both dask arrays (held on the workers) runs SPMD: the
  workers gather both through their communicator, NCCL between GPUs
  (:mod:`mgpu.distributed.spgemm_spmd`).

GPU workers (when every worker has one, as for :func:`mgpu.jaccard`; a dask A's cupyx
tiles) copy B to their device once per call (:func:`device_copy`), run the tile there and
keep the result there (cupyx CSR, or scipy with ``to_host``).
"""
from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from numbers import Integral
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.sparse as sp

from mgpu.backends import (is_gpu_array, is_sparse, on_device_of,
                           sparse_module, synchronize, to_device, to_host)
from mgpu.distributed.cluster import CLIENT, completed, current_client, workers_now
from mgpu.distributed.collection import device_copy, gpu_workers, place_as
from mgpu.distributed.inputs import check_dask_input, csr_chunks, is_sparse_array, row_tiles
from mgpu.ops.routes import register
from mgpu.ops.spgemm import check_csr_values, check_mask, check_sparse_pair, spgemm_local
from mgpu.ops.spgemm import spgemm as spgemm_one_device
from mgpu.ops.validation import (Boolean, Interval, IsCallable, check_array, check_param,
                                 float_dtype, is_dask_array, same_kind)
from mgpu.partition import part_sums, spgemm_row_work, split_counts

logger = logging.getLogger(__name__)

__all__ = ["spgemm", "spgemm_dask"]

_FUNC = "spgemm"
_REPLICATED = ("a scipy or cupyx sparse matrix: it is replicated to every worker, where a "
               "dask array would be gathered into every tile's task")


def _refuse_dask(X: Any, name: str) -> None:
    """B and the mask are whole matrices every tile reads (its rows of the mask): a dask
    one is refused, not gathered behind the caller's back."""
    if is_dask_array(X):
        raise TypeError(f"The '{name}' parameter of {_FUNC} must be {_REPLICATED}. Got a dask "
                        f"array instead; bring it here first ({name}.compute(), or "
                        f"mgpu.gather({name}) for sparse chunks).")


def _held_b(A: Any, B: Any, mask: Any, to_host: bool, client: Any) -> da.Array:
    """A dask B: the SPMD product of operands held on the workers
    (:func:`mgpu.distributed.spgemm_spmd.spgemm_spmd`), for a dask A without a mask."""
    if not is_dask_array(A):
        raise TypeError(f"The 'B' parameter of {_FUNC} is a dask array, which needs A as one "
                        "too (both held on the cluster's workers, mgpu.from_scipy). Got A of "
                        f"type {type(A).__name__}: pass B as a scipy or cupyx sparse matrix "
                        "(with parts=N to spread the product), or A as a dask array.")
    if mask is not None:
        raise ValueError(f"The 'mask' parameter of {_FUNC} is not taken with a dask B. Pass "
                         "B as a scipy or cupyx sparse matrix (sent to every worker), with "
                         "the mask.")
    from mgpu.distributed.spgemm_spmd import spgemm_spmd

    return spgemm_spmd(A, B, to_host=to_host, client=client)


def _checked_b(B: Any, A_shape: tuple[int, int]) -> Any:
    """A dask A's B checked as the one-device op checks it (kind, shape, index arrays,
    NaN/inf), before
    any task: B is the same for every tile, so it is looked at once, here."""
    # a dense B has its own op: the refusal names it
    dense = isinstance(B, np.ndarray) or (is_gpu_array(B) and not is_sparse(B))
    check_array(B, "B", _FUNC, accept_dense=False,
                kinds="a scipy or cupyx sparse matrix (replicated to every worker)",
                kinds_hint="; for a dense operand use mgpu.spmm (sparse × dense)" if dense
                else "")
    if A_shape[1] != B.shape[0]:
        raise ValueError(f"The 'B' parameter of {_FUNC} must have A.shape[1] = {A_shape[1]} "
                         f"rows (one per column of A). Got shape {tuple(B.shape)} instead, "
                         f"with A of shape {tuple(A_shape)}.")
    B = B.tocsr()
    check_csr_values(B, "B", _FUNC)
    return B


def _host_csr(X: Any) -> sp.csr_matrix:
    """X as a scipy CSR *matrix* (what is sent and cut: dask's concatenation knows it)."""
    return sp.csr_matrix(to_host(X))


def _product(A: Any, B: Any, M: Any, to_host: bool) -> Any:
    """One tile's product on the tile's device: a host B held by a GPU worker is copied to
    the device once (:func:`device_copy`), the tile's own rows of the mask each time."""
    B = on_device_of(B, A, lambda X: device_copy(X, to_device))
    M = None if M is None else on_device_of(M, A)
    return synchronize(spgemm_local(A, B, M, to_host))


def _tile_task(A: sp.csr_matrix, B: sp.csr_matrix, M: sp.csr_matrix | None, gpu: bool,
               to_host: bool) -> Any:
    """A tile cut on the client (checked there with B): to this worker's GPU when the
    client found GPUs on every worker, then its product."""
    return _product(to_device(A) if gpu else A, B, M, to_host)


def _dask_tile(A: Any, B: Any, rows: np.ndarray, M: Any = None, *, dt: np.dtype,
               to_host: bool) -> Any:
    """One row tile of a dask A, checked here as the one-device op checks an operand (only
    its task sees its index arrays and values), times B.

    ``rows``: the tile's row numbers in A, for a refusal that names A's row."""
    # A's columns (B's rows) are contracted, so blockwise hands A and B over as one-block
    # lists; taking the blocks keeps B the object the worker holds (one device copy)
    A = A[0] if isinstance(A, list) else A
    B = B[0] if isinstance(B, list) else B
    like = A
    A = A.tocsr()
    if A.dtype != dt:
        A = A.astype(dt)
    check_csr_values(A, "A", _FUNC, int(rows[0]) if len(rows) else 0)
    return same_kind(_product(A, B, M, to_host), like)


def _meta(like: Any, dtype: np.dtype, to_host: bool) -> Any:
    """An empty CSR of the kind C's chunks have: ``like``'s (scipy or cupyx), scipy with
    ``to_host``."""
    if to_host:
        return same_kind(sp.csr_matrix((0, 0), dtype=dtype), like)
    return same_kind(sparse_module(like).csr_matrix((0, 0), dtype=dtype), like)


def _one_block(name: str, value: Any, shape: tuple[int, int], client: Any) -> da.Array:
    """A matrix every tile reads as a one-chunk dask array: held by a task on one worker when
    there is a cluster (:func:`place_as`: a lost worker's copy is made again; a broadcast
    scatter would lose it for good, or wait for ever for a worker lost while it runs), from
    which the others fetch it; in the graph without one."""
    key = (name, 0, 0)
    held = place_as(client, key, value) if client is not None else value
    return da.Array({key: held}, name, chunks=((shape[0],), (shape[1],)), dtype=value.dtype,
                    meta=sp.csr_matrix((0, 0), dtype=value.dtype))


def _row_pieces(name: str, M: sp.csr_matrix, row_chunks: tuple[int, ...]) -> da.Array:
    """The mask's rows in A's row chunks, each chunk holding its own piece."""
    bounds = np.concatenate([[0], np.cumsum(row_chunks)]).astype(np.int64)
    graph = {(name, i, 0): M[int(r0):int(r1)]
             for i, (r0, r1) in enumerate(zip(bounds[:-1], bounds[1:]))}
    return da.Array(graph, name, chunks=(tuple(row_chunks), (M.shape[1],)), dtype=M.dtype,
                    meta=sp.csr_matrix((0, 0), dtype=M.dtype))


@register("spgemm")
def spgemm_dask(A: da.Array, B: Any, *, mask: Any = None, to_host: bool = False,
                client: Any = None) -> da.Array:
    """``A @ B`` for a dask A, lazily, in A's row chunks: what :func:`mgpu.ops.spgemm` (and
    :func:`spgemm`) give for a dask A.

    B and the mask are checked here, before any task (B is sent to the cluster at the call:
    to ``client``, default the current one); A's tiles are checked by their tasks (NaN or
    infinity in a tile fails it, naming A's row). An A also cut by columns is re-cut into
    row tiles at nnz prefix sums (:func:`mgpu.distributed.inputs.row_tiles`: one pass to
    count its rows), dense chunks are made CSR in the graph.
    """
    check_param(to_host, "to_host", _FUNC, Boolean())
    check_param(client, "client", _FUNC, [CLIENT, None])
    _refuse_dask(mask, "mask")
    if is_dask_array(B):
        return _held_b(A, B, mask, to_host, client)
    check_dask_input(A, "A", _FUNC)
    B = _checked_b(B, tuple(A.shape))
    shape = (int(A.shape[0]), int(B.shape[1]))
    # the mask's device is its own here: it is copied to the host and cut, like B
    M = None if mask is None else _host_csr(check_mask(mask, shape, mask, _FUNC))
    dt = float_dtype(np.result_type(A.dtype, B.dtype))
    B = _host_csr(B)
    if B.dtype != dt:
        B = B.astype(dt)
    A = row_tiles(A, _FUNC)
    if not is_sparse_array(A):  # dense chunks: the product of their CSR (A's nonzeros)
        A = csr_chunks(A)
    run = uuid.uuid4().hex
    client = client or current_client()
    B_d = _one_block(f"mgpu-spgemm-b-{run}", B, tuple(B.shape), client)
    rows = da.arange(shape[0], chunks=A.chunks[0], dtype=np.int64)
    args: list[Any] = [A, "ik", B_d, "kj", rows, "i"]
    if M is not None:
        args += [_row_pieces(f"mgpu-spgemm-mask-{run}", M, A.chunks[0]), "ij"]
    logger.debug("spgemm: a dask A %s in %d row tile(s), B %s with %d nnz (lazy)",
                 A.shape, A.numblocks[0], B.shape, B.nnz)
    return da.blockwise(_dask_tile, "ij", *args, dt=dt, to_host=bool(to_host), dtype=dt,
                        concatenate=False, meta=_meta(A._meta, dt, bool(to_host)),
                        name=f"mgpu-spgemm-{run}")


def _tiles(bounds: np.ndarray) -> list[tuple[int, int]]:
    """The non-empty tiles of a split (one empty tile for an A without rows)."""
    tiles = [(int(r0), int(r1)) for r0, r1 in zip(bounds[:-1], bounds[1:]) if r1 > r0]
    return tiles or [(0, 0)]


def _spread(A: Any, B: Any, mask: Any, to_host: bool, parts: int, client: Any,
            progress: Callable[[int], None] | None) -> da.Array:
    """``spgemm(A, B, parts=N)``: checked here, A cut by work, B placed once, a task per
    tile, waited for; C's chunks are the tiles' futures."""
    A, B = check_sparse_pair(A, B, _FUNC, product=True)
    m = int(A.shape[0])
    check_param(parts, "parts", _FUNC, Interval(Integral, 1, max(1, m)),
                hint=f" (at most A's {m} rows)")
    shape = (m, int(B.shape[1]))
    M = None if mask is None else _host_csr(check_mask(mask, shape, A, _FUNC))
    client = client or current_client()
    if client is None:
        raise ValueError(f"The 'parts' parameter of {_FUNC} spreads the product over a "
                         "cluster, and there is none: call mgpu.connect() first, or pass "
                         "client=.")
    A, B = _host_csr(A), _host_csr(B)
    work = spgemm_row_work(A, B)
    tiles = _tiles(split_counts(work, int(parts)))
    bounds = np.array([t[0] for t in tiles] + [tiles[-1][1]], dtype=np.int64)
    tile_work = part_sums(work, bounds)
    workers = sorted(workers_now(client))
    gpu = bool(workers) and len(gpu_workers(client)) == len(workers)
    dt = A.dtype
    logger.info("spgemm: %d x %d times %d x %d, %d intermediate products in %d row tile(s) "
                "on %d %s worker(s), largest/mean work %.3f", m, A.shape[1], B.shape[0],
                B.shape[1], int(work.sum()), len(tiles), len(workers), "GPU" if gpu else "CPU",
                float(tile_work.max() / tile_work.mean()) if tile_work.sum() else 1.0)
    # made before any task: a cupyx meta needs CuPy and a GPU here, as from_scipy's GPU chunks
    like = to_device(sp.csr_matrix((0, 0), dtype=dt)) if gpu and not to_host \
        else sp.csr_matrix((0, 0), dtype=dt)
    run = uuid.uuid4().hex
    name = f"mgpu-spgemm-{run}"
    shared = place_as(client, f"mgpu-spgemm-b-{run}", B)
    futures = []
    # each tile travels inside its task, which the scheduler keeps: a lost worker's tiles are
    # made again elsewhere (a copy of A on the scheduler while C lives, as from_scipy's)
    with dask.config.set({"distributed.admin.large-graph-warning-threshold": "1 PiB"}):
        for i, (r0, r1) in enumerate(tiles):
            # asked of a worker in turn, not pinned (a pin to a lost worker waits for ever):
            # Dask alone would run every tile beside B, the one input they share
            ask = {"workers": [workers[i % len(workers)]],
                   "allow_other_workers": True} if workers else {}
            futures.append(client.submit(
                _tile_task, A[r0:r1], shared, None if M is None else M[r0:r1], gpu,
                bool(to_host), key=(name, i, 0), pure=False, **ask))
    index = {f.key: i for i, f in enumerate(futures)}
    try:
        for fut in completed(futures, "spgemm's row tiles", client):
            # the tile's error raised here; a finished tile's data stays where it is (and a
            # tile whose worker was lost since is made again, without a wait here)
            if fut.status in ("error", "cancelled"):
                fut.result()
            if progress is not None:
                progress(int(tile_work[index[fut.key]]))
    except BaseException:
        client.cancel(futures)
        raise
    return da.Array({f.key: f for f in futures}, name,
                    chunks=(tuple(r1 - r0 for r0, r1 in tiles), (shape[1],)), dtype=dt,
                    meta=like)


def spgemm(A: Any, B: Any, *, mask: Any = None, to_host: bool = False,
           parts: int | None = None, client: Any = None,
           progress: Callable[[int], None] | None = None) -> Any:
    """Sparse matrix times sparse matrix, ``C = A @ B``, on one device or across a cluster.

    One device: :func:`mgpu.ops.spgemm` (row by row in two passes over the intermediate
    products on the GPU, Gustavson's product on every core of the CPU). Across a cluster,
    A's rows are cut into tiles and B is sent to the workers once; each tile's product runs
    on a worker with the one-device product, and its rows of C stay there.

    Parameters
    ----------
    A : {sparse matrix} of shape (n_rows, n_inner), or a dask array
        scipy or cupyx sparse matrix (any format), or a dask array: row tiles from
        ``mgpu.from_scipy(A, parts, axis=0)`` (they stay on the workers), or your own, of
        sparse or dense chunks (one cut by columns too is re-cut into row tiles at nnz
        prefix sums). A dask A gives a lazy C in A's row chunks; its tiles are checked by
        their tasks (NaN or infinity in one fails that task, naming A's row).
    B : {sparse matrix} of shape (n_inner, n_cols), or a dask array
        scipy or cupyx: every tile reads all of B, which is sent to the cluster once (held
        by a task on one worker, fetched by the others) and copied to each GPU worker's
        device once per call. One device: on A's device. A dask array (row tiles from
        ``mgpu.from_scipy``, best in as many tiles as A, on the same workers), with a dask
        A: the product runs at the call, SPMD, one task per worker holding A's tiles; each
        gathers all of A and B through the workers' communicator (NCCL between GPUs, so
        nothing passes through the host), cuts C's rows at prefix sums of their work, and
        keeps its rows of C. Where A and B do not fit on every GPU, B's tiles go round the
        ring of workers instead, each keeping its own tiles of A (C then comes in A's
        tiles); ``mgpu.spgemm.held-operands`` chooses (auto, gather, ring). No mask.
    mask : {sparse matrix} of shape (n_rows, n_cols), optional
        Compute C only at the stored positions of ``mask`` (its values are not used; stored
        zeros are refused as ambiguous). Across a cluster it is cut into A's row tiles, each
        tile's rows travelling with its task.
    to_host : bool, default=False
        GPU only: C's rows as scipy CSR, computed in row blocks that each fit the device
        (see :func:`mgpu.ops.spgemm`); across a cluster, each GPU worker's tiles then stay
        in its host memory.
    parts : int, optional
        Spread the product of scipy (or cupyx: copied to the host first) A and B over the
        cluster in this many row tiles of A (at most A's rows), cut at prefix sums of each
        row's work, its intermediate products (:func:`mgpu.partition.spgemm_split`), not its
        nnz; a tile that would hold no row is left out. The call waits for the tiles.
        Default: one device, or a dask A's own row chunks.
    client : distributed.Client, optional
        With ``parts`` or a dask A: the cluster (default: the current one, ``mgpu.connect``).
        With a dask A and B, the cluster that holds them.
    progress : callable, optional
        With ``parts``: called with each tile's intermediate products as it finishes.

    Returns
    -------
    C : {sparse matrix} of shape (n_rows, n_cols), or a dask array of CSR row tiles
        One device: canonical CSR (sorted columns, no duplicates, no stored zeros) of A's
        kind, as :func:`mgpu.ops.spgemm`. With ``parts`` or a dask A: a **dask array**
        chunked by the row tiles and one chunk of columns, whose chunks are canonical CSR on
        the workers (scipy on CPU workers, cupyx on GPU workers, scipy with ``to_host``):
        ``mgpu.gather(C)`` (or ``C.compute()``) brings them here. With ``parts`` the tiles
        are computed and held on the workers (C's chunks are futures, as from
        ``mgpu.from_scipy``); with a dask A, C is lazy. With a dask A and B: one tile per
        worker (in A's tiles when B went round the ring), computed and held (a tile lost
        with its worker is not made again: call again). float32 only where A and B both are,
        else float64.

    Raises
    ------
    TypeError
        A, B or mask is not a sparse matrix; B or mask is a dask array.
    ValueError
        Shapes that do not match, operands on different devices (one device and ``parts``),
        NaN or infinity among the stored values, a mask with stored zeros, ``parts`` not an
        int in [1, n_rows] or given with a dask A, ``parts`` without a cluster, ``client``
        or ``progress`` without ``parts``. All before any task is submitted.
    mgpu.DeviceMemoryError
        A C (or a tile's rows of C) too large for its GPU, before the numeric pass; across a
        cluster, from the tile's task, at the call (``parts``) or at compute (a dask A).

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp
    >>> from mgpu.distributed import from_scipy
    >>> A = sp.random(300, 80, density=0.05, format="csr", random_state=0)
    >>> B = sp.random(80, 50, density=0.1, format="csr", random_state=1)
    >>> C = spgemm(from_scipy(A, 3), B)  # lazy, in A's three row tiles
    >>> C.numblocks, bool(abs(C.compute() - A @ B).max() < 1e-12)
    ((3, 1), True)

    On a cluster, tiles cut by their work:

    >>> import mgpu
    >>> with mgpu.connect(gpus=False, n_workers=2) as client:  # doctest: +SKIP
    ...     done = []
    ...     C = spgemm(A, B, parts=4, progress=done.append)
    ...     print(C.numblocks, sum(done), bool(abs(mgpu.gather(C) - A @ B).max() < 1e-12))
    (4, 1) 6015 True

    A and B held on a cluster: one SPMD job, C's rows cut by their work on the workers:

    >>> with mgpu.connect(gpus=False, n_workers=2) as client:  # doctest: +SKIP
    ...     C = spgemm(from_scipy(A, 2), from_scipy(sp.csr_matrix(A.T), 2))
    ...     print(C.numblocks, bool(abs(mgpu.gather(C) - A @ A.T).max() < 1e-12))
    (2, 1) True
    """
    check_param(to_host, "to_host", _FUNC, Boolean())
    check_param(parts, "parts", _FUNC, [Interval(Integral, 1, None), None])
    check_param(client, "client", _FUNC, [CLIENT, None])
    check_param(progress, "progress", _FUNC, [IsCallable(), None])
    _refuse_dask(mask, "mask")
    if is_dask_array(B) and not is_dask_array(A):
        _held_b(A, B, mask, to_host, client)  # refused: B held on the cluster, A here
    if is_dask_array(A):
        if parts is not None or progress is not None:
            which = "parts" if parts is not None else "progress"
            raise ValueError(f"The '{which}' parameter of {_FUNC} is for scipy or cupyx A "
                             "spread with parts=N; a dask A is multiplied lazily in its own "
                             "row chunks. Leave it out (or rechunk A's rows).")
        return spgemm_dask(A, B, mask=mask, to_host=to_host, client=client)
    if parts is None:
        if client is not None or progress is not None:
            which = "client" if client is not None else "progress"
            raise ValueError(f"The '{which}' parameter of {_FUNC} is for a product spread "
                             "over a cluster: pass parts=N with it (or a dask A).")
        return spgemm_one_device(A, B, mask=mask, to_host=to_host)
    return _spread(A, B, mask, bool(to_host), int(parts), client, progress)
