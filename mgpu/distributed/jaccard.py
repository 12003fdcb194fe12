"""Jaccard edge weights on one device or spread over the cluster, and the public
``mgpu.jaccard``.

Spread: the graph is sent once to the cluster and fetched by every worker (an edge's weight
needs the neighbour lists of both ends, so no row block is enough alone) and each task
computes the weights of a block of rows cut at nnz prefix sums (:func:`mgpu.partition.split`);
GPU workers copy the graph to their device once per call and run the GPU kernel.
"""
from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from numbers import Integral
from typing import Any

import dask.array as da
import numpy as np
import scipy.sparse as sp

from mgpu.backends import (csr_with_values, is_gpu_array, jaccard_lookup, sparse_module,
                           to_device, to_host)
from mgpu.distributed.cluster import CLIENT, completed, current_client
from mgpu.distributed.collection import device_copy, place_as
from mgpu.distributed.inputs import check_dask_input, csr_chunks, one_chunk
from mgpu.ops.jaccard import check_graph, jaccard_local
from mgpu.ops.validation import (Boolean, Interval, IsCallable, check_array, check_param,
                                 float_dtype, is_dask_array, same_kind)

logger = logging.getLogger(__name__)

__all__ = ["jaccard"]


def _graph_here(G: sp.csr_matrix, gpu: bool) -> Any:
    """G on this worker's GPU (copied once per graph object) for GPU workers, else G."""
    if not gpu:
        return G
    return device_copy(G, to_device)


def _rows_block(G: sp.csr_matrix, weighted: bool, r0: int, r1: int, gpu: bool) -> np.ndarray:
    """The weights of the edges of rows r0..r1, on this worker's device, as numpy."""
    return np.asarray(to_host(jaccard_lookup(_graph_here(G, gpu), weighted, r0, r1)),
                      dtype=np.float64)


def jaccard(G: Any, *, weighted: bool = False, symmetrize: bool = False,
            parts: int | None = None, client: Any = None,
            progress: Callable[[int], None] | None = None) -> Any:
    """Jaccard weights of the edges of an undirected graph.

    Parameters
    ----------
    G : {scipy, cupyx} sparse matrix of shape (n_nodes, n_nodes), or a dask array
        Adjacency of an undirected graph: a symmetric pattern (symmetric weights when
        ``weighted``). Self-loops are dropped and stored zeros are not edges. A dask array
        (sparse or dense chunks, any chunking) gives a lazy dask array of weights in G's row
        chunks: an edge's weight needs both ends' neighbour lists, so the graph is gathered
        into one task, checked there (a graph that is not undirected fails that task), and
        read by every row chunk's task.
    weighted : bool, default=False
        Use the edge weights: ``Σ_k min(w_ik, w_jk) / Σ_k max(w_ik, w_jk)`` over the union of
        the two neighbourhoods, instead of ``|N(i) ∩ N(j)| / |N(i) ∪ N(j)|``.
    symmetrize : bool, default=False
        Use ``G + Gᵀ`` (for weights, the larger of ``w_ij`` and ``w_ji``) instead of refusing
        a directed graph.
    parts : int, optional
        Spread the work over the current cluster (:func:`mgpu.connect`) in this many row
        blocks of equal nnz; scipy input only. Default: on G's own device.
    client : distributed.Client, optional
        With ``parts``: the cluster to use (default: the current one).
    progress : callable, optional
        With ``parts``: called with the number of edges done as each block finishes.

    Returns
    -------
    J : {scipy, cupyx} CSR matrix of shape (n_nodes, n_nodes), or a dask array of them
        G's pattern (without self-loops) holding the weights: float64 from scipy input,
        G's float dtype from cupyx input; a ``csr_array`` from a scipy sparse array.

    Raises
    ------
    ValueError
        Non-square G, a pattern (or weights) that is not symmetric (the message names an
        asymmetric entry and offers ``symmetrize=True``), NaN/inf, negative weights with
        ``weighted``, ``parts < 1``.
    TypeError
        Dense or non-numeric input, cupyx input with ``parts``.

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> path = sp.csr_matrix(([1, 1, 1, 1], ([0, 1, 1, 2], [1, 0, 2, 1])), shape=(3, 3))
    >>> J = jaccard(path)  # an edge of a path shares no neighbour: every weight is 0
    >>> J.nnz, J.data.tolist()
    (4, [0.0, 0.0, 0.0, 0.0])
    >>> tri = sp.csr_matrix(1 - np.eye(3))
    >>> jaccard(tri).toarray()[0].round(3).tolist()
    [0.0, 0.333, 0.333]
    """
    check_param(weighted, "weighted", "jaccard", Boolean())
    check_param(symmetrize, "symmetrize", "jaccard", Boolean())
    check_param(parts, "parts", "jaccard", [Interval(Integral, 1, None), None])
    check_param(client, "client", "jaccard", [CLIENT, None])
    check_param(progress, "progress", "jaccard", [IsCallable(), None])
    if parts is not None and is_gpu_array(G):  # a refusal: parts=N spreads a host graph
        raise TypeError("The 'G' parameter of jaccard is on the GPU: parts=N spreads a scipy "
                        "graph over the cluster's workers; call without parts to run on this "
                        "GPU.")
    if is_dask_array(G):
        return _jaccard_dask(G, bool(weighted), bool(symmetrize), parts)
    given = G
    G = check_graph(G, "jaccard", weighted=weighted, symmetrize=symmetrize)
    if parts is None:
        return same_kind(jaccard_local(G, weighted), given)
    from mgpu.partition import split

    client = client or current_client()
    if client is None:
        raise ValueError("jaccard with parts=N needs a cluster: call mgpu.connect() first.")
    bounds = split(G, int(parts), axis=0)
    logger.info("jaccard: %d nodes, %d edge entries in %d row blocks", G.shape[0], G.nnz,
                len(bounds) - 1)
    from mgpu.distributed.collection import _workers_have_gpus

    gpu = _workers_have_gpus(client)
    # Held by a task, not broadcast: Dask's memory manager drops the extra copies of scattered
    # data (a lost worker could hold the last), and a broadcast scatter waits forever for a
    # worker lost while it runs. The workers fetch it from the first that has it.
    shared = place_as(client, f"mgpu-jaccard-graph-{uuid.uuid4().hex}", G)
    futures = [client.submit(_rows_block, shared, weighted, int(r0), int(r1), gpu, pure=False,
                             key=f"mgpu-jaccard-{r0}-{r1}-{id(shared)}")
               for r0, r1 in zip(bounds[:-1], bounds[1:]) if r1 > r0]
    by_key = {}
    for fut in completed(futures, "jaccard's row blocks", client):
        by_key[fut.key] = fut.result()
        if progress is not None:
            progress(len(by_key[fut.key]))
    vals = np.concatenate([by_key[f.key] for f in futures]) if futures else np.empty(0)
    return same_kind(sp.csr_matrix((vals, G.indices.copy(), G.indptr.copy()), shape=G.shape),
                     given)


def _checked_graph(G: Any, weighted: bool, symmetrize: bool) -> Any:
    """The whole graph of a dask G checked as one device checks it, in a task."""
    return check_graph(G, "jaccard", weighted=weighted, symmetrize=symmetrize)


def _rows_of(G: Any, like: Any, weighted: bool, r0: int, r1: int) -> Any:
    """The weights of rows r0..r1 of a checked graph as a CSR chunk of their pattern, of the
    kind of the input's chunks (``like``)."""
    return same_kind(csr_with_values(G[r0:r1], jaccard_lookup(G, weighted, r0, r1)), like)


def _jaccard_dask(G: Any, weighted: bool, symmetrize: bool, parts: int | None) -> Any:
    """Jaccard weights of a dask G, lazily, in G's row chunks. An edge's weight needs the
    neighbour lists of both ends, so the graph is gathered into one chunk (in the graph:
    one task, whose result the row chunks' tasks read) and checked there; a graph that is
    not undirected fails that task with the one-device message."""
    from dask import delayed

    if parts is not None:
        raise ValueError("The 'parts' parameter of jaccard cuts a scipy graph for the cluster; "
                         "a dask G gives weights in its own row chunks. Leave parts out (or "
                         "rechunk G's rows).")
    check_array(G, "G", "jaccard", accept_dense=True, accept_dask=True)
    if G.shape[0] != G.shape[1]:
        raise ValueError(f"The 'G' parameter of jaccard must be a square adjacency matrix. Got "
                         f"shape {tuple(G.shape)} instead.")
    check_dask_input(G, "G", "jaccard")
    whole = csr_chunks(one_chunk(G, "jaccard"))
    like = whole._meta
    run = uuid.uuid4().hex
    checked = delayed(_checked_graph, pure=True)(
        whole.to_delayed(optimize_graph=False)[0, 0], weighted, symmetrize,
        dask_key_name=f"mgpu-jaccard-graph-{run}")
    bounds = np.concatenate([[0], np.cumsum(G.chunks[0])]).astype(np.int64)
    n = int(G.shape[1])
    dt = np.dtype(np.float64) if not is_gpu_array(like) else float_dtype(G.dtype)  # as local
    meta = same_kind(sparse_module(like).csr_matrix((0, 0), dtype=dt), like)
    blocks = [da.from_delayed(
        delayed(_rows_of, pure=True)(checked, like, weighted, int(r0), int(r1),
                                     dask_key_name=f"mgpu-jaccard-rows-{run}-{i}"),
        shape=(int(r1 - r0), n), dtype=dt, meta=meta)
        for i, (r0, r1) in enumerate(zip(bounds[:-1], bounds[1:]))]
    logger.debug("jaccard: a dask G of %s chunks, weights in %d row chunk(s) (lazy)",
                 G.numblocks, len(blocks))
    return da.concatenate(blocks, axis=0)
