"""Merge-path SpMV/SpMM: one device against float64 scipy, bad input, distributed, real data."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import mgpu
from mgpu.distributed import from_scipy
from mgpu.synthetic import powerlaw_csr


def _random_csr(rng, m, n, density, dtype=np.float64) -> sp.csr_matrix:
    """Random values in [-5, 5), never exactly zero where stored."""
    A = sp.random(m, n, density=density, format="csr", random_state=rng, dtype=np.float64)
    A.data = (A.data - 0.5) * 10 + 1e-3
    return A.astype(dtype)


def _with_empty_rows(rng, m, n, density, empty_fraction, dtype=np.float64) -> sp.csr_matrix:
    A = _random_csr(rng, m, n, density, dtype)
    keep = (rng.random(m) >= empty_fraction).astype(np.float64)
    A = (sp.diags(keep) @ A).tocsr().astype(dtype)
    A.eliminate_zeros()
    return A


def _long_row(rng, m, n, dtype=np.float64) -> sp.csr_matrix:
    """A sparse matrix whose row m // 2 is completely dense (thousands of pieces' worth)."""
    A = _random_csr(rng, m, n, 0.001, dtype).tolil()
    A[m // 2, :] = rng.uniform(0.5, 1.5, size=n)
    return A.tocsr().astype(dtype)


def _matrices(rng, dtype):
    return {
        "random": _random_csr(rng, 700, 500, 0.02, dtype),
        "no-empty-rows": (_random_csr(rng, 400, 300, 0.05, dtype)
                          + sp.eye(400, 300, dtype=dtype, format="csr")).tocsr(),
        "many-empty-rows": _with_empty_rows(rng, 2000, 300, 0.01, 0.9, dtype),
        "all-empty": sp.csr_matrix((50, 30), dtype=dtype),
        "long-row": _long_row(rng, 300, 20_000, dtype),
        "zero-rows": sp.csr_matrix((0, 40), dtype=dtype),
        "one-column": _random_csr(rng, 500, 1, 0.5, dtype),
        "one-row": _random_csr(rng, 1, 3000, 0.5, dtype),
        "powerlaw": powerlaw_csr(3000, 2000, 40_000, dtype=dtype, seed=int(rng.integers(1000))),
    }


def _on(xp, A, x):
    if xp is np:
        return A, x
    import cupyx.scipy.sparse as csp

    return csp.csr_matrix(A), xp.asarray(x)


def _host(v):
    return v.get() if hasattr(v, "get") else v


def _rel_err(got, ref) -> float:
    """Largest error relative to the largest reference magnitude."""
    scale = max(float(np.abs(ref).max(initial=0.0)), 1e-300)
    return float(np.abs(np.asarray(got, np.float64) - ref).max(initial=0.0) / scale)


def _tol(dtype) -> float:
    return 1e-6 if dtype == np.float32 else 1e-13


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_spmv_matches_float64_scipy(xp, dtype):
    rng = np.random.default_rng(0)
    for name, A in _matrices(rng, dtype).items():
        x = rng.standard_normal(A.shape[1]).astype(dtype)
        ref = A.astype(np.float64) @ x.astype(np.float64)
        y = mgpu.spmv(*_on(xp, A, x))
        assert type(y).__module__.split(".")[0] == xp.__name__, name
        assert y.dtype == dtype and y.shape == (A.shape[0],), name
        assert _rel_err(_host(y), ref) <= _tol(dtype), name
        if A.shape[0]:
            # empty rows are exactly zero, not left over memory
            empty = np.diff(A.indptr) == 0
            assert np.all(_host(y)[empty] == 0), name


@pytest.mark.parametrize("width", [1, 2, 5, 32, 33, 70])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_spmm_matches_float64_scipy(xp, width, dtype):
    rng = np.random.default_rng(width)
    for name, A in _matrices(rng, dtype).items():
        X = rng.standard_normal((A.shape[1], width)).astype(dtype)
        ref = A.astype(np.float64) @ X.astype(np.float64)
        Y = mgpu.spmm(*_on(xp, A, X))
        assert type(Y).__module__.split(".")[0] == xp.__name__, name
        assert Y.dtype == dtype and Y.shape == (A.shape[0], width), name
        assert _rel_err(_host(Y), ref) <= _tol(dtype), name


def test_spmm_fortran_order_and_empty_width(xp):
    rng = np.random.default_rng(3)
    A = _with_empty_rows(rng, 300, 200, 0.05, 0.3)
    X = np.asfortranarray(rng.standard_normal((200, 6)))
    Y = mgpu.spmm(*_on(xp, A, X))
    assert _rel_err(_host(Y), A @ X) <= 1e-13
    Y0 = mgpu.spmm(*_on(xp, A, np.zeros((200, 0))))
    assert Y0.shape == (300, 0)


@pytest.mark.parametrize("fmt", ["coo", "csc", "lil", "bsr", "dok"])
def test_any_scipy_format_and_sparray(fmt):
    rng = np.random.default_rng(4)
    A = _random_csr(rng, 120, 90, 0.1)
    x = rng.standard_normal(90)
    ref = A @ x
    assert _rel_err(mgpu.spmv(A.asformat(fmt), x), ref) <= 1e-13
    assert _rel_err(mgpu.spmv(sp.csr_array(A), x), ref) <= 1e-13


def test_duplicates_and_unsorted_indices_are_summed_like_scipy():
    rng = np.random.default_rng(5)
    coo = _random_csr(rng, 80, 60, 0.2).tocoo()
    order = rng.permutation(coo.nnz)
    rows, cols, vals = coo.row[order], coo.col[order], coo.data[order]
    D = sp.csr_matrix((np.concatenate([vals / 2, vals / 2]),
                       (np.concatenate([rows, rows]), np.concatenate([cols, cols]))),
                      shape=coo.shape)
    # the same entries as CSR built by hand: each split into two duplicates, columns of a
    # row in random order
    r2, c2, v2 = (np.concatenate([a, a]) for a in (rows, cols, vals / 2))
    by_row = np.argsort(r2, kind="stable")
    indptr = np.concatenate([[0], np.cumsum(np.bincount(r2, minlength=80))]).astype(np.int32)
    U = sp.csr_matrix((v2[by_row], c2[by_row].astype(np.int32), indptr), shape=coo.shape)
    assert not U.has_canonical_format and not U.has_sorted_indices
    x = rng.standard_normal(60)
    ref = coo.toarray() @ x
    assert _rel_err(mgpu.spmv(U, x), ref) <= 1e-13
    assert _rel_err(mgpu.spmv(D, x), ref) <= 1e-13


def test_integer_and_mixed_dtypes_promote():
    A = sp.csr_matrix(np.array([[1, 0, 2], [0, 0, 0], [0, 3, 0]], dtype=np.int64))
    y = mgpu.spmv(A, np.array([1, 2, 3], dtype=np.int32))
    assert y.dtype == np.float64 and y.tolist() == [7.0, 0.0, 6.0]
    A32 = A.astype(np.float32)
    assert mgpu.spmv(A32, np.ones(3, np.float32)).dtype == np.float32
    assert mgpu.spmv(A32, np.ones(3, np.float64)).dtype == np.float64
    assert mgpu.spmv(A.astype(bool), np.ones(3, bool)).tolist() == [2.0, 0.0, 1.0]


def test_merge_path_kernel_every_piece_size():
    """Every cut of the merge, down to one item per piece: carries of rows spanning many
    pieces, pieces ending exactly at a row end, runs of empty rows inside one piece."""
    from mgpu.backends.numpy_spmv import spmm_merge, spmv_merge

    rng = np.random.default_rng(6)
    A = sp.vstack([_with_empty_rows(rng, 60, 40, 0.1, 0.5), _long_row(rng, 5, 40),
                   sp.csr_matrix((7, 40))]).tocsr()
    x = rng.standard_normal(40)
    X = rng.standard_normal((40, 3))
    for items in (1, 2, 3, 5, 8, 13, 64, A.shape[0] + A.nnz, 10**6):
        assert _rel_err(spmv_merge(A, x, items=items), A @ x) <= 1e-13, items
        assert _rel_err(spmm_merge(A, X, items=items), A @ X) <= 1e-13, items


def test_bad_input_is_refused():
    A = sp.random(5, 4, density=0.5, format="csr", random_state=0)
    with pytest.raises(ValueError, match=r"The 'x' parameter of spmv must have length "
                       r"A.shape\[1\] = 4 \(one entry per column of A\). Got length 3 instead."):
        mgpu.spmv(A, np.ones(3))
    with pytest.raises(ValueError, match=r"The 'X' parameter of spmm must have number of rows "
                       r"A.shape\[1\] = 4 .* Got number of rows 5 instead."):
        mgpu.spmm(A, np.ones((5, 2)))
    with pytest.raises(ValueError, match=r"must be 1-D. Got shape \(4, 2\) instead; use "
                       "mgpu.spmm"):
        mgpu.spmv(A, np.ones((4, 2)))
    with pytest.raises(ValueError, match=r"must be 2-D. Got shape \(4,\) instead; use mgpu.spmv"):
        mgpu.spmm(A, np.ones(4))
    with pytest.raises(ValueError, match=r"The 'x' parameter of spmv must be 1-D. Got shape "
                       r"\(4, 1, 1\)"):
        mgpu.spmv(A, np.ones((4, 1, 1)))
    with pytest.raises(TypeError, match="The 'A' parameter of spmv must be a scipy or cupyx "
                       "sparse matrix.* Got ndarray instead; for a dense A use A @ x."):
        mgpu.spmv(A.toarray(), np.ones(4))
    with pytest.raises(TypeError, match="must be a dense numpy or cupy array. Got list"):
        mgpu.spmv(A, [1.0, 2.0, 3.0, 4.0])
    with pytest.raises(TypeError, match="must be a dense numpy or cupy array. Got csr_matrix"):
        mgpu.spmv(A, sp.csr_matrix(np.ones((4, 1))))
    with pytest.raises(TypeError, match=r"The 'A' parameter of spmv must hold real numbers.*"
                       "complex128"):
        mgpu.spmv(A.astype(complex), np.ones(4))
    with pytest.raises(TypeError, match=r"The 'x' parameter of spmv must hold real numbers.*"
                       "complex64"):
        mgpu.spmv(A, np.ones(4, dtype=np.complex64))
    with pytest.raises(ValueError, match=r"The 'A' parameter of spmv must be 2-D. Got shape "
                       r"\(6,\)"):
        mgpu.spmv(sp.coo_array(np.arange(6.0)), np.ones(6))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nan_and_inf_are_refused_with_location(xp, dtype):
    """On the GPU the kernels flag these values as they read them; the message is the same.
    An x entry that no stored value of A touches is refused too."""
    A = sp.csr_matrix(np.array([[1.0, 0.0, 0.0], [0.0, 2.0, np.inf], [np.nan, 0.0, 1.0]],
                               dtype=dtype))
    for func, x in ((mgpu.spmv, np.ones(3, dtype)), (mgpu.spmm, np.ones((3, 2), dtype))):
        with pytest.raises(ValueError, match=rf"The 'A' parameter of {func.__name__} holds NaN "
                           r"or infinity \(first at row 1, column 2\)"):
            func(*_on(xp, A, x))
    good = sp.identity(3, format="csr", dtype=dtype)
    x = np.array([1.0, np.nan, 2.0], dtype=dtype)
    with pytest.raises(ValueError, match=r"The 'x' parameter of spmv holds NaN or infinity "
                       r"\(first at index 1\)"):
        mgpu.spmv(*_on(xp, good, x))
    unused = sp.csr_matrix(np.array([[1.0, 0.0, 2.0], [0.0, 0.0, 3.0]], dtype=dtype))
    with pytest.raises(ValueError, match=r"The 'x' parameter of spmv holds NaN or infinity "
                       r"\(first at index 1\)"):
        mgpu.spmv(*_on(xp, unused, x))
    X = np.ones((3, 4), dtype)
    X[2, 3] = -np.inf
    with pytest.raises(ValueError, match=r"The 'X' parameter of spmm holds NaN or infinity "
                       r"\(first at row 2, column 3\)"):
        mgpu.spmm(*_on(xp, good, X))
    with pytest.raises(ValueError, match=r"The 'x' parameter of spmv holds NaN"):
        mgpu.spmv(*_on(xp, sp.csr_matrix((0, 3), dtype=dtype), x))
    # a clean call after a refused one: the flag is per call
    assert _rel_err(_host(mgpu.spmv(*_on(xp, good, np.ones(3, dtype)))), np.ones(3)) == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_check_finite_false_skips_the_check_and_spreads_nan(xp, dtype):
    """The checked call's numbers on finite operands; NaN or infinity are not refused but
    reach exactly the rows that touch them (no error, no crash).

    On the GPU a row cut among a tile's threads is summed by shared-memory atomics, whose
    order varies, so two calls may differ in the last bit of a float64 row.
    """
    rng = np.random.default_rng(21)
    A = sp.random(300, 200, density=0.05, format="csr", random_state=21, dtype=dtype)
    x = rng.standard_normal(200).astype(dtype)
    X = rng.standard_normal((200, 5)).astype(dtype)
    eps = float(np.finfo(dtype).eps)
    for func, v in ((mgpu.spmv, x), (mgpu.spmm, X)):
        ref = A.astype(np.float64) @ v.astype(np.float64)
        checked = _host(func(*_on(xp, A, v)))
        unchecked = _host(func(*_on(xp, A, v), check_finite=False))
        assert _rel_err(unchecked, ref) <= _tol(dtype)
        assert _rel_err(unchecked, checked) <= 2 * eps
    bad = sp.csr_matrix(np.array([[1.0, 0.0, 0.0], [0.0, 2.0, np.inf], [np.nan, 0.0, 1.0],
                                  [0.0, 0.0, 0.0]], dtype=dtype))
    y = _host(mgpu.spmv(*_on(xp, bad, np.ones(3, dtype)), check_finite=False))
    assert y[0] == 1 and y[3] == 0 and np.isinf(y[1]) and np.isnan(y[2])
    Y = _host(mgpu.spmm(*_on(xp, bad, np.ones((3, 2), dtype)), check_finite=False))
    assert (Y[0] == 1).all() and (Y[3] == 0).all() and np.isinf(Y[1]).all()
    assert np.isnan(Y[2]).all()
    good = sp.csr_matrix(np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]], dtype=dtype))
    y = _host(mgpu.spmv(*_on(xp, good, np.array([2.0, np.nan, 3.0], dtype)),
                        check_finite=False))
    assert y[0] == 2 and np.isnan(y[1])


def test_one_device_op_refuses_dask():
    from mgpu.ops import spmv as spmv_local

    t = from_scipy(sp.identity(4, format="csr"), 2, client=None)
    with pytest.raises(TypeError, match="for a dask array A use mgpu.spmv"):
        spmv_local(t, np.ones(4))


# ------------------------------------------------------------------------------------ plans


def _plan_matrices(rng, dtype):
    """_matrices and the shapes a compacted plan must get right: empty rows before, after and
    between a few rows, and rows left after a row of many tiles."""
    def from_lengths(lengths, n):
        indptr = np.r_[0, np.cumsum(lengths)]
        cols = np.concatenate([np.arange(k) % n for k in lengths])
        return sp.csr_matrix((rng.uniform(0.5, 1.5, indptr[-1]), cols, indptr),
                             shape=(len(lengths), n), dtype=dtype)

    edges = np.zeros(40_000, np.int64)
    edges[[2, 10_000, 39_999]] = [2, 2, 3]  # empty rows first, between and none after
    spread = np.zeros(1000, np.int64)
    spread[[49, 149]] = [30_000, 2]  # a row of many tiles, empty rows on both sides
    return {**_matrices(rng, dtype), "empty-edges": from_lengths(edges, 7),
            "long-row-among-empty": from_lengths(spread, 30_000)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_plan_gives_the_same_products_for_many_x(xp, dtype):
    """spmv with a plan equals float64 scipy on every matrix, checked and unchecked, for
    several x with one plan; on the GPU the plan leaves out the empty rows of the matrices
    that have many (and y's empty rows are zeroed even where its memory held NaN)."""
    rng = np.random.default_rng(21)
    for name, A in _plan_matrices(rng, dtype).items():
        Ad, _ = _on(xp, A, np.zeros(1))
        plan = mgpu.spmv_plan(Ad)
        empty = int((np.diff(A.indptr) == 0).sum())
        assert (plan.shape, plan.nnz, plan.empty_rows) == (A.shape, A.nnz, empty), name
        assert plan.device == ("cpu" if xp is np else "gpu")
        assert plan.compacted == (xp is not np and empty * 16 >= A.shape[0] > 0), name
        for seed in range(3):
            x = rng.standard_normal(A.shape[1]).astype(dtype)
            ref = A.astype(np.float64) @ x.astype(np.float64)
            if xp is not np:
                xp.full(A.shape[0] + 64, np.nan, dtype=dtype)  # freed: y may reuse it
            for check in (True, False):
                y = mgpu.spmv(Ad, xp.asarray(x), check_finite=check, plan=plan)
                assert y.dtype == dtype and y.shape == (A.shape[0],)
                assert _rel_err(_host(y), ref) <= _tol(dtype), (name, seed, check)
                assert np.isfinite(_host(y)).all(), (name, seed, check)
    A = _with_empty_rows(rng, 500, 60, 0.05, 0.5)
    Ad, xd = _on(xp, A, np.ones(60, np.float32))  # float64 A, float32 x: promoted
    y = mgpu.spmv(Ad, xd, plan=mgpu.spmv_plan(Ad))
    assert y.dtype == np.float64 and _rel_err(_host(y), A @ np.ones(60)) <= 1e-13
    assert "SpMV plan on the" in mgpu.spmv_plan(Ad).describe()


def test_plan_refusals(xp):
    """A plan is refused for another matrix (a copy included), another device or a dask A;
    spmv_plan refuses what is not one CSR matrix; the values are still checked."""
    rng = np.random.default_rng(22)
    A = _with_empty_rows(rng, 300, 50, 0.05, 0.5)
    Ad, xd = _on(xp, A, np.ones(50))
    plan = mgpu.spmv_plan(Ad)
    with pytest.raises(ValueError, match="whose index arrays are other arrays"):
        mgpu.spmv(Ad.copy(), xd, plan=plan)
    with pytest.raises(ValueError, match=r"made for another A \(\(300, 50\) with .* got A "
                       r"\(300, 49\)"):
        mgpu.spmv(Ad[:, :49].tocsr(), xd[:49], plan=plan)
    with pytest.raises(ValueError, match="got A in 'coo' format"):
        mgpu.spmv(Ad.tocoo(), xd, plan=plan)
    with pytest.raises(TypeError, match="must come from mgpu.spmv_plan. Got dict"):
        mgpu.spmv(Ad, xd, plan={})
    with pytest.raises(ValueError, match="must be in CSR form .* Got 'csc'"):
        mgpu.spmv_plan(Ad.tocsc())
    with pytest.raises(TypeError, match="must be a scipy or cupyx sparse matrix"):
        mgpu.spmv_plan(np.ones((3, 3)))
    t = from_scipy(A, 2, client=None)
    with pytest.raises(TypeError, match="spmv_plan must be one scipy or cupyx matrix"):
        mgpu.spmv_plan(t)
    with pytest.raises(TypeError, match="is for one matrix on one device; a dask A"):
        mgpu.spmv(t, np.ones(50), plan=plan)
    x = np.ones(50)
    x[3] = np.inf
    with pytest.raises(ValueError, match=r"holds NaN or infinity \(first at index 3\)"):
        mgpu.spmv(Ad, xp.asarray(x), plan=plan)
    if xp is not np:
        cpu_plan = mgpu.spmv_plan(A)
        with pytest.raises(ValueError, match="was made for the CPU, but A is on the GPU"):
            mgpu.spmv(Ad, xd, plan=cpu_plan)
        with pytest.raises(ValueError, match="was made for the GPU, but A is on the CPU"):
            mgpu.spmv(A, np.ones(50), plan=plan)


# ------------------------------------------------------------------------------ distributed


def test_distributed_spmv_and_spmm(client):
    rng = np.random.default_rng(7)
    A = sp.vstack([_with_empty_rows(rng, 900, 400, 0.02, 0.4), _long_row(rng, 100, 400),
                   powerlaw_csr(1000, 400, 20_000, dtype=np.float64, seed=1)]).tocsr()
    tiles = from_scipy(A, 4, axis=0)
    x = rng.standard_normal(400)
    y = mgpu.spmv(tiles, x)
    assert y.chunks == (tiles.chunks[0],) and y.dtype == np.float64
    got = y.compute()
    assert isinstance(got, np.ndarray) and _rel_err(got, A @ x) <= 1e-13
    X = rng.standard_normal((400, 5)).astype(np.float32)
    Y = mgpu.spmm(tiles, X)
    assert Y.shape == (2000, 5) and Y.dtype == np.float64  # float64 A, float32 X
    assert _rel_err(Y.compute(), A @ X.astype(np.float64)) <= 1e-13
    # float32 throughout stays float32
    t32 = from_scipy(A.astype(np.float32), 3, axis=0)
    y32 = mgpu.spmv(t32, x.astype(np.float32)).compute()
    assert y32.dtype == np.float32 and _rel_err(y32, A @ x) <= 1e-5


def test_distributed_bad_input(client):
    A = sp.random(60, 30, density=0.2, format="csr", random_state=8)
    rows, cols = from_scipy(A, 2, axis=0), from_scipy(A, 2, axis=1)
    with pytest.raises(ValueError, match=r"must have length A.shape\[1\] = 30 .* Got length 29"):
        mgpu.spmv(rows, np.ones(29))
    # column tiles, once refused, are re-cut into row tiles (issue 35)
    np.testing.assert_allclose(mgpu.spmv(cols, np.ones(30)).compute(), A @ np.ones(30))
    with pytest.raises(ValueError, match=r"holds NaN or infinity \(first at index 4\)"):
        x = np.ones(30)
        x[4] = np.nan
        mgpu.spmv(rows, x)
    B = A.copy()
    B.data[-1] = np.inf
    with pytest.raises(ValueError, match=r"The 'A' parameter of spmv holds NaN or infinity"):
        mgpu.spmv(from_scipy(B, 2, axis=0), np.ones(30)).compute()
    # check_finite=False: neither the client nor the tiles look; NaN reaches its rows only
    y = mgpu.spmv(from_scipy(B, 2, axis=0), x, check_finite=False).compute()
    touched = np.diff(B[:, 4].tocsr().indptr).astype(bool)
    touched[np.searchsorted(B.indptr, B.nnz - 1, side="right") - 1] = True
    assert touched.any() and not np.isfinite(y[touched]).any()
    assert np.isfinite(y[~touched]).all()
    np.testing.assert_allclose(y[~touched], (A @ np.where(np.isnan(x), 0, x))[~touched],
                               rtol=1e-12)


# ------------------------------------------------------------------------------- real data


@pytest.mark.parametrize("path", ["graphs/email-Enron.txt.gz", "graphs/soc-Slashdot0902.txt.gz",
                                  "matrices/memplus.mtx.gz", "graphs/ca-HepPh.txt.gz",
                                  "graphs/p2p-Gnutella31.txt.gz"])
def test_real_matrices(xp, data_dir, path):
    import mgpu.io

    f = data_dir / path
    if not f.exists():
        pytest.skip(f"{f} not present")
    A = sp.csr_matrix(mgpu.io.load(f), dtype=np.float64)
    rng = np.random.default_rng(9)
    x = rng.standard_normal(A.shape[1])
    assert _rel_err(_host(mgpu.spmv(*_on(xp, A, x))), A @ x) <= 1e-13
    Ad, xd = _on(xp, A, x)
    assert _rel_err(_host(mgpu.spmv(Ad, xd, plan=mgpu.spmv_plan(Ad))), A @ x) <= 1e-13
    X = rng.standard_normal((A.shape[1], 4)).astype(np.float32)
    A32 = A.astype(np.float32)
    Y = mgpu.spmm(*_on(xp, A32, X))
    assert Y.dtype == np.float32
    assert _rel_err(_host(Y), A @ X.astype(np.float64)) <= 1e-6


# ------------------------------------------------------------------------------ benchmark


def test_bench_spmv_on_cpu():
    from mgpu.bench.spmv import bench_spmv, markdown, nnz_time_correlation

    rng = np.random.default_rng(10)
    mats = [("small", _random_csr(rng, 300, 200, 0.05)),
            ("powerlaw", powerlaw_csr(3000, 2000, 30_000, seed=2))]
    rows = bench_spmv(mats, repeats=2, device="cpu")
    assert [r["name"] for r in rows] == ["small", "powerlaw"]
    for r in rows:
        assert r["device"] == "cpu" and r["mgpu_ms"] > 0 and r["peer_ms"] > 0
        assert r["planned_ms"] > 0 and not r["compacted"]
        assert r["rel_err"] <= 1e-6
    assert rows[1]["nnz"] == powerlaw_csr(3000, 2000, 30_000, seed=2).nnz
    table = markdown(rows, "cpu")
    assert "| powerlaw | cpu | 3000×2000 |" in table and "Correlation of time with nnz" in table
    c = nnz_time_correlation([{"nnz": 1, "mgpu_ms": 2.0}, {"nnz": 2, "mgpu_ms": 1.0}])
    assert c == pytest.approx(-1.0)
    assert np.isnan(nnz_time_correlation(rows[:1]))


# ----------------------------------------------------------------------------------- GPU only


@pytest.fixture(params=["own block", "search launch"])
def tile_search(request, monkeypatch):
    """Each SpMV tile found on the merge path by its own block, or by a search launch first
    (which of the two a launch takes depends on its size: both are forced here)."""
    from mgpu.backends import cupy_spmv as gpu

    monkeypatch.setattr(gpu, "_SEARCH_WAVES", 10**9 if request.param == "own block" else 0)
    return request.param


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_kernels_each_items_and_fallback(dtype, tile_search):
    """Every ITEMS instantiation of both kernels, the cuSPARSE fallback, against float64."""
    import cupy
    import cupyx.scipy.sparse as csp

    from mgpu.backends import cupy_spmv as gpu
    from mgpu.backends.instances import SPMM_ITEMS, SPMV_ITEMS

    rng = np.random.default_rng(11)
    for name, A in _matrices(rng, dtype).items():
        G = csp.csr_matrix(A)
        x = rng.standard_normal(A.shape[1]).astype(dtype)
        X = rng.standard_normal((A.shape[1], 37)).astype(dtype)
        xg, Xg = cupy.asarray(x), cupy.asarray(X)
        assert gpu.spmv_is_usable_for(G, xg) and gpu.spmv_is_usable_for(G, Xg)
        ref = A.astype(np.float64) @ x.astype(np.float64)
        REF = A.astype(np.float64) @ X.astype(np.float64)
        for items in SPMV_ITEMS:
            y = gpu.spmv_merge(G, xg, items=items)
            assert y.dtype == dtype and _rel_err(y.get(), ref) <= _tol(dtype), (name, items)
        for items in SPMM_ITEMS:
            Y = gpu.spmm_merge(G, Xg, items=items)
            assert Y.dtype == dtype and _rel_err(Y.get(), REF) <= _tol(dtype), (name, items)
        tol = 1e-5 if dtype == np.float32 else 1e-12  # cuSPARSE sums in T
        assert _rel_err(gpu.spmv_fallback(G, xg).get(), ref) <= tol, name


@pytest.mark.gpu
def test_gpu_result_types_and_device_mismatch():
    import cupy
    import cupyx.scipy.sparse as csp

    A = sp.random(50, 40, density=0.1, format="csr", random_state=12)
    G = csp.csr_matrix(A)
    y = mgpu.spmv(G, cupy.ones(40, dtype=cupy.float32))  # float64 A, float32 x
    assert isinstance(y, cupy.ndarray) and y.dtype == np.float64
    assert _rel_err(y.get(), A @ np.ones(40)) <= 1e-13
    assert isinstance(mgpu.spmv(G.tocoo(), cupy.ones(40)), cupy.ndarray)
    with pytest.raises(ValueError, match=r"The operands of spmv must be on one device. Got A on "
                       r"the CPU \(csr_matrix\) and x on the GPU \(ndarray\)"):
        mgpu.spmv(A, cupy.ones(40))
    with pytest.raises(ValueError, match=r"Got A on the GPU \(csr_matrix\) and X on the CPU"):
        mgpu.spmm(G, np.ones((40, 2)))
    x = cupy.ones(40)
    x[7] = cupy.nan
    with pytest.raises(ValueError, match=r"holds NaN or infinity \(first at index 7\)"):
        mgpu.spmv(G, x)
    with pytest.raises(ValueError, match=r"Got length 39 instead"):
        mgpu.spmv(G, cupy.ones(39))


@pytest.mark.gpu
def test_gpu_checked_spmv_finds_nan_and_infinity_of_a_wherever_they_sum(tile_search):
    """The checked SpMV flags row sums, not values: a NaN or infinity of A is found in a row
    of a short-row tile, in a row cut over many tiles (its carries), and as inf * 0; a sum
    that overflows from finite operands is returned as scipy gives it, not refused."""
    import cupy
    import cupyx.scipy.sparse as csp

    from mgpu.synthetic import band_csr

    short = band_csr(50_000, 5, dtype=np.float32)
    n = 20_000
    long_row = sp.csr_matrix((np.ones(n, np.float32), np.arange(n), [0, 0, n, n]), shape=(3, n))
    for A, (row, col), x_col_zero in ((short, (31_000, 31_002), False),
                                      (long_row, (1, 12_345), False),
                                      (long_row, (1, 777), True)):
        for bad in (np.nan, np.inf, -np.inf):
            B = A.copy()
            lo, hi = B.indptr[row], B.indptr[row + 1]
            p = lo + np.flatnonzero(B.indices[lo:hi] == col)[0]
            B.data[p] = bad
            x = np.ones(A.shape[1], np.float32)
            if x_col_zero:
                x[col] = 0  # inf * 0 is NaN
            with pytest.raises(ValueError, match=rf"first at row {row}, column {col}"):
                mgpu.spmv(csp.csr_matrix(B), cupy.asarray(x))
    big = sp.csr_matrix(np.full((4, 3), 3e38, np.float32))
    y = mgpu.spmv(csp.csr_matrix(big), cupy.full(3, 10, cupy.float32)).get()
    np.testing.assert_array_equal(y, big @ np.full(3, 10, np.float32))  # inf, as scipy
    assert np.isinf(y).all()


@pytest.mark.gpu
def test_gpu_compacted_plan_with_more_empty_rows_than_tiles_and_checks():
    """A compacted plan whose empty rows outnumber the items of its tiles (blocks that only
    zero rows), a row of many tiles among them (carries written through the row map), and
    the checked call with it: NaN or infinity of A found at its row of A, and an overflow
    returned as inf."""
    import cupy
    import cupyx.scipy.sparse as csp

    rng = np.random.default_rng(23)
    m, n = 2_000_000, 300_000
    indptr = np.zeros(m + 1, np.int64)
    indptr[1_500_001:] = n  # row 1,500,000 holds every nonzero
    indptr[1_999_999:] = n + 3  # and row 1,999,998 three more
    cols = np.r_[np.arange(n), 0, 7, 9]
    for dtype in (np.float32, np.float64):
        A = sp.csr_matrix((rng.uniform(0.5, 1.5, n + 3).astype(dtype), cols, indptr),
                          shape=(m, n))
        G = csp.csr_matrix(A)
        plan = mgpu.spmv_plan(G)
        assert plan.compacted and plan.merge_rows == 2 and plan.empty_rows == m - 2
        x = rng.standard_normal(n).astype(dtype)
        ref = A.astype(np.float64) @ x.astype(np.float64)
        cupy.full(m + 64, np.nan, dtype=dtype)  # freed: y may reuse it
        y = mgpu.spmv(G, cupy.asarray(x), plan=plan).get()
        assert np.count_nonzero(y) == 2 and _rel_err(y, ref) <= _tol(dtype)
        B = A.copy()
        B.data[n + 1] = np.nan
        GB = csp.csr_matrix(B)
        with pytest.raises(ValueError, match=r"first at row 1999998, column 7"):
            mgpu.spmv(GB, cupy.asarray(x), plan=mgpu.spmv_plan(GB))
    big = sp.csr_matrix(([3e38] * 3, [0, 1, 2], [0, 0, 0, 3, 3]), shape=(4, 3), dtype=np.float32)
    Gb = csp.csr_matrix(big)
    y = mgpu.spmv(Gb, cupy.full(3, 10, cupy.float32), plan=mgpu.spmv_plan(Gb)).get()
    assert mgpu.spmv_plan(Gb).compacted and np.isinf(y[2]) and (y[[0, 1, 3]] == 0).all()


@pytest.mark.gpu
def test_gpu_single_row_spanning_many_pieces(tile_search):
    """One row of a million nonzeros: ~10⁵ pieces carry into it, gathered in double by
    the carry passes; the rest of the matrix is empty rows."""
    import cupy
    import cupyx.scipy.sparse as csp

    rng = np.random.default_rng(13)
    n = 1_000_000
    A = sp.csr_matrix((rng.uniform(0.5, 1.5, n), np.arange(n), [0, 0, n, n, n]), shape=(4, n))
    x = rng.standard_normal(n)
    for dtype in (np.float32, np.float64):
        y = mgpu.spmv(csp.csr_matrix(A.astype(dtype)), cupy.asarray(x, dtype=dtype)).get()
        ref = A.astype(dtype).astype(np.float64) @ x.astype(dtype).astype(np.float64)
        assert y[0] == 0 and y[2] == 0 and y[3] == 0
        assert abs(y[1] - ref[1]) <= _tol(dtype) * np.abs(A.data).sum() * np.abs(x).max()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_spmv_tile_edges(dtype, tile_search):
    """SpMV tiles of 128 * items merge items: tiles of nothing but row ends (runs of empty
    rows), of nothing but one row's nonzeros, merges that end exactly at a tile's end or one
    item past it, rows ending exactly at a tile boundary, and a single tile (no carry pass)."""
    import cupy
    import cupyx.scipy.sparse as csp

    from mgpu.backends import cupy_spmv as gpu
    from mgpu.backends.instances import SPMV_ITEMS

    rng = np.random.default_rng(14)
    for items in SPMV_ITEMS:
        tile = 128 * items
        one_row = tile * 3 - 1  # with its row end, exactly three tiles
        cases = {
            "empty-rows": sp.csr_matrix((tile * 3, 10), dtype=dtype),
            "empty-rows+1": sp.csr_matrix((tile * 3 + 1, 10), dtype=dtype),
            "one-row": sp.csr_matrix((rng.uniform(0.5, 1.5, one_row), np.arange(one_row),
                                      [0, one_row]), shape=(1, one_row)),
            "one-row+1": sp.csr_matrix((rng.uniform(0.5, 1.5, one_row + 1),
                                        np.arange(one_row + 1), [0, one_row + 1]),
                                       shape=(1, one_row + 1)),
            # rows of tile - 1 nonzeros: each row end is a tile's last item
            "row-per-tile": _random_csr(rng, 6, tile - 1, 1.0, dtype),
            "single-tile": _random_csr(rng, 9, 40, 0.3, dtype),
            "empty-then-dense": sp.vstack([sp.csr_matrix((tile + 5, 300)),
                                           _random_csr(rng, 50, 300, 0.9),
                                           sp.csr_matrix((2 * tile, 300)),
                                           _random_csr(rng, 3, 300, 1.0)]).tocsr(),
        }
        for name, A in cases.items():
            A = sp.csr_matrix(A, dtype=dtype)
            x = rng.standard_normal(A.shape[1]).astype(dtype)
            ref = A.astype(np.float64) @ x.astype(np.float64)
            y = gpu.spmv_merge(csp.csr_matrix(A), cupy.asarray(x), items=items).get()
            assert _rel_err(y, ref) <= _tol(dtype), (name, items)
            if not ref.any():
                assert not y.any(), (name, items)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_spmv_rows_around_the_row_per_thread_cap(dtype, tile_search):
    """A tile whose rows all hold at most 32 nonzeros (MGPU_SPMV_ROW_CAP) is summed a row per
    thread, any other by the merge walk: bands of 31, 32 and 33 diagonals, rows whose lengths
    cycle through 0..40 (both kinds of tile side by side, rows cut at tile ends), and one
    33-long row among short ones."""
    import cupy
    import cupyx.scipy.sparse as csp

    from mgpu.backends import cupy_spmv as gpu
    from mgpu.backends.instances import SPMV_ITEMS
    from mgpu.synthetic import band_csr

    rng = np.random.default_rng(15)
    lengths = np.arange(6000) % 41
    cycling = sp.csr_matrix((rng.uniform(0.5, 1.5, lengths.sum()),
                             np.concatenate([rng.choice(500, k, replace=False) for k in lengths]),
                             np.concatenate([[0], np.cumsum(lengths)])), shape=(6000, 500))
    one_long = _random_csr(rng, 3000, 400, 0.02, dtype).tolil()
    one_long[1700, :33] = 1.0
    cases = {f"band{w}": band_csr(20_000, w, dtype=dtype) for w in (31, 32, 33)}
    cases.update(cycling=cycling, one_long=one_long.tocsr())
    for items in SPMV_ITEMS:
        for name, A in cases.items():
            A = sp.csr_matrix(A, dtype=dtype)
            A.sort_indices()
            x = rng.standard_normal(A.shape[1]).astype(dtype)
            ref = A.astype(np.float64) @ x.astype(np.float64)
            y = gpu.spmv_merge(csp.csr_matrix(A), cupy.asarray(x), items=items).get()
            assert _rel_err(y, ref) <= _tol(dtype), (name, items)
