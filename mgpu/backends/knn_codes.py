"""The operation codes of the kNN and distance kernels, defined once.

``kernels/knn.cu`` names the same codes in its enums ``KnnOp`` (what a kernel accumulates
over two rows: a dot product, or a term over the union of their nonzeros) and ``KnnFinish``
(the element-wise finish of a metric); ``tests/test_knn_codes.py`` reads them from there and
compares. The CPU union kernels (:mod:`mgpu.backends.numpy`) take the same ``KnnOp`` codes.
"""
from __future__ import annotations

from enum import IntEnum

__all__ = ["KNN_CODES", "UNION_OPS", "UNION_SUMS", "KnnFinish", "KnnOp"]


class KnnOp(IntEnum):
    """kernels/knn.cu's ``KnnOp`` (as ``OP_<name>``): the accumulated operation."""

    DOT = 0
    KL = 1  # the dot product with log(x), and the query's nonzeros the row covers
    L1 = 2
    LP = 3
    CANBERRA = 4
    HAMMING = 5
    JS = 6  # Jensen-Shannon
    LINF = 7  # a max over the union, not a sum
    CORRELATION = 8  # the centred product over the union (on the GPU; the CPU has its own)
    # L1 of integer values with sums below 2^53: every sum is exact, so the query's own terms
    # are taken out of a per-query total without the union walk (the GPU; a choice of the
    # data, not of the metric: manhattan's code stays L1)
    L1_COUNTS = 9


class KnnFinish(IntEnum):
    """kernels/knn.cu's ``KnnFinish`` (as ``FIN_<name>``): the element-wise finish."""

    EUCLIDEAN = 0
    SQEUCLIDEAN = 1
    COSINE = 2
    CORRELATION = 3
    INNER = 4
    DICE = 5
    JACCARD = 6
    RUSSELLRAO = 7
    HELLINGER = 8
    KL = 9
    L1 = 10
    LP = 11
    CANBERRA = 12
    HAMMING = 13
    JS = 14
    LINF = 15


# The operations over the union of two rows' nonzeros (the NAMM metrics), and those of them
# that are sums of a term over the union.
UNION_OPS = (KnnOp.L1, KnnOp.LP, KnnOp.CANBERRA, KnnOp.HAMMING, KnnOp.JS, KnnOp.LINF)
UNION_SUMS = tuple(op for op in UNION_OPS if op != KnnOp.LINF)

# metric (a name of mgpu.ops.distances.SEMIRINGS) -> (operation, finish)
KNN_CODES: dict[str, tuple[KnnOp, KnnFinish]] = {
    "euclidean": (KnnOp.DOT, KnnFinish.EUCLIDEAN),
    "sqeuclidean": (KnnOp.DOT, KnnFinish.SQEUCLIDEAN),
    "cosine": (KnnOp.DOT, KnnFinish.COSINE),
    "correlation": (KnnOp.CORRELATION, KnnFinish.CORRELATION),
    "inner_product": (KnnOp.DOT, KnnFinish.INNER),
    "dice": (KnnOp.DOT, KnnFinish.DICE),
    "jaccard": (KnnOp.DOT, KnnFinish.JACCARD),
    "russellrao": (KnnOp.DOT, KnnFinish.RUSSELLRAO),
    "hellinger": (KnnOp.DOT, KnnFinish.HELLINGER),
    "kl_divergence": (KnnOp.KL, KnnFinish.KL),
    "manhattan": (KnnOp.L1, KnnFinish.L1),
    "minkowski": (KnnOp.LP, KnnFinish.LP),
    "canberra": (KnnOp.CANBERRA, KnnFinish.CANBERRA),
    "hamming": (KnnOp.HAMMING, KnnFinish.HAMMING),
    "jensenshannon": (KnnOp.JS, KnnFinish.JS),
    "chebyshev": (KnnOp.LINF, KnnFinish.LINF),
}
