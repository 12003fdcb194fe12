"""The kNN operation codes: one table in Python, the same numbers in kernels/knn.cu."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from mgpu.backends.knn_codes import KNN_CODES, UNION_OPS, UNION_SUMS, KnnFinish, KnnOp
from mgpu.ops.distances import SEMIRINGS

KNN_CU = Path(__file__).resolve().parents[1] / "kernels" / "knn.cu"


def _enum(name: str) -> dict[str, int]:
    """The members of a C++ enum of kernels/knn.cu, as written there."""
    body = re.search(rf"\benum\s+{name}\s*\{{([^}}]*)\}}", KNN_CU.read_text())
    assert body, f"no enum {name} in {KNN_CU.name}"
    members = re.findall(r"(\w+)\s*=\s*(\d+)", body.group(1))
    assert len(members) == body.group(1).count(",") + 1, "every member has an explicit value"
    return {k: int(v) for k, v in members}


@pytest.mark.parametrize(("enum", "py", "prefix"), [("KnnOp", KnnOp, "OP_"),
                                                     ("KnnFinish", KnnFinish, "FIN_")])
def test_the_kernel_enums_are_the_python_table(enum, py, prefix):
    assert _enum(enum) == {prefix + m.name: int(m) for m in py}


def test_every_metric_has_its_codes_and_the_union_metrics_share_them():
    assert set(KNN_CODES) == set(SEMIRINGS)
    for name, ring in SEMIRINGS.items():
        op, fin = KNN_CODES[name]
        assert (ring.kind == "namm") == (op in UNION_OPS), name
        if ring.kind == "namm":  # the CPU union kernels take the GPU's codes
            assert ring.namm_op == op, name
        assert fin.name == op.name or op == KnnOp.DOT, name
    assert set(UNION_SUMS) == set(UNION_OPS) - {KnnOp.LINF}
