"""Memory budgets on the CPU: kNN's batches hold no more than their working memory beyond the
inputs, for every metric, where the unbatched distances would be ten times the budget; a
budget that cannot hold one query is refused with the numbers before any work; SDDMM never
forms the dense product.

Peaks are tracemalloc's, which sees NumPy's allocations (every array of these paths)."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

import mgpu
from mgpu.ops.distances import SEMIRINGS
from mgpu.ops.distances import _nbytes as nbytes


def _nbytes(*arrays) -> int:
    return sum(nbytes(X) for X in arrays)


def _inputs(kind: str, metric: str, n_index: int, n_queries: int, d: int, density: float):
    rng = np.random.default_rng(7)
    X = sp.random(n_index, d, density=density, random_state=rng, format="csr")
    Q = sp.random(n_queries, d, density=density, random_state=rng, format="csr")
    if SEMIRINGS[metric].positive_rows:  # jensenshannon: every row needs mass
        X, Q = (sp.hstack([Z, np.ones((Z.shape[0], 1))], format="csr") for Z in (X, Q))
    if kind == "dense":
        X, Q = X.toarray(), Q.toarray()
    return X, Q


def _peak(fn):
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("kind, n_index, n_queries, d, density", [
    ("sparse", 5000, 800, 300, 0.03),
    ("dense", 4000, 2000, 50, 0.2),
])
@pytest.mark.parametrize("metric", sorted(SEMIRINGS))
def test_knn_stays_within_its_working_memory(metric, kind, n_index, n_queries, d, density):
    X, Q = _inputs(kind, metric, n_index, n_queries, d, density)
    budget = n_index * n_queries * 8 // 10  # the unbatched distances: ten budgets
    mgpu.knn(X[:20], Q[:3], 2, metric=metric)  # compile the kernels outside the measurement
    (dist, ind), peak = _peak(lambda: mgpu.knn(X, Q, 10, metric=metric,
                                               working_memory=budget))
    inputs = _nbytes(X, Q)
    assert peak <= budget + inputs, (
        f"{metric} on {kind} input: peak {peak:,} bytes > budget {budget:,} + inputs "
        f"{inputs:,}")
    # batching changes nothing: the same neighbours as all queries in one batch
    d1, i1 = mgpu.knn(X, Q, 10, metric=metric, working_memory=1 << 40)
    np.testing.assert_array_equal(ind, i1)
    np.testing.assert_allclose(dist, d1, rtol=1e-12, atol=1e-12)


def test_a_budget_too_small_for_one_query_is_refused_with_the_numbers():
    X, Q = _inputs("sparse", "jaccard", 2000, 10, 100, 0.05)
    with pytest.raises(ValueError, match=r"working memory of knn \(1,000 bytes.*metric "
                       r"'jaccard'.*2\.3 cop\(ies\) of the index.*need [\d,]+ bytes"):
        mgpu.knn(X, Q, 3, metric="jaccard", working_memory=1000)


def test_sddmm_never_forms_the_dense_product():
    rng = np.random.default_rng(3)
    m, n, k = 20000, 20000, 16
    S = sp.random(m, n, density=1e-4, random_state=rng, format="csr")
    A = rng.standard_normal((m, k))
    B = rng.standard_normal((n, k))
    mgpu.sddmm(S[:10, :10], A[:10], B[:10])
    out, peak = _peak(lambda: mgpu.sddmm(S, A, B))
    dense = m * n * 8
    # the result and S's pattern copied, nothing of m × n
    assert peak <= 3 * _nbytes(S), (peak, _nbytes(S), dense)
    np.testing.assert_allclose(out.data, np.einsum("ij,ij->i", A[S.tocoo().row],
                                                   B[S.tocoo().col]) * S.tocoo().data)
