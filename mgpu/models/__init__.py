"""Estimators built on the ops: fit/transform/predict, on one device or across a cluster.

- :class:`GaP`: Canny's Gamma-Poisson topic model, every update an SDDMM and an SpMM.
- :class:`GradientMF`: matrix factorisation by full-batch gradient descent with Adam; each
  step one SDDMM and two SpMM.
- :class:`GraphIndex`: approximate nearest neighbours in a proximity graph (GANNS's search,
  GGraphCon's construction); dense data on the CPU for now.

Each takes a scipy or cupyx matrix (one device) or a dask array of row tiles (a cluster,
through :class:`mgpu.distributed.tiles.RowTiles`); :mod:`mgpu.models.jaccard` summarises
Jaccard edge weights, :mod:`mgpu.models.triangles` triangle counts.
"""
from __future__ import annotations

from typing import Any

from mgpu.models.gap import GaP
from mgpu.models.gradient_mf import GradientMF

__all__ = ["GaP", "GradientMF", "GraphIndex"]


def __getattr__(name: str) -> Any:
    # GraphIndex imports scikit-learn: loaded when first asked for
    if name == "GraphIndex":
        from mgpu.models.graph_index import GraphIndex

        return GraphIndex
    raise AttributeError(f"module 'mgpu.models' has no attribute {name!r}")
