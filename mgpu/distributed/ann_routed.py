"""The proximity-graph index partitioned by clusters over a cluster's workers, searched SPMD:
each query goes to the shards that hold the rows near it, not to every shard.

Cut by rows (:mod:`mgpu.distributed.ann`), every shard searches every query: the workers
share the memory, not the work, and four GPUs search about as fast as one. Here, as in
Pyramid (Deng et al., 2019) and IVF's coarse quantiser, the rows are cut by where they lie:

- **fit**: k-means (scikit-learn's) on a sample of the rows, taken to the client, gives
  ``32`` centroids a shard; one SPMD job (:func:`mgpu.distributed.spmd.spmd`, NCCL between
  GPU workers) then runs a rank on every worker holding row tiles. Each rank assigns its
  rows to their nearest centroid; the ranks sum the counts, and rank 0 deals the centroids
  out to the ranks in groups of near-equal rows, cut across the centroids' principal
  directions where a cut parts the fewest centroids from their nearest ones (neighbouring
  centroids kept together, as Pyramid keeps its partitions of the centres' graph); rows
  go to the rank of their centroid
  (``comm.sendrecv`` rounds), and each rank builds the graph of what it holds and keeps it,
  with its rows' global ids, on its worker.
- **kneighbors**: one SPMD job on the same workers; the queries' row tiles lie beside the
  shards. Each rank routes its queries to the ``probes`` shards whose centroids lie nearest
  (a shard's distance: its nearest centroid's), sends them there, searches what it received
  in its own graph, sends the lists back, and merges each query's lists (ties to the lower
  id). With ``probes`` equal to the shards every shard searches every query.

A query's neighbours that lie in a shard it is not sent to are not found: recall falls
where clusters' borders cut the neighbourhoods, and ``probes`` buys it back. The shards
live on their workers until the index is fitted again or dropped; a lost worker loses its
shard, and the index must be fitted again (the search says so).
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dask.array as da
import dask.config
import distributed
import numpy as np

from mgpu.backends import (ann_build_lookup, ann_half_lookup, ann_prepare_lookup,
                           ann_search_lookup, array_module, is_gpu_array, synchronize,
                           to_device, to_host)
from mgpu.distributed.ann import gpu_settings
from mgpu.distributed.cluster import current_client
from mgpu.distributed.collection import block_futures
from mgpu.distributed.inputs import check_dask_input, is_placed, is_sparse_array, row_tiles
from mgpu.distributed.knn import merge_all
from mgpu.distributed.spmd import spmd
from mgpu.distributed.tiles import RowTiles
from mgpu.ops.distances import check_knn_input

logger = logging.getLogger(__name__)

__all__ = ["Routed", "build_routed", "search_routed"]

_FIT = "GraphIndex.fit"
_SEARCH = "GraphIndex.kneighbors"
_CENTROIDS = 32  # centroids a shard: queries are routed by finer clusters than the shards
_SAMPLE = 256  # sampled rows a centroid, for k-means on the client
_CHUNK = 1 << 18  # rows scored against the centroids at a time
_PIECE = 1 << 28  # bytes of an array a rank sends in one round of an exchange
_REPORT_SECONDS = 1.0  # the build's progress reports, at most one a second

# (index key, worker address) -> the shard a rank built; workers of a threaded cluster
# share a process
_HELD: dict[tuple[str, str], _Shard] = {}
# (search job, query tile, 0 distances / 1 ids) -> a tile's answer, from the end of the job
# until the task that takes it into Dask's keeping (:func:`_take`) runs on the same worker
_ANSWERS: dict[tuple[str, int, int], np.ndarray] = {}
_LOCK = threading.Lock()


@dataclass
class _Shard:
    """A rank's part of the index: its rows as the kernels take them (None when it got no
    rows), its graph, each row's global id, and the dtype of the rows as built, which the
    queries take (every rank's the same; the rows themselves may be kept halved)."""

    data: Any
    graph: Any
    degree: Any
    ids: Any
    dtype: Any


@dataclass
class Routed:
    """The client's handle of an index partitioned by clusters.

    Attributes
    ----------
    key : str
        The name its shards are kept under on their workers.
    anchor : RowTiles
        A one-number tile on each shard's worker, in rank order: it lays out the ranks of
        every job on the index (the same workers, in the same order).
    centroids : ndarray of shape (n_centroids, n_features)
    owner : ndarray of shape (n_centroids,)
        The rank (shard) of each centroid.
    rows : list of int
        Each shard's rows, in rank order.
    seconds : list of float
        Each search's time in its job: its slowest rank's, from the queries on its device
        to its merged lists (without Dask's start of the job and the answers' way back).
    """

    key: str
    anchor: RowTiles
    centroids: np.ndarray
    owner: np.ndarray
    rows: list[int]
    client: Any
    seconds: list[float] = field(default_factory=list)

    @property
    def shards(self) -> int:
        return len(self.rows)


def _address() -> str:
    return distributed.get_worker().address


def _drop(key: str, dask_worker: Any = None) -> int:
    """Forget the shard of index ``key`` on this worker; how many were dropped."""
    with _LOCK:
        mine = [k for k in _HELD if k[0] == key and k[1] == dask_worker.address]
        for k in mine:
            del _HELD[k]
    return len(mine)


def _release(client: Any, key: str) -> None:
    """Drop an index's shards from its workers, when its handle is collected: from a thread
    of its own, since the collection may happen on the client's event loop, where a call to
    the cluster cannot wait."""
    def drop() -> None:
        try:
            if client.status == "running":
                client.run(_drop, key)
        except Exception:  # the cluster is closing or gone: the shards went with it
            logger.debug("dropping the shards of %s failed", key, exc_info=True)

    threading.Thread(target=drop, name="mgpu-ann-drop", daemon=True).start()


def _marker(gpu: bool) -> Any:
    """A tile of one zero, on the device of the worker's shard."""
    one = np.zeros((1, 1))
    return to_device(one) if gpu else one


def _to_centroids(X: Any, centroids: Any, sq_c: Any, xp: Any) -> Any:
    """The squared euclidean distances of rows X to each centroid, (len(X), c)."""
    return xp.einsum("ij,ij->i", X, X)[:, None] - 2.0 * (X @ centroids.T) + sq_c[None, :]


def _nearest(data: Any, centroids: Any, xp: Any) -> Any:
    """Each row's nearest centroid, in chunks of rows: the (rows, centroids) distances are
    never held whole."""
    sq_c = xp.einsum("ij,ij->i", centroids, centroids)
    out = xp.empty(data.shape[0], dtype=xp.int64)
    for lo in range(0, data.shape[0], _CHUNK):
        out[lo:lo + _CHUNK] = xp.argmin(_to_centroids(data[lo:lo + _CHUNK], centroids, sq_c,
                                                      xp), axis=1)
    return out


def _routes(Q: Any, centroids: Any, owner: np.ndarray, ranks: int, probes: int,
            xp: Any) -> Any:
    """Each query's ``probes`` nearest shards, nearest first (a shard's distance: its
    nearest centroid's), (len(Q), probes), in chunks of queries."""
    sq_c = xp.einsum("ij,ij->i", centroids, centroids)
    mine = [xp.asarray(owner == r) for r in range(ranks)]
    out = xp.empty((Q.shape[0], probes), dtype=xp.int64)
    for lo in range(0, Q.shape[0], _CHUNK):
        d2 = _to_centroids(Q[lo:lo + _CHUNK], centroids, sq_c, xp)
        by_shard = xp.stack([d2[:, m].min(axis=1) if (owner == r).any()
                             else xp.full(d2.shape[0], xp.inf, dtype=d2.dtype)
                             for r, m in enumerate(mine)], axis=1)
        out[lo:lo + _CHUNK] = xp.argsort(by_shard, axis=1)[:, :probes]
    return out


def _deal(centroids: np.ndarray, counts: np.ndarray, ranks: int) -> np.ndarray:
    """Each centroid's rank: the centroids cut in two, again and again, across their
    principal direction (weighted by their rows), into ``ranks`` groups of near-equal rows
    (each cut within 5% of the rows of the equal share), where it parts the fewest
    centroids from their nearest two (at the widest gap along the direction among those),
    so that a cut runs between clusters rather than through one and neighbouring centroids
    share a shard."""
    owner = np.zeros(counts.size, dtype=np.int64)
    todo = [(np.arange(counts.size), 0, ranks)]
    while todo:
        members, first, parts = todo.pop()
        if parts == 1 or members.size == 1:
            owner[members] = first
            continue
        C, w = centroids[members], counts[members].astype(np.float64)
        w = w if w.sum() > 0 else np.ones_like(w)
        mu = np.average(C, axis=0, weights=w)
        direction = np.linalg.svd((C - mu) * np.sqrt(w)[:, None], full_matrices=False)[2][0]
        proj = (C - mu) @ direction
        order = np.argsort(proj, kind="stable")
        share = (parts // 2) / parts
        before = np.cumsum(w[order])[:-1] / w.sum()  # the rows left of a cut at j + 1
        cuts = np.flatnonzero(np.abs(before - share) <= 0.05)
        if cuts.size == 0:
            cuts = np.array([int(np.argmin(np.abs(before - share)))])
        # a cut's cost: the centroids it parts from their nearest two (those that split
        # one cluster between them); the widest gap along the direction breaks ties
        sq = np.einsum("ij,ij->i", C, C)
        d2 = sq[:, None] + sq[None, :] - 2.0 * (C @ C.T)
        np.fill_diagonal(d2, np.inf)
        nearest = np.argsort(d2, axis=1, kind="stable")[:, :min(2, members.size - 1)]
        place = np.empty(members.size, dtype=np.int64)
        place[order] = np.arange(members.size)
        low = np.minimum(place[:, None], place[nearest])
        high = np.maximum(place[:, None], place[nearest])
        parted = [int(np.count_nonzero((low <= j) & (high > j))) for j in cuts]
        gaps = proj[order[cuts + 1]] - proj[order[cuts]]
        j = int(cuts[np.lexsort((-gaps, parted))[0]]) + 1
        todo.append((members[order[:j]], first, parts // 2))
        todo.append((members[order[j:]], first + parts // 2, parts - parts // 2))
    return owner


def _exchange(comm: Any, dest: Any, arrays: list[Any], piece: int = _PIECE
              ) -> tuple[list[Any], Any]:
    """Each row of ``arrays`` (equal first dimension) sent to rank ``dest[row]``; the rows
    this rank received, from rank 0's first, and each received row's source rank.

    The rows go in rounds (rank r to rank r + step, each step) of at most ``piece`` bytes
    an array, padded to the round's largest part, and are written into place as they come:
    a rank holds its rows, what it receives and one round's buffers, never a sorted copy of
    its rows or a list of the parts received.
    """
    xp, rank, size = comm.xp, comm.rank, comm.size
    order = xp.argsort(dest)
    counts = np.bincount(to_host(dest).astype(np.int64), minlength=size)
    starts = np.concatenate([[0], np.cumsum(counts)])
    table = np.asarray(comm.allgather_obj(counts.tolist()), dtype=np.int64)  # [from, to]
    at = np.concatenate([[0], np.cumsum(table[:, rank])])  # each source's first row here
    out = [xp.empty((int(at[-1]),) + a.shape[1:], dtype=a.dtype) for a in arrays]
    piece = max(1, min(piece // max(1, a[:1].nbytes) for a in arrays))  # rows a round
    for step in range(size):
        to, frm = (rank + step) % size, (rank - step) % size
        top = int(max(table[r, (r + step) % size] for r in range(size)))
        for lo in range(0, top, piece):  # every rank takes the same rounds
            hi = min(top, lo + piece)
            mine = order[starts[to] + min(lo, counts[to]):starts[to] + min(hi, counts[to])]
            got = int(min(hi, table[frm, rank]) - min(lo, table[frm, rank]))
            for a, o in zip(arrays, out):
                rows = a[mine]
                if step:
                    buf = xp.zeros((hi - lo,) + a.shape[1:], dtype=a.dtype)
                    buf[:rows.shape[0]] = rows
                    rows = comm.sendrecv(buf, to, frm)[:got]
                o[at[frm] + lo:at[frm] + lo + got] = rows
    source = xp.empty(int(at[-1]), dtype=xp.int64)
    for r in range(size):
        source[at[r]:at[r + 1]] = r
    return out, source


def _rows_of(parts: list[Any], func: str, name: str, on: Any) -> tuple[Any, Any]:
    """A rank's tiles, checked (NaN and infinity refused), on the device of ``on`` and
    stacked, with their rows' global ids."""
    tiles = [check_knn_input(p.data, name, func, on, min_samples=0, min_features=1)
             for p in parts]
    xp = array_module(tiles[0])  # the rank's own device: its tiles' module
    ids = xp.concatenate([xp.arange(p.rows.start, p.rows.stop, dtype=xp.int64) for p in parts])
    return (tiles[0] if len(tiles) == 1 else xp.concatenate(tiles)), ids


def _build_rank(comm: Any, parts: list[Any], key: str, centroids: np.ndarray, metric: str,
                d_min: int, d_max: int, l_n: int, e: int, batch: int, diverse: bool,
                settings: dict[str, Any], half: bool) -> dict[str, Any]:
    xp = comm.xp
    X, ids = _rows_of(parts, _FIT, "X", parts[0].data)
    data = ann_prepare_lookup(X, metric)
    del X  # a stack of several tiles goes now; the tiles stay the caller's
    for lo in range(0, data.shape[0] if half else 0, _CHUNK):  # refused before rows move
        ann_half_lookup(data[lo:lo + _CHUNK])
    C = xp.asarray(centroids, dtype=data.dtype)
    near = _nearest(data, C, xp)
    local = np.bincount(to_host(near).astype(np.int64), minlength=C.shape[0])
    counts = np.asarray(comm.allreduce_obj(local), dtype=np.int64)
    # dealt on rank 0 and sent: every rank routes by the same deal
    owner = comm.bcast_obj(_deal(centroids, counts, comm.size) if comm.rank == 0 else None)
    (data, ids), _ = _exchange(comm, xp.asarray(owner)[near], [data, ids])
    del near
    shard = _Shard(None, None, None, ids, data.dtype)
    if data.shape[0]:
        with dask.config.set(settings):
            graph, degree = ann_build_lookup(data, metric, d_min, d_max, l_n, e, batch,
                                             _reporter(comm), diverse)
        # the queries keep the rows' dtype as built; the rows may be halved
        shard = _Shard(ann_half_lookup(data) if half else data, graph, degree, ids,
                       data.dtype)
    synchronize(data)
    with _LOCK:
        _HELD[(key, _address())] = shard
    return {"rows": int(data.shape[0]), "owner": owner, "worker": _address()}


def _reporter(comm: Any) -> Callable[[int, int], None]:
    """The build's progress, ``(rows inserted, rows)`` of this rank's shard, sent to the
    client (rank 0's alone: the shards are of about equal rows) at most once a second."""
    last = [0.0]

    def report(done: int, n: int) -> None:
        now = time.monotonic()
        if done < n and now - last[0] < _REPORT_SECONDS:
            return
        last[0] = now
        comm.report({"done": int(done), "of": int(n)})

    return report


def build_routed(X: da.Array, metric: str, d_min: int, d_max: int, l_n: int, e: int,
                 batch: int, diverse: bool,
                 progress: Callable[[int, int], None] | None = None,
                 half: bool = False) -> Routed:
    """Partition the rows of the dask array X (dense) by clusters over the workers holding
    its tiles and build each shard's graph there; ``progress(rows, n)`` as the first
    shard's build goes (its share of the rows inserted, as a number of the n), and
    ``progress(n, n)`` once all are built."""
    check_dask_input(X, "X", _FIT)
    if is_sparse_array(X):
        raise ValueError(f"The 'X' parameter of {_FIT} is sparse; partition='clusters' takes "
                         "dense rows (the shards' centroids are dense). Use partition='rows' "
                         "for sparse rows.")
    if metric == "inner_product":
        raise ValueError(f"The 'metric' parameter of {_FIT} is 'inner_product', which "
                         "partition='clusters' does not route: the rows of largest inner "
                         "product with a query need not lie near it. Use partition='rows'.")
    client = current_client()
    if client is None:
        raise ValueError(f"The 'X' parameter of {_FIT} is a dask array, which needs a cluster: "
                         "call mgpu.connect() first, or pass a numpy, scipy or CuPy array.")
    X = row_tiles(X, _FIT)  # 2-D (checked above), one chunk across the columns
    if not is_placed(X):
        X = client.persist(X)
    n = int(X.shape[0])
    blocks = block_futures(X, client)
    holders = {w for ws in client.who_has(list(blocks.values())).values() for w in ws}
    centroids = _centroids(X, blocks, client, metric, _CENTROIDS * max(1, len(holders)))
    key = f"mgpu-ann-shards-{uuid.uuid4().hex}"

    def reported(record: dict[str, Any]) -> None:  # rank 0's share done, as rows of n
        progress(min(n - 1, int(n * record["done"] / max(1, record["of"]))), n)

    out = spmd(_build_rank, X, client=client, name="ann-build", restarts=0,
               progress=reported if progress is not None else None,
               args=(key, centroids, metric, d_min, d_max, l_n, e, batch, diverse,
                     gpu_settings(), half))
    gpu = is_gpu_array(X._meta)  # the markers lie where the shards are: CuPy on GPU workers
    workers = [r["worker"] for r in out]
    markers = [client.submit(_marker, gpu, pure=False, workers=[w], allow_other_workers=False)
               for w in workers]
    anchor = RowTiles(client, markers, np.arange(len(out) + 1, dtype=np.int64), workers,
                      [0] * len(out), gpu, "ann")
    handle = Routed(key, anchor, centroids, np.asarray(out[0]["owner"]),
                    [r["rows"] for r in out], client)
    finalizer = weakref.finalize(handle, _release, client, key)
    finalizer.atexit = False
    if progress is not None:
        progress(n, n)
    logger.info("graph index: %d shard(s) by clusters of %s rows", len(out), handle.rows)
    return handle


def _sample(tile: Any, rows: np.ndarray) -> np.ndarray:
    """Rows ``rows`` of a tile, on the host."""
    return np.asarray(to_host(tile[rows]))


def _centroids(X: da.Array, blocks: dict[Any, Any], client: Any, metric: str, c: int
               ) -> np.ndarray:
    """k-means centroids of a sample of the rows of X (as the kernels take them: unit
    length for cosine), on the client. Each tile's sampled rows are taken where the tile
    is (no tile is copied to another worker, where a later job would find it)."""
    from sklearn.cluster import KMeans

    n = int(X.shape[0])
    m = min(n, _SAMPLE * c)
    take = np.unique(np.linspace(0, n - 1, m).round().astype(np.int64))
    bounds = np.concatenate([[0], np.cumsum(X.chunks[0])]).astype(np.int64)
    tiles = [blocks[(i, 0)] for i in range(X.numblocks[0])]
    where = client.who_has(tiles)
    parts = []
    for tile, lo, hi in zip(tiles, bounds[:-1], bounds[1:]):
        rows = take[(take >= lo) & (take < hi)] - lo
        held = sorted(where.get(tile.key, ()))[:1]
        if rows.size:  # where the tile is (anywhere, had it left with its worker)
            pin = {"workers": held, "allow_other_workers": True} if held else {}
            parts.append(client.submit(_sample, tile, rows, pure=False, **pin))
    sample = check_knn_input(np.concatenate(client.gather(parts)), "X", _FIT, None,
                             min_samples=1, min_features=1)
    sample = ann_prepare_lookup(np.asarray(sample, dtype=np.float64), metric)
    c = min(c, sample.shape[0])
    return KMeans(n_clusters=c, n_init=1, random_state=0).fit(sample).cluster_centers_


def _search_rank(comm: Any, anchor: list[Any], queries: list[Any], key: str,
                 centroids: np.ndarray, owner: np.ndarray, probes: int, k: int, metric: str,
                 l_n: int, e: int, settings: dict[str, Any], hold: str | None
                 ) -> dict[str, Any]:
    xp = comm.xp
    with _LOCK:
        shard = _HELD.get((key, _address()))
    if shard is None:
        raise RuntimeError(f"{_SEARCH}: worker {_address()} no longer holds its shard of the "
                           "index (it left the cluster, or the index was dropped): fit it "
                           "again.")
    Q, _ = _rows_of(queries, _SEARCH, "X", anchor[0].data)  # to the shard's device
    Q = ann_prepare_lookup(Q, metric, False).astype(shard.dtype, copy=False)
    comm.barrier()
    t0 = time.perf_counter()
    nq = Q.shape[0]
    # each query's shards: a shard's distance is its nearest centroid's
    dest = _routes(Q, xp.asarray(centroids, dtype=Q.dtype), owner, comm.size, probes,
                   xp).ravel()
    tag = xp.arange(nq * probes, dtype=xp.int64)  # query * probes + its slot
    (rq, tags), source = _exchange(comm, dest, [xp.repeat(Q, probes, axis=0), tag])
    dist = xp.full((rq.shape[0], k), xp.inf, dtype=Q.dtype)
    ids = xp.full((rq.shape[0], k), -1, dtype=xp.int64)
    if shard.data is not None and rq.shape[0]:
        with dask.config.set(settings):
            kk = min(k, int(shard.ids.shape[0]))
            d, i = ann_search_lookup(shard.data, shard.graph, shard.degree, rq, kk, metric,
                                     l_n, e)
        dist[:, :kk] = d
        ids[:, :kk] = xp.where(i >= 0, shard.ids[xp.maximum(i, 0)], -1)
    (dist, ids, tags), _ = _exchange(comm, source, [dist, ids, tags])
    D = np.full((nq * probes, k), np.inf)
    I = np.full((nq * probes, k), -1, dtype=np.int64)
    tags = to_host(tags)
    D[tags], I[tags] = to_host(dist), to_host(ids)
    D, I = D.reshape(nq, probes, k), I.reshape(nq, probes, k)
    D, I = merge_all([(D[:, j], I[:, j]) for j in range(probes)], k, False)
    seconds = time.perf_counter() - t0
    out: dict[str, Any] = {"rows": [(p.rows.start, p.rows.stop) for p in queries],
                           "tiles": [p.index for p in queries], "seconds": seconds,
                           "worker": _address()}
    if hold is None:
        out["dist"], out["ids"] = D, I
        return out
    at = 0
    with _LOCK:  # each tile's answer kept here, for the tasks that take them
        for p in queries:
            n = p.rows.stop - p.rows.start
            _ANSWERS[(hold, p.index, 0)] = D[at:at + n]
            _ANSWERS[(hold, p.index, 1)] = I[at:at + n]
            at += n
    return out


def _take(job: str, tile: int, part: int, rows: tuple[int, int]) -> np.ndarray:
    """Tile ``tile``'s distances (``part`` 0) or ids (1), from this worker's keeping into
    Dask's."""
    with _LOCK:
        got = _ANSWERS.pop((job, tile, part), None)
    if got is None:
        raise RuntimeError(f"{_SEARCH}: the answers of queries {rows[0]}..{rows[1] - 1} were "
                           "made on a worker that left the cluster before they were taken "
                           "(or this task ran elsewhere): search again.")
    return got


def _forget(job: str, dask_worker: Any = None) -> None:
    with _LOCK:
        for key in [key for key in _ANSWERS if key[0] == job]:
            del _ANSWERS[key]


def search_routed(index: Routed, queries: Any, k: int, metric: str, l_n: int, e: int,
                  probes: int) -> tuple[Any, Any]:
    """The k nearest of the index's rows to each query, in the graph's metric (nearest
    first; float64 distances, int64 ids): ``queries`` (checked rows on one device, or a
    dask array of rows) go to the ``probes`` nearest shards. Numpy arrays on the client for
    queries from it; dask arrays for a dask array, in its row tiles (re-cut into one a
    shard), held on the workers, numpy tiles. The job's time is added to
    ``index.seconds``."""
    client, anchor = index.client, index.anchor
    n = int(queries.shape[0])
    bounds = np.linspace(0, n, len(anchor) + 1).round().astype(np.int64)
    held = isinstance(queries, da.Array)
    if held:
        Q: Any = client.persist(queries.rechunk((tuple(np.diff(bounds).tolist()), -1)))
    else:  # each tile of queries goes straight to the worker of its rank
        tiles = [client.scatter(queries[bounds[r]:bounds[r + 1]], workers=[w], hash=False)
                 for r, w in enumerate(anchor.workers)]
        Q = RowTiles(client, tiles, bounds, list(anchor.workers), [0] * len(tiles), anchor.gpu,
                     "ann")
    p = min(int(probes), index.shards)
    job = f"mgpu-ann-answers-{uuid.uuid4().hex}" if held else None
    try:
        out = spmd(_search_rank, anchor, Q, client=client, name="ann-search", restarts=0,
                   args=(index.key, index.centroids, index.owner, p, int(k), metric, l_n, e,
                         gpu_settings(), job))
    except BaseException:
        if job is not None:
            client.run(_forget, job)
        raise
    index.seconds.append(max(r["seconds"] for r in out))
    if job is not None:
        return _held_answers(client, job, out, k)
    dist = np.empty((n, k))
    ids = np.empty((n, k), dtype=np.int64)
    for r in out:
        at = 0
        for lo, hi in r["rows"]:
            dist[lo:hi], ids[lo:hi] = r["dist"][at:at + hi - lo], r["ids"][at:at + hi - lo]
            at += hi - lo
    return dist, ids


def _held_answers(client: Any, job: str, out: list[dict[str, Any]], k: int
                  ) -> tuple[da.Array, da.Array]:
    """The answers each rank kept, as two dask arrays of the queries' tiles, taken into
    Dask's keeping on their workers (waited for)."""
    tiles = sorted((i, lo, hi, r["worker"]) for r in out
                   for i, (lo, hi) in zip(r["tiles"], r["rows"]))
    arrays, futures = [], []
    for part, dtype in ((0, np.float64), (1, np.int64)):
        blocks = []
        for i, lo, hi, worker in tiles:
            f = client.submit(_take, job, i, part, (lo, hi), workers=[worker],
                              allow_other_workers=False, pure=False,
                              key=f"{job}-{part}-{i}")
            futures.append(f)
            blocks.append(da.from_delayed(f, (hi - lo, k), dtype=dtype,
                                          meta=np.empty((0, 0), dtype)))
        arrays.append(da.concatenate(blocks) if blocks else
                      da.zeros((0, k), dtype=dtype))
    distributed.wait(futures)
    for f in futures:
        if f.status == "error":
            f.result()  # raises the task's error
    return arrays[0], arrays[1]
