from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import mgpu
from mgpu.ops import NORMS


def _reference(D: np.ndarray, norm: str) -> np.ndarray:
    D = D.astype(np.float64)
    return {
        "l1": np.abs(D).sum(1),
        "l2": np.sqrt((D * D).sum(1)),
        "sqeuclidean": (D * D).sum(1),
        "linf": np.abs(D).max(1, initial=0.0),
        "sum": D.sum(1),
    }[norm]


def _random_csr(rng, m, n, density, dtype, index_dtype=np.int32):
    S = sp.random(m, n, density=density, format="csr", random_state=rng, dtype=np.float64)
    S.data = (S.data - 0.5) * 10
    S = S.astype(dtype)
    S.indptr = S.indptr.astype(index_dtype)
    S.indices = S.indices.astype(index_dtype)
    return S


def _to_xp(xp, M):
    if xp is np:
        return M
    import cupyx.scipy.sparse as csp

    return csp.csr_matrix(M) if sp.issparse(M) else xp.asarray(M)


def _get(a):
    return a.get() if hasattr(a, "get") else a


@pytest.mark.parametrize("norm", sorted(NORMS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_norms_sparse_and_dense(xp, norm, dtype):
    rng = np.random.default_rng(0)
    # Rows from empty to several thousand nonzeros, so warps loop over long rows too.
    S = sp.vstack(
        [
            _random_csr(rng, 50, 5000, 0.0, dtype),
            _random_csr(rng, 300, 5000, 0.002, dtype),
            _random_csr(rng, 5, 5000, 0.9, dtype),
        ]
    ).tocsr()
    ref = _reference(S.toarray(), norm)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    for X in (_to_xp(xp, S), _to_xp(xp, S.toarray())):
        got = mgpu.row_norms(X, norm=norm)
        assert type(got).__module__.split(".")[0] == xp.__name__
        assert got.dtype == dtype and got.shape == (S.shape[0],)
        np.testing.assert_allclose(_get(got), ref, rtol=rtol, atol=1e-6)


def test_row_norms_int64_indices_and_duplicates():
    rng = np.random.default_rng(1)
    S = _random_csr(rng, 40, 30, 0.3, np.float64, np.int64)
    # The same matrix as COO with every entry split into two duplicates, unsorted.
    coo = S.tocoo()
    half = coo.data / 2
    D = sp.csr_matrix(
        (np.concatenate([half, half]), (np.concatenate([coo.row, coo.row]),
                                        np.concatenate([coo.col, coo.col]))),
        shape=S.shape,
    )
    D.has_canonical_format = False
    before = D.data.copy()
    np.testing.assert_allclose(mgpu.row_norms(D), _reference(S.toarray(), "l2"), rtol=1e-12)
    assert np.array_equal(D.data, before), "the input was modified"


def test_row_norms_integer_and_bool_input_compute_in_float64():
    S = sp.csr_matrix(np.array([[3, 4], [0, 0], [-1, 0]], dtype=np.int64))
    got = mgpu.row_norms(S)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, [5.0, 0.0, 1.0])
    assert mgpu.row_norms(np.array([[True, True]]), norm="l1").tolist() == [2.0]


def test_row_norms_nan_propagates():
    S = sp.csr_matrix(np.array([[1.0, np.nan], [1.0, 2.0]]))
    for norm in NORMS:
        got = mgpu.row_norms(S, norm=norm)
        assert np.isnan(got[0]) and np.isfinite(got[1]), norm


def test_row_norms_bad_input():
    with pytest.raises(ValueError, match=r"The 'norm' parameter of row_norms must be a str among"
                       r" \{'l1', 'l2', 'linf', 'sqeuclidean', 'sum'\}. Got 'l3' instead."):
        mgpu.row_norms(np.ones((2, 2)), norm="l3")
    with pytest.raises(ValueError, match="must be 2-D. Got shape"):
        mgpu.row_norms(np.ones(3))
    with pytest.raises(TypeError, match="Got list instead"):
        mgpu.row_norms([[1.0]])
    with pytest.raises(TypeError, match="real numbers"):
        mgpu.row_norms(np.ones((2, 2), dtype=complex))


def test_row_norms_of_dask_array_of_csr_chunks():
    from mgpu.distributed import from_scipy

    S = sp.random(500, 80, density=0.1, format="csr", random_state=3)
    x = from_scipy(S, 3, client=None)
    got = mgpu.row_norms(x, norm="l1")
    assert got.chunks == (x.chunks[0],)
    np.testing.assert_allclose(got.compute(), _reference(S.toarray(), "l1"), rtol=1e-12)
    y = from_scipy(S, 3, axis=1, client=None)  # column chunks are put back together
    np.testing.assert_allclose(mgpu.row_norms(y).compute(), _reference(S.toarray(), "l2"))


@pytest.mark.gpu
@pytest.mark.parametrize("norm", sorted(NORMS))
def test_gpu_kernel_and_fallback_agree_with_cpu(norm):
    import cupy
    import cupyx.scipy.sparse as csp

    from mgpu.backends import cupy as gpu
    from mgpu.backends.numpy import row_reduce_csr

    op, root = NORMS[norm]
    rng = np.random.default_rng(4)
    for dtype, idx in ((np.float32, np.int32), (np.float64, np.int32)):
        S = _random_csr(rng, 2000, 3000, 0.01, dtype, idx)
        G = csp.csr_matrix(S)
        assert gpu.row_norms_is_usable_for(G)
        cpu = row_reduce_csr(S, op)
        k = gpu.row_reduce_csr_kernel(G, op)
        f = gpu.row_reduce_csr_fallback(G, op)
        assert isinstance(k, cupy.ndarray) and k.dtype == dtype
        rtol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(k.get(), cpu, rtol=rtol, atol=1e-6)
        np.testing.assert_allclose(f.get(), cpu, rtol=rtol, atol=1e-6)


@pytest.mark.gpu
def test_gpu_kernel_with_int64_indptr():
    """cupyx keeps 32-bit indices; the kernel's 64-bit instantiation is driven directly."""
    import cupy

    from mgpu.backends import cupy as gpu
    from mgpu.backends.loader import get_function
    from mgpu.backends.numpy import ROW_SQ_SUM, row_reduce_csr

    S = _random_csr(np.random.default_rng(5), 1000, 700, 0.02, np.float64, np.int64)
    out = cupy.empty(S.shape[0], dtype=np.float64)
    fn = get_function(
        "rows.cu", f"mgpu_row_norms_warp<double, long long, {ROW_SQ_SUM}>", gpu._ROWS_INSTANCES
    )
    fn((64,), (256,), (cupy.asarray(S.indptr), cupy.asarray(S.data), cupy.int64(1000), out))
    np.testing.assert_allclose(out.get(), row_reduce_csr(S, ROW_SQ_SUM), rtol=1e-12)
