"""mgpu: sparse machine-learning primitives across many GPUs and CPUs through Dask.

``import mgpu`` never imports CuPy and never creates a CUDA context: the GPU backend is
loaded lazily, the first time an operation receives CuPy data. Nor does it import
scikit-learn: ``mgpu.NearestNeighbors`` is loaded the first time it is asked for.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings

from mgpu import config as _config  # noqa: F401  (registers the mgpu.* defaults)

__version__ = "0.1.0"

from mgpu.backends.memory import DeviceMemoryError  # noqa: E402
from mgpu.distributed.cluster import connect  # noqa: E402
from mgpu.distributed.collection import from_scipy, gather  # noqa: E402
from mgpu.distributed.jaccard import jaccard  # noqa: E402
from mgpu.distributed.knn import knn  # noqa: E402
from mgpu.distributed.sddmm import sddmm  # noqa: E402
from mgpu.distributed.spgemm import spgemm  # noqa: E402
from mgpu.distributed.spmd import spmd  # noqa: E402
from mgpu.distributed.spmv import spmm, spmv  # noqa: E402
from mgpu.mf import MatrixFactorization  # noqa: E402
from mgpu.ops import (pairwise_distances, row_norms, sddmm_plan, spadd,  # noqa: E402
                      spmv_plan, triangles)

__all__ = [
    "DeviceMemoryError",
    "MatrixFactorization",
    "NearestNeighbors",
    "connect",
    "from_scipy",
    "gather",
    "jaccard",
    "knn",
    "pairwise_distances",
    "row_norms",
    "sddmm",
    "sddmm_plan",
    "spadd",
    "spgemm",
    "spmd",
    "spmm",
    "spmv",
    "spmv_plan",
    "triangles",
]


_OLD_DIST = "mgpu.dist"
_DIST_MOVED = ("mgpu.dist is now mgpu.distributed (mgpu.from_scipy and mgpu.gather are at the "
               "top level too)")


class _OldDistributedName(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import mgpu.dist`` and ``from mgpu.dist[.<module>] import ...``: the distributed
    layer's old name gives its modules under the new one (``mgpu.distributed[.<module>]``,
    the same module objects), with a DeprecationWarning. First on ``sys.meta_path``, so
    that no second copy of a module is loaded under the old name."""

    def find_spec(self, fullname: str, path: object = None, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname == _OLD_DIST or fullname.startswith(_OLD_DIST + "."):
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = "mgpu.distributed" + spec.name[len(_OLD_DIST):]
        warnings.warn(_DIST_MOVED if spec.name == _OLD_DIST
                      else f"{spec.name} is now {new}", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # the module is loaded under its new name already; the import system has just set
        # its __spec__ to the old name's: give it back its own
        module.__spec__ = self._spec


if not any(isinstance(f, _OldDistributedName) for f in sys.meta_path):
    sys.meta_path.insert(0, _OldDistributedName())


def __getattr__(name: str):
    # NearestNeighbors imports scikit-learn: loaded when first asked for, not by ``import mgpu``
    if name == "NearestNeighbors":
        from mgpu.ops.neighbors import NearestNeighbors

        return NearestNeighbors
    # ``mgpu.dist`` was the distributed layer's name before ``mgpu.distributed``.
    if name == "dist":
        import mgpu.distributed

        warnings.warn(_DIST_MOVED, DeprecationWarning, stacklevel=2)
        return mgpu.distributed
    raise AttributeError(f"module 'mgpu' has no attribute {name!r}")
