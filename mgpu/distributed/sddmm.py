"""Distributed SDDMM over a dask array of CSR tiles, and the public ``mgpu.sddmm``.

S is cut into tiles at nnz prefix sums (:func:`mgpu.from_scipy`) and stays on the
workers across calls; only the dense factors move. Tile ``(i, j)`` needs the rows of A of
its row range and the rows of B of its column range, so the factor that the cut does not
split (A for column tiles, B for row tiles) is replicated: cut S along the dimension whose
factor is larger, so that the smaller one is the one copied to every worker.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize
from distributed import futures_of

from mgpu.backends import on_device_of, synchronize, to_device
from mgpu.distributed.cluster import completed, current_client
from mgpu.distributed.collection import block_futures, device_copy
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

# Where the tiles of placed collections are, by (client id, tile key): (workers, when asked).
# A call restricts each tile's task (loosely) to its tile's workers; asking the scheduler every
# call would be a round trip on every call's path, so the answer is kept for _HOMES_TTL
# seconds. A stale answer costs speed, never correctness: the restriction is loose, so a task
# whose tile moved (its worker lost) runs where the scheduler finds its data.
_HOMES: OrderedDict[tuple[str, Any], tuple[tuple[str, ...], float]] = OrderedDict()
_HOMES_TTL = 10.0
_HOMES_MAX = 1 << 14
_homes_lock = threading.Lock()


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


def tile_homes(S: da.Array, client: Any) -> dict[tuple[int, ...], tuple[str, ...]]:
    """The workers holding each tile of a placed S, by block index, asked of the scheduler at
    most once every ``_HOMES_TTL`` seconds per tile (one round trip for all of them)."""
    tiles = block_futures(S, client)  # placed: no round trip
    now = time.monotonic()
    with _homes_lock:
        hits = {idx: _HOMES.get((client.id, f.key)) for idx, f in tiles.items()}
    if all(h is not None and now - h[1] < _HOMES_TTL for h in hits.values()):
        return {idx: h[0] for idx, h in hits.items()}  # type: ignore[index]
    who = client.who_has(list(tiles.values()))
    out = {idx: tuple(who.get(f.key, ())) for idx, f in tiles.items()}
    with _homes_lock:
        for idx, f in tiles.items():
            _HOMES[(client.id, f.key)] = (out[idx], now)
            _HOMES.move_to_end((client.id, f.key))
        while len(_HOMES) > _HOMES_MAX:
            _HOMES.popitem(last=False)
    return out


def _strata_homes(S: da.Array, homes: dict[tuple[int, ...], tuple[str, ...]] | None,
                  axis: int) -> list[list[str]]:
    """For each row (axis 0) or column (axis 1) stratum of S, the workers holding its tiles."""
    out: list[list[str]] = [[] for _ in range(S.numblocks[axis])]
    for idx, workers in (homes or {}).items():
        out[idx[axis]].extend(w for w in workers if w not in out[idx[axis]])
    return out


def _factor(X: Any, name: str, S: da.Array, axis: int,
            homes: dict[tuple[int, ...], tuple[str, ...]] | None) -> da.Array:
    """A dense factor as a lazy dask array chunked like S's rows (A, ``axis=0``) or columns
    (B), to go in the same graph as the tiles' tasks.

    A numpy/cupy factor, checked by the caller (both before either is sent), travels in the
    graph: each piece in a task of its own that holds it, asked (not pinned) to run on the
    workers of its tiles (``homes``), so that the scheduler keeps it and makes it again
    elsewhere if its worker is lost. An unsplit factor is one task on one worker, from which
    the others fetch it (a broadcast scatter's copies are dropped by Dask's memory manager,
    and a broadcast waits forever for a worker lost while it runs). A dask factor is
    rechunked to S's tiles.
    """
    K = X.shape[1]
    row_chunks = S.chunks[axis]
    chunks = (row_chunks, (K,))
    if is_dask_array(X):
        return X.rechunk(chunks) if X.chunks != chunks else X
    # Factors change every call of an iterative method: a fresh name instead of hashing
    # hundreds of MB of values for a deterministic one.
    key = f"{_PLACED}{name}-{uuid.uuid4().hex}"
    bounds = np.concatenate([[0], np.cumsum(row_chunks)]).astype(np.int64)
    graph = {(key, i, 0): X[bounds[i]:bounds[i + 1]] for i in range(len(row_chunks))}
    holders = _strata_homes(S, homes, axis) if len(row_chunks) > 1 else []
    where = {(key, i, 0): list(w) for i, w in enumerate(holders) if w}
    # dict.get: the scheduler asks it for every key of the layer, and a piece without
    # holders (None) has no restriction
    with dask.annotate(workers=where.get, allow_other_workers=True) if where else nullcontext():
        return da.Array(graph, key, chunks=chunks, dtype=X.dtype, meta=X[:0])


def _persist(client: Any, *xs: da.Array) -> list[da.Array]:
    """``client.persist`` of the arrays in one graph, one message to the scheduler, without
    waiting. Factors travel inside that graph on purpose: distributed's warning about a large
    graph (and its advice to scatter) is not for them."""
    with dask.config.set({"distributed.admin.large-graph-warning-threshold": "1 PiB"}):
        return list(client.persist(list(xs), optimize_graph=False))


def place_factors(S: da.Array, A: Any, B: Any, *, client: Any = None) -> tuple[da.Array, da.Array]:
    """Send the factors to the workers of S's tiles once, for repeated :func:`sddmm` calls.

    Returns dask arrays chunked like S's rows (A) and columns (B): a split factor's pieces
    sit on the workers of their tiles, an unsplit one on one worker (the others fetch it at
    their first call and keep it). Passing them to ``sddmm(S, A_d, B_d)`` then moves no
    factor data, which is what an iterative method whose factors live on the workers pays,
    and what the scaling benchmark times. Both are sent in one graph, and the call returns
    once they are on the workers.

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
    homes = tile_homes(S, client) if is_placed(S) else None
    A_d, B_d = _persist(client, _factor(A, "A", S, 0, homes), _factor(B, "B", S, 1, homes))
    for fut in completed(futures_of([A_d, B_d]), "place_factors sending the factors", client):
        fut.result()  # surfaces an error now, not at the first call
    return A_d, B_d


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
        Dense factors: numpy or cupy, or dask arrays. With a dask S, numpy/cupy factors
        travel in the call's graph (the unsplit one to one worker, from which the others
        fetch it), dask factors (a previous call's lazy result, say) are rechunked to S's
        tiles, and factors from :func:`place_factors` are already there.
    hadamard : bool, default=True
        Multiply by S's values; False gives the plain sampled product on S's pattern.
    plan : SDDMMPlan, optional
        One device only: from :func:`mgpu.sddmm_plan` on this S, to reuse its tuned scheme
        and tiled copy of S across calls; on the GPU also its prepared launch and checks,
        its results sharing one copy of S's index arrays (read-only: details in
        :func:`mgpu.ops.sddmm`).
    check_finite : bool, default=True
        Refuse NaN or infinity in the factors, every value of them (and S's stored values
        with ``hadamard``), naming the first place. One device: on the GPU the device checks
        them beside the product and the call waits once, for its stream, reading a flag in
        pinned host memory with the result; details in :func:`mgpu.ops.sddmm`. ``False``
        skips the check and the wait, for factors known to be finite.
    device, working_memory, progress
        One device only, as :func:`mgpu.ops.sddmm`: ``device='gpu'`` streams host operands
        larger than the GPU through it in tiles.

    Returns
    -------
    P : CSR matrix, or dask array of CSR tiles shaped like S
        Same pattern as S; float32 when every operand is float32, float64 otherwise; a
        ``csr_array`` (or chunks of them) from a scipy sparse array. With S on the workers
        (:func:`mgpu.from_scipy`, or persisted), the call submits every task (factor pieces
        and tiles) in one graph and returns without waiting: P's chunks are futures, as
        ``client.persist`` gives (``distributed.futures_of(P)``, ``distributed.wait(P)``,
        ``P.compute()``), so a loop of calls queues its work on the cluster instead of
        waiting on each. Your own dask S gives a lazy P (start it with ``client.persist``).

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

    A loop whose next factor is computed from the last product, waiting only at the end:

    >>> import mgpu
    >>> Sd, a, x = from_scipy(S, 4, axis=0), A, A
    >>> for _ in range(3):
    ...     a = mgpu.spmm(sddmm(Sd, a, B), B) / 10  # dask: nothing waited for
    ...     x = mgpu.spmm(sddmm(S, x, B), B) / 10  # one device
    >>> np.allclose(a.compute(), x)
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
    homes = tile_homes(S, client) if placed else None
    A_d = _factor(A, "A", S, 0, homes)
    B_d = _factor(B, "B", S, 1, homes)
    dt = sddmm_dtype(S.dtype if hadamard else A.dtype, A.dtype, B.dtype)
    meta = S._meta.astype(dt) if hasattr(S._meta, "astype") else S._meta
    check = tuple(is_dask_array(X) and not X.name.startswith(_PLACED) for X in (A, B))
    logger.debug("sddmm: %s tiles of S, K=%d, hadamard=%s", S.numblocks, A.shape[1], hadamard)
    name = "mgpu-sddmm-" + (tokenize(S, A_d, B_d, hadamard) if not placed else uuid.uuid4().hex)
    # A placed S: each tile's task is asked (not pinned) to run where its tile is. Dask alone
    # would run it where the largest inputs are, and a factor can outweigh a tile, so S would
    # follow the factors; a worker that is busy or gone can still hand the task on.
    where = {(name,) + idx: list(w) for idx, w in (homes or {}).items() if w}
    with dask.annotate(workers=where.get, allow_other_workers=True) if where else nullcontext():
        P = da.blockwise(
            _sddmm_block, "ij", S, "ij", A_d, "ik", B_d, "jk",
            hadamard=bool(hadamard), check=check, finite=finite, concatenate=False, dtype=dt,
            meta=meta, name=name,
        )
    if not placed:  # lazy in, lazy out: the tiles' tasks run where Dask puts them
        return P
    # every task of the call (factor pieces, tiles) in one message, and no wait for it
    return _persist(client, P)[0]
