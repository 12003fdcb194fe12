"""Row tiles of a sparse matrix kept on a cluster's workers, each with state that stays there.

An iterative model on a cluster (the GaP topic model, gradient-descent factorisation) cuts
its matrix into row tiles of equal nnz, builds a state per tile on the worker that holds the
tile, and then, round after round, runs one task per tile where the tile is; only the small
shared factors move. :class:`RowTiles` is that placement, written once:

- :meth:`RowTiles.place` cuts a scipy matrix (:func:`mgpu.from_scipy`) or takes a dask array
  of row tiles as it is, and records each tile's worker, rows and nonzeros;
- :meth:`RowTiles.hold` puts per-tile starting data (a tile's rows of a factor) on the
  tile's worker, and :meth:`RowTiles.share` a value every tile reads;
- :meth:`RowTiles.map` submits one task per tile where the tile is.

Starting data is held by tasks, not scattered (:func:`place_as`), and a CPU tile's work is
asked of its worker, not pinned to it (:func:`task_placement`): when a worker is lost, its
tiles and every state made from them are made again elsewhere from their tasks. It costs
time, not results. GPU tiles stay pinned to their device.
"""
from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import dask.array as da
import numpy as np
import scipy.sparse as sp

from mgpu.backends import is_gpu_array
from mgpu.distributed.cluster import current_client, result, task_placement
from mgpu.distributed.collection import block_futures, chunk_nnz, from_scipy, place_as
from mgpu.distributed.inputs import check_dask_input, csr_chunks, is_sparse_array, row_tiles
from mgpu.ops.validation import check_array

__all__ = ["RowTiles", "check_scipy_or_tiles"]


@dataclass
class RowTiles:
    """Row tiles of one matrix on a cluster's workers.

    Attributes
    ----------
    client : distributed.Client
    blocks : list of Future
        Each tile's CSR rows (scipy on CPU workers, cupyx on GPU workers), in row order.
    bounds : ndarray of shape (n_tiles + 1,)
        Tile ``i`` holds rows ``bounds[i]`` to ``bounds[i + 1]`` (excluded).
    workers : list of str or None
        The worker that held each tile when it was placed.
    nnz : list of int
        Each tile's nonzeros.
    gpu : bool
        Whether the tiles are cupyx matrices on GPU workers.
    name : str
        The job's name in the keys of the data it places (``mgpu-<name>-…``).
    """

    client: Any
    blocks: list[Any]
    bounds: np.ndarray
    workers: list[str | None]
    nnz: list[int]
    gpu: bool
    name: str
    _run: str = field(default_factory=lambda: uuid.uuid4().hex, repr=False)

    @classmethod
    def place(cls, S: Any, *, name: str, parts: int | None = None,
              client: Any = None) -> RowTiles:
        """Row tiles of ``S`` on the cluster.

        Parameters
        ----------
        S : scipy sparse matrix or dask array of shape (n_rows, n_cols)
            A scipy matrix is cut into ``parts`` tiles of equal nnz (:func:`from_scipy`); a
            dask array cut by rows only is taken in its row chunks, one also cut by columns
            is re-cut into row tiles at nnz prefix sums
            (:func:`mgpu.distributed.inputs.row_tiles`); sparse or dense chunks.
        name : str
            The job's name, for the keys of what it places.
        parts : int, optional
            scipy input: the number of tiles (default one per worker).
        client : distributed.Client, optional
            Default: the current one (:func:`mgpu.connect`).

        Raises
        ------
        ValueError
            Without a cluster, or for a dask array with unknown chunk sizes.
        """
        client = client or current_client()
        if client is None:
            raise ValueError(f"There is no cluster to place {name}'s row tiles on: call "
                             "mgpu.connect() first, or pass client=.")
        if isinstance(S, da.Array):
            check_dask_input(S, "S", name)
            # a user's array, cut by columns too, re-cut into row tiles at nnz prefix sums
            Sd = S = row_tiles(S, name, parts)
            if not is_sparse_array(Sd):  # dense chunks: the tiles are their CSR
                Sd = S = csr_chunks(Sd)
        else:
            if sp.issparse(S):  # the CSR from_scipy places (any format; duplicates summed)
                S = sp.csr_matrix(S)
                if not S.has_canonical_format:
                    S = S.copy()
                    S.sum_duplicates()
            Sd = from_scipy(S, parts, axis=0, client=client)
        bounds = np.concatenate([[0], np.cumsum(Sd.chunks[0])]).astype(np.int64)
        if Sd is S:
            nnz = [int(z) for z in np.asarray(chunk_nnz(Sd)).ravel()]
        else:  # counted from the placed CSR's row pointers, without a round trip
            nnz = [int(S.indptr[bounds[i + 1]] - S.indptr[bounds[i]])
                   for i in range(Sd.numblocks[0])]
        futures = block_futures(Sd, client)
        blocks = [futures[(i, 0)] for i in range(Sd.numblocks[0])]
        where = client.who_has(blocks)
        workers = [(list(where.get(f.key, ())) or [None])[0] for f in blocks]
        # GPU tiles' tasks ask for a GPU and stay pinned to it (task_placement)
        return cls(client, blocks, bounds, workers, nnz, is_gpu_array(Sd._meta), name)

    def __len__(self) -> int:
        return len(self.blocks)

    def _holders(self, i: int) -> list[str]:
        return [self.workers[i]] if self.workers[i] is not None else []

    def placement(self, i: int) -> dict[str, Any]:
        """``client.submit`` keywords that run tile ``i``'s work where the tile is."""
        return task_placement(self._holders(i), self.gpu)

    def rows(self, i: int) -> slice:
        """Tile ``i``'s rows of the whole matrix."""
        return slice(int(self.bounds[i]), int(self.bounds[i + 1]))

    def hold(self, what: str, pieces: Sequence[Any]) -> list[Any]:
        """Each tile's piece of starting data, held by a task on the tile's worker (the key
        ``mgpu-<name>-<what>-<run>-<i>``); returns their futures."""
        return [place_as(self.client, f"mgpu-{self.name}-{what}-{self._run}-{i}", piece,
                         workers=self._holders(i)) for i, piece in enumerate(pieces)]

    def share(self, what: str, value: Any) -> Any:
        """A value every tile reads, held by a task (the key ``mgpu-<name>-<what>-<run>``)."""
        return place_as(self.client, f"mgpu-{self.name}-{what}-{self._run}", value)

    def map(self, func: Callable[..., Any], *per_tile: Sequence[Any],
            args: tuple[Any, ...] = ()) -> list[Any]:
        """``func(per_tile[0][i], per_tile[1][i], …, *args)`` for every tile ``i``, each where
        its tile is; returns the futures in tile order."""
        return [self.client.submit(func, *cols, *args, pure=False, **self.placement(i))
                for i, cols in enumerate(zip(*per_tile, strict=True))]

    def submit(self, func: Callable[..., Any], *args: Any) -> Any:
        """One task not tied to a tile (a reduction over the tiles' shares)."""
        return self.client.submit(func, *args, pure=False)

    def result(self, future: Any, what: str) -> Any:
        """``future.result()``, with a TimeoutError naming ``what`` when the cluster stalls
        (``mgpu.dist.stall-timeout``)."""
        return result(future, what, self.client)

    def describe(self) -> list[dict[str, Any]]:
        """Each tile's worker, rows and nonzeros, in row order."""
        return [{"worker": w, "rows": int(self.bounds[i + 1] - self.bounds[i]), "nnz": z}
                for i, (w, z) in enumerate(zip(self.workers, self.nnz))]


def check_scipy_or_tiles(S: Any, param: str, func: str, *,
                         ensure_all_finite: bool = False) -> None:
    """Refuse what :meth:`RowTiles.place` cannot place, naming the parameter: cupyx data by
    its device (the tiles are cut on the host), anything else by its kind or dtype (real
    numbers only, as on one device). ``ensure_all_finite`` refuses NaN and infinity in a
    scipy matrix; a dask array's values are the caller's to check, tile by tile."""
    check_array(S, param, func, accept_dense=False, accept_dask=True, devices=("cpu",),
                ndim=None, ensure_all_finite=ensure_all_finite,
                kinds="a scipy sparse matrix (or a dask array of row tiles)")
