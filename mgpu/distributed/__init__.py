"""Distributed layer: cluster connection, partitioned sparse collections and the
distributed ops."""
from __future__ import annotations

from mgpu.distributed.knn_graph import all_knn
from mgpu.distributed.cluster import (
    Client,
    connect,
    describe_workers,
    visible_gpus,
    worker_info,
    workers_now,
)
from mgpu.distributed.collection import chunk_nnz, chunk_workers, from_scipy, gather
from mgpu.distributed.knn import knn_distributed, merge_top_k
from mgpu.distributed.neighbors import pairwise_distances  # registers the ops' dask routes
from mgpu.distributed.sddmm import place_factors, sddmm, sddmm_axis
from mgpu.distributed.spgemm import spgemm  # registers spgemm's dask route
from mgpu.distributed.spmd import Comm, Part, spmd

__all__ = [
    "Client",
    "Comm",
    "Part",
    "all_knn",
    "chunk_nnz",
    "chunk_workers",
    "connect",
    "describe_workers",
    "from_scipy",
    "gather",
    "knn_distributed",
    "merge_top_k",
    "pairwise_distances",
    "place_factors",
    "sddmm",
    "sddmm_axis",
    "spgemm",
    "spmd",
    "visible_gpus",
    "worker_info",
    "workers_now",
]
