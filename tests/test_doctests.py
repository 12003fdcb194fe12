"""The Examples sections of the public docstrings run and print what they say."""
from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "mgpu.partition",
    "mgpu.synthetic",
    "mgpu.ops.rownorms",
    "mgpu.ops.validation",
    "mgpu.ops.sddmm",
    "mgpu.ops.sddmm_stream",
    "mgpu.distributed.sddmm",
    "mgpu.distributed.collection",
    "mgpu.io.errors",
    "mgpu.io.graphs",
    "mgpu.backends.sddmm_plan",
    "mgpu.backends.numpy_knn",
    "mgpu.ops.distances",
    "mgpu.ops.neighbors",
    "mgpu.distributed.knn",
    "mgpu.distributed.jaccard",
    "mgpu.mf.division",
    "mgpu.mf.calibration",
    "mgpu.sched.steal",
    "mgpu.sched.blocks",
    "mgpu.models.jaccard",
    "mgpu.models.gap",
    "mgpu.models.gradient_mf",
    "mgpu.bench.gap",
    "mgpu.deploy",
    "mgpu.sched.cost",
    "mgpu.mf.sgd",
    "mgpu.mf.model",
    "mgpu.mf.planning",
    "mgpu.mf.modes",
    "mgpu.mf.placement",
    "mgpu.mf.segments",
    "mgpu.ops.spmv",
    "mgpu.distributed.spmv",
    "mgpu.bench.spmv",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    mod = importlib.import_module(name)
    result = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
