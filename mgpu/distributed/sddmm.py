"""Distributed SDDMM over a dask array of CSR tiles, and the public ``mgpu.sddmm``.

S is cut into tiles at nnz prefix sums (:func:`mgpu.from_scipy`) and stays on the
workers across calls; only the dense factors move. Tile ``(i, j)`` needs the rows of A of
its row range and the rows of B of its column range, so the factor that the cut does not
split (A for column tiles, B for row tiles) is replicated: cut S along the dimension whose
factor is larger, so that the smaller one is the one copied to every worker.
"""
from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize

from mgpu.backends import on_device_of, synchronize, to_device
from mgpu.distributed.cluster import current_client, task_placement
from mgpu.distributed.collection import block_futures, chunk_workers, device_copy, place_as
from mgpu.distributed.inputs import check_dask_input, csr_chunks, is_placed
from mgpu.ops import sddmm as sddmm_one_device
from mgpu.ops.sddmm import (
    check_dense_factor,
    check_dense_factors,
    check_sddmm_options,
    check_sddmm_shapes,
    check_sparse,
    sddmm_dtype,
    sddmm_local,
)
from mgpu.ops.validation import is_dask_array, same_kind

logger = logging.getLogger(__name__)

__all__ = ["place_factors", "sddmm", "sddmm_axis"]


def sddmm_axis(shape: tuple[int, int]) -> int:
    """The axis to cut S along for SDDMM so that the smaller factor is the replicated one.

    Column tiles (axis 1) split B and copy A to every worker; row tiles (axis 0) split A and
    copy B. With S of shape (M, N), A is M×K and B is N×K, so cut columns when M <= N.

    Examples
    --------
    >>> sddmm_axis((100_000, 300_000)), sddmm_axis((300_000, 100_000))
    (1, 0)
    """
    return 1 if shape[0] <= shape[1] else 0


# Keys of factors that were checked on the client and sent by _factor (place_factors).
_PLACED = "mgpu-sddmm-factor-"


def _on_device_of(X: Any, S: Any) -> Any:
    """X on S's device; a host factor held by a GPU worker is copied there once
    (device_copy)."""
    return on_device_of(X, S, lambda X: device_copy(X, to_device))


def _sddmm_block(S: Any, A: Any, B: Any, hadamard: bool, check: tuple[bool, bool],
                 finite: bool = True) -> Any:
    """One tile: validate what only the task can see, move factors to S's device, run.

    ``check`` says which factors came as dask arrays unseen by the client's checks;
    ``finite`` whether values are checked at all (``check_finite``).
    """
    # K is one chunk, so blockwise hands each factor over as a one-block list; taking the
    # block itself (instead of concatenate=True) keeps it the object the worker holds: no
    # host copy, and the device copy of _on_device_of is found again on the next call.
    A, B = (X[0] if isinstance(X, list) else X for X in (A, B))
    for X, name, needed in ((A, "A", check[0]), (B, "B", check[1])):
        if needed:
            check_dense_factor(X, name, finite)
    A, B = _on_device_of(A, S), _on_device_of(B, S)
    return same_kind(synchronize(sddmm_local(check_sparse(S, hadamard and finite), A, B,
                                             hadamard)), S)


def _factor(X: Any, name: str, S: da.Array, axis: int, client: Any) -> da.Array:
    """A dense factor as a dask array chunked like S's rows (A, ``axis=0``) or columns (B).

    A numpy/cupy factor, checked by the caller (both before either is sent), goes to the workers:
    each piece to the workers of its tiles (an unsplit factor to one worker, from which the
    others fetch it), inside a task the scheduler keeps (:func:`mgpu.distributed.collection.place_as`).
    """
    K = X.shape[1]
    row_chunks = S.chunks[axis]
    chunks = (row_chunks, (K,))
    if is_dask_array(X):
        return X.rechunk(chunks) if X.chunks != chunks else X
    # Factors change every call of an iterative method: a fresh name instead of hashing
    # hundreds of MB of values for a deterministic one.
    key = f"{_PLACED}{name}-{uuid.uuid4().hex}"
    if client is None:
        return da.from_array(X, chunks=chunks, asarray=False, name=key)
    bounds = np.concatenate([[0], np.cumsum(row_chunks)]).astype(np.int64)
    holders = _holders(S, client, axis) if len(row_chunks) > 1 else [[]]
    graph = {}
    for i in range(len(row_chunks)):
        # Held by a task, not scattered, so that a lost worker's pieces are made again
        # elsewhere as S's tiles are. An unsplit factor is put on one worker and fetched by
        # the others: a broadcast scatter's copies are dropped by Dask's memory manager, and
        # a broadcast waits forever for a worker lost while it runs.
        graph[(key, i, 0)] = place_as(client, (key, i, 0), X[bounds[i]:bounds[i + 1]],
                                      workers=holders[i])
    return da.Array(graph, key, chunks=chunks, dtype=X.dtype, meta=X[:0])


def place_factors(S: da.Array, A: Any, B: Any, *, client: Any = None) -> tuple[da.Array, da.Array]:
    """Send the factors to the workers of S's tiles once, for repeated :func:`sddmm` calls.

    Returns dask arrays chunked like S's rows (A) and columns (B): a split factor's pieces
    sit on the workers of their tiles, an unsplit one is copied to every worker. Passing
    them to ``sddmm(S, A_d, B_d)`` then moves no factor data, which is what an iterative
    method whose factors live on the workers pays, and what the scaling benchmark times.

    Parameters
    ----------
    S : dask array of CSR tiles
        From :func:`mgpu.from_scipy`, already on the workers.
    A : ndarray of shape (n_rows, K)
    B : ndarray of shape (n_cols, K)
        numpy or cupy; checked (shapes, NaN/inf) before anything is sent.
    client : distributed.Client, optional
        Default: the current client.

    Returns
    -------
    A_d, B_d : dask arrays
    """
    if not is_dask_array(S):
        raise TypeError("The 'S' parameter of place_factors must be a dask array of tiles (from "
                        f"mgpu.from_scipy). Got {type(S).__name__} instead.")
    check_sddmm_shapes(S.shape, getattr(A, "shape", ()), getattr(B, "shape", ()))
    for X, name in ((A, "A"), (B, "B")):
        if is_dask_array(X):
            raise TypeError(f"The '{name}' parameter of place_factors must be a numpy or cupy "
                            "array; a dask factor is already on the workers.")
    client = client or current_client()
    if client is None:
        raise ValueError("place_factors needs a cluster: call mgpu.connect() first.")
    check_dense_factors({"A": A, "B": B})  # both, before either is sent
    return _factor(A, "A", S, 0, client), _factor(B, "B", S, 1, client)


def _holders(S: da.Array, client: Any, axis: int) -> list[list[str]]:
    """For each row (axis 0) or column (axis 1) stratum of S, the workers holding its tiles."""
    n = S.numblocks[axis]
    out: list[list[str]] = [[] for _ in range(n)]
    if client is None:
        return out
    where = chunk_workers(S, client)
    for idx, workers in where.items():
        out[idx[axis]].extend(w for w in workers if w not in out[idx[axis]])
    return out


def sddmm(S: Any, A: Any, B: Any, *, hadamard: bool = True, plan: Any = None,
          check_finite: bool = True, device: str | None = None, working_memory: Any = None,
          progress: Callable[[int], None] | None = None) -> Any:
    """Sampled dense-dense product ``P = S ∘ (A Bᵀ)`` on one device or across a cluster.

    Parameters
    ----------
    S : sparse matrix of shape (n_rows, n_cols), or a dask array of CSR tiles
        scipy or cupyx (one device), or a dask array made by :func:`mgpu.from_scipy`
        (column tiles, row tiles or a grid), which stays on the workers between calls;
        ``from_scipy(S, axis=sddmm_axis(S.shape))`` replicates the smaller factor. Your own
        dask array (sparse or dense chunks, any tiling) gives a lazy graph: its chunks are
        made CSR by the tiles' tasks.
    A : array of shape (n_rows, K)
    B : array of shape (n_cols, K)
        Dense factors: numpy or cupy, or dask arrays. With a dask S, numpy/cupy factors are
        sent to the workers once per call (the unsplit one to one worker, from which the
        others fetch it) and dask factors are rechunked to S's tiles.
    hadamard : bool, default=True
        Multiply by S's values; False gives the plain sampled product on S's pattern.
    plan : SDDMMPlan, optional
        One device only: from :func:`mgpu.sddmm_plan` on this S, to reuse its tuned scheme
        and tiled copy of S across calls.
    check_finite : bool, default=True
        Refuse NaN or infinity in the factors (and S's values with ``hadamard``); ``False``
        skips the check and its wait, for factors known to be finite, as in
        :func:`mgpu.ops.sddmm`.
    device, working_memory, progress
        One device only, as :func:`mgpu.ops.sddmm`: ``device='gpu'`` streams host operands
        larger than the GPU through it in tiles.

    Returns
    -------
    P : CSR matrix, or dask array of CSR tiles shaped like S
        Same pattern as S; float32 when every operand is float32, float64 otherwise; a
        ``csr_array`` (or chunks of them) from a scipy sparse array.

    Raises
    ------
    TypeError, ValueError
        As :func:`mgpu.ops.sddmm`, before any task is submitted, for everything that
        can be seen without computing: shapes, kinds, NaN/inf in numpy/cupy factors, and
        operands on different devices in the one-device case. A dask factor holding NaN,
        or a tile with duplicate entries, fails its task with the same message.
    ImportError, RuntimeError
        ``device='gpu'`` without CuPy (the message says ``pip install 'mgpu[gpu]'``) or
        without a GPU, as :func:`mgpu.ops.sddmm`.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp
    >>> from mgpu.distributed import from_scipy
    >>> S = sp.random(200, 100, density=0.05, format="csr", random_state=0)
    >>> A, B = np.ones((200, 8)), np.ones((100, 8))
    >>> P = sddmm(from_scipy(S, 4, axis=1), A, B)
    >>> np.allclose(P.compute().toarray(), 8 * S.toarray())
    True
    """
    check_sddmm_options(hadamard, check_finite, working_memory, progress, device)
    if not is_dask_array(S):
        return sddmm_one_device(S, A, B, hadamard=hadamard, plan=plan,
                                check_finite=check_finite, device=device,
                                working_memory=working_memory, progress=progress)
    if device is not None or working_memory is not None or progress is not None:
        raise ValueError("The 'device', 'working_memory' and 'progress' parameters of sddmm "
                         "are for one matrix on one device; a distributed S runs where its "
                         "tiles are. Leave them out.")
    if plan is not None:
        raise ValueError("The 'plan' parameter of sddmm is for one matrix on one device; a "
                         "distributed S is planned per tile on its worker. Leave it out.")
    check_sddmm_shapes(S.shape, getattr(A, "shape", ()), getattr(B, "shape", ()))
    check_dask_input(S, "S", "sddmm")
    client = current_client()
    placed = client is not None and is_placed(S)
    if not placed:  # a user's array: any tiling, CSR made of its chunks in the graph
        S = csr_chunks(S)
    finite = bool(check_finite)
    # both host/device factors are checked before either is sent
    check_dense_factors({n: X for n, X in (("A", A), ("B", B)) if not is_dask_array(X)},
                        finite)
    A_d = _factor(A, "A", S, 0, client)
    B_d = _factor(B, "B", S, 1, client)
    dt = sddmm_dtype(S.dtype if hadamard else A.dtype, A.dtype, B.dtype)
    meta = S._meta.astype(dt) if hasattr(S._meta, "astype") else S._meta
    check = tuple(is_dask_array(X) and not X.name.startswith(_PLACED) for X in (A, B))
    logger.debug("sddmm: %s tiles of S, K=%d, hadamard=%s", S.numblocks, A.shape[1], hadamard)
    if not placed:  # lazy in, lazy out: the tiles' tasks run where Dask puts them
        return da.blockwise(
            _sddmm_block, "ij", S, "ij", A_d, "ik", B_d, "jk",
            hadamard=bool(hadamard), check=check, finite=finite, concatenate=False, dtype=dt,
            meta=meta,
            name="mgpu-sddmm-" + tokenize(S, A_d, B_d, hadamard),
        )
    return _submit_tiles(S, A_d, B_d, bool(hadamard), check, finite, dt, meta, client)


def _submit_tiles(S: da.Array, A_d: da.Array, B_d: da.Array, hadamard: bool,
                  check: tuple[bool, bool], finite: bool, dt: np.dtype, meta: Any,
                  client: Any) -> da.Array:
    """One task per tile of S, started now, each asked to run where its tile is.

    Dask alone would run a tile's task where the largest inputs are, and a GPU tile can look
    small next to a factor, so S would follow the factors. The loose restriction keeps S
    where :func:`mgpu.from_scipy` put it, while a worker that is busy or gone can
    still hand the task to another.
    """
    tiles = block_futures(S, client)
    a, b = block_futures(A_d, client), block_futures(B_d, client)
    where = client.who_has(list(tiles.values()))
    name = f"mgpu-sddmm-{uuid.uuid4().hex}"
    graph = {}
    for (i, j), tile in tiles.items():
        key = (name, i, j)
        graph[key] = client.submit(
            _sddmm_block, tile, a[(i, 0)], b[(j, 0)], hadamard, check, finite, key=key,
            **task_placement(list(where.get(tile.key, ())), False),
        )
    return da.Array(graph, name, chunks=S.chunks, dtype=dt, meta=meta)
