"""SDDMM: one device against a float64 reference, bad input, and the distributed path."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import mgpu
from mgpu.distributed import chunk_workers, from_scipy, gather
from mgpu.synthetic import powerlaw_csr


def _reference(S: sp.spmatrix, A: np.ndarray, B: np.ndarray, hadamard: bool) -> np.ndarray:
    """Values of P in S's CSR order, in float64."""
    S = S.tocsr()
    rows = np.repeat(np.arange(S.shape[0]), np.diff(S.indptr))
    v = np.einsum("ik,ik->i", A[rows].astype(np.float64), B[S.indices].astype(np.float64))
    return v * S.data if hadamard else v


def _awkward_matrix(rng, m=300, n=200, density=0.03, dtype=np.float32) -> sp.csr_matrix:
    """Empty rows and columns, one dense row, one dense column, values never zero."""
    S = sp.random(m, n, density=density, format="lil", random_state=rng, dtype=np.float64)
    S[5, :] = rng.uniform(0.5, 2.0, size=n)  # one dense row
    S[:, 7] = rng.uniform(0.5, 2.0, size=(m, 1))  # one dense column
    keep_rows = np.ones(m)
    keep_rows[10:20] = 0  # empty rows
    keep_cols = np.ones(n)
    keep_cols[50:60] = 0  # empty columns
    S = (sp.diags(keep_rows) @ S.tocsr() @ sp.diags(keep_cols)).tocsr()
    S.eliminate_zeros()
    S.sort_indices()
    return S.astype(dtype)


def _on(xp, S, A, B):
    if xp is np:
        return S, A, B
    import cupyx.scipy.sparse as csp

    return csp.csr_matrix(S), xp.asarray(A), xp.asarray(B)


def _host(x):
    return x.get() if hasattr(x, "get") else x


def _rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """Largest error relative to the largest reference magnitude."""
    scale = max(float(np.abs(ref).max(initial=0.0)), 1e-300)
    return float(np.abs(got.astype(np.float64) - ref).max(initial=0.0) / scale)


@pytest.mark.parametrize("K", [1, 7, 32, 33, 130])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("hadamard", [True, False])
def test_sddmm_matches_float64_reference(xp, K, dtype, hadamard):
    rng = np.random.default_rng(K)
    S = _awkward_matrix(rng, dtype=dtype)
    A = rng.standard_normal((S.shape[0], K)).astype(dtype)
    B = rng.standard_normal((S.shape[1], K)).astype(dtype)
    P = mgpu.sddmm(*_on(xp, S, A, B), hadamard=hadamard)
    P = _host(P) if xp is np else P.get()
    assert P.dtype == dtype and P.shape == S.shape
    assert np.array_equal(P.indptr, S.indptr) and np.array_equal(P.indices, S.indices)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert _rel_err(P.data, _reference(S, A, B, hadamard)) <= tol


def test_every_output_element_is_written():
    from mgpu.backends.numpy import _sddmm_csr

    rng = np.random.default_rng(0)
    S = _awkward_matrix(rng, dtype=np.float64)
    A = rng.standard_normal((S.shape[0], 5))
    B = rng.standard_normal((S.shape[1], 5))
    out = np.full(S.nnz, np.nan)
    _sddmm_csr(S.indptr, S.indices, S.data, A, B, True, out)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, _reference(S, A, B, True), rtol=1e-12, atol=1e-12)


def test_mixed_dtypes_and_integer_counts_compute_in_float64():
    rng = np.random.default_rng(1)
    S = sp.random(40, 30, density=0.2, format="csr", random_state=rng)
    S.data = np.ceil(S.data * 5)
    S = S.astype(np.int64)
    A = rng.standard_normal((40, 4)).astype(np.float32)
    B = rng.standard_normal((30, 4))
    P = mgpu.sddmm(S, A, B)
    assert P.dtype == np.float64
    np.testing.assert_allclose(P.data, _reference(S, A, B, True), rtol=1e-12, atol=1e-12)
    assert mgpu.sddmm(S, A, B.astype(np.float32), hadamard=False).dtype == np.float32


def test_unsorted_indices_keep_their_order():
    rng = np.random.default_rng(2)
    S = sp.random(50, 40, density=0.2, format="csr", random_state=rng)
    # reverse the column order inside every row
    for i in range(S.shape[0]):
        a, b = S.indptr[i], S.indptr[i + 1]
        S.indices[a:b] = S.indices[a:b][::-1].copy()
        S.data[a:b] = S.data[a:b][::-1].copy()
    S.has_sorted_indices = False
    A, B = rng.standard_normal((50, 6)), rng.standard_normal((40, 6))
    P = mgpu.sddmm(S, A, B)
    assert np.array_equal(P.indices, S.indices)
    np.testing.assert_allclose(P.data, _reference(S, A, B, True), rtol=1e-12, atol=1e-12)
    # S float32 with float64 factors: S's values are widened, its order kept
    S32 = S.astype(np.float32)
    S32.indices[:], S32.data[:] = S.indices, S.data.astype(np.float32)
    S32.has_sorted_indices = False
    P = mgpu.sddmm(S32, A, B, hadamard=False)
    assert P.dtype == np.float64 and np.array_equal(P.indices, S.indices)
    np.testing.assert_allclose(P.data, _reference(S, A, B, False), rtol=1e-12, atol=1e-12)


def test_other_formats_and_empty_cases():
    rng = np.random.default_rng(3)
    S = sp.random(30, 20, density=0.1, format="coo", random_state=rng)
    A, B = rng.standard_normal((30, 3)), rng.standard_normal((20, 3))
    np.testing.assert_allclose(mgpu.sddmm(S, A, B).toarray(),
                               S.toarray() * (A @ B.T), rtol=1e-12, atol=1e-12)
    E = sp.csr_matrix((30, 20))
    assert mgpu.sddmm(E, A, B).nnz == 0
    P = mgpu.sddmm(S.tocsr(), np.zeros((30, 0)), np.zeros((20, 0)))
    assert P.nnz == S.nnz and not P.data.any()


def test_int64_indices():
    rng = np.random.default_rng(4)
    S = sp.random(60, 50, density=0.1, format="csr", random_state=rng)
    S.indices = S.indices.astype(np.int64)
    S.indptr = S.indptr.astype(np.int64)
    A, B = rng.standard_normal((60, 9)), rng.standard_normal((50, 9))
    P = mgpu.sddmm(S, A, B)
    np.testing.assert_allclose(P.data, _reference(S, A, B, True), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "make, exc, match",
    [
        (lambda S, A, B: (S, A[:-1], B), ValueError,
         r"'A' parameter of sddmm must have one row per row of S: S is 8×6, so A must be 8×K"),
        (lambda S, A, B: (S, A, B.T.copy()), ValueError, r"B must be 6×K\. Got B of shape "
                                                          r"\(3, 6\) instead; pass B\.T\."),
        (lambda S, A, B: (S, A, B[:4]), ValueError, r"B must be 6×K\. Got B of shape "
                                                    r"\(4, 3\) instead\.$"),
        (lambda S, A, B: (S, A, B[:, :2]), ValueError, r"same number of columns K"),
        (lambda S, A, B: (S.toarray(), A, B), TypeError, r"'S' parameter of sddmm must be a "
                                                          r"scipy or cupyx sparse matrix"),
        (lambda S, A, B: (S, sp.csr_matrix(A), B), TypeError, r"'A' parameter of sddmm must "
                                                                r"be a dense"),
        (lambda S, A, B: (S, A.astype(complex), B), TypeError, r"'A' .* real numbers"),
        (lambda S, A, B: (S, A, np.where(np.arange(B.size).reshape(B.shape) == 7, np.nan, B)),
         ValueError, r"'B' parameter of sddmm holds NaN or infinity \(first at row 2, column 1\)"),
        (lambda S, A, B: (S, np.full_like(A, np.inf), B), ValueError, r"'A' .* NaN or infinity"),
    ],
)
def test_bad_input_is_refused(make, exc, match):
    rng = np.random.default_rng(5)
    S = sp.random(8, 6, density=0.5, format="csr", random_state=rng)
    A, B = rng.standard_normal((8, 3)), rng.standard_normal((6, 3))
    with pytest.raises(exc, match=match):
        mgpu.sddmm(*make(S, A, B))


def test_duplicates_are_refused_and_nan_values_only_with_hadamard():
    A, B = np.ones((3, 2)), np.ones((3, 2))
    D = sp.csr_matrix((np.array([1.0, 2.0, 3.0]), np.array([1, 1, 0]), np.array([0, 2, 2, 3])),
                      shape=(3, 3))
    with pytest.raises(ValueError, match=r"duplicate entries \(row 0, column 1 is stored 2 "
                                         r"times\).*S.sum_duplicates\(\)"):
        mgpu.sddmm(D, A, B)
    N = sp.csr_matrix(np.array([[0.0, np.nan, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match=r"'S' .* NaN or infinity \(row 0, column 1\).*"
                                         r"hadamard=False"):
        mgpu.sddmm(N, A, B)
    assert mgpu.sddmm(N, A, B, hadamard=False).data.tolist() == [2.0, 2.0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_check_finite_false_skips_the_check_and_spreads_nan(xp, dtype):
    """Finite factors: the checked call's numbers. NaN in a row of A or infinity among S's
    values: no error, and exactly the entries they touch are not finite."""
    rng = np.random.default_rng(23)
    S = sp.random(50, 40, density=0.2, format="csr", random_state=23, dtype=dtype)
    A = rng.standard_normal((50, 8)).astype(dtype)
    B = rng.standard_normal((40, 8)).astype(dtype)
    dev = _on(xp, S, A, B)
    ref = _host(mgpu.sddmm(*dev))
    got = _host(mgpu.sddmm(*dev, check_finite=False))
    np.testing.assert_array_equal(got.data, ref.data)
    A[3, 5] = np.nan
    S.data[-1] = np.inf
    got = _host(mgpu.sddmm(*_on(xp, S, A, B), check_finite=False))
    rows = np.repeat(np.arange(50), np.diff(S.indptr))
    bad = (rows == 3) | (np.arange(S.nnz) == S.nnz - 1)
    assert bad.sum() > 1 and not np.isfinite(got.data[bad]).any()
    np.testing.assert_array_equal(got.data[~bad], ref.data[~bad])
    with pytest.raises(ValueError, match=r"'A' .* NaN or infinity \(first at row 3, column 5\)"):
        mgpu.sddmm(*_on(xp, S, A, B))


def test_real_corpus(data_dir):
    from mgpu import io

    S = io.load(str(data_dir / "bow" / "ap.dat.gz")).astype(np.float32)
    rng = np.random.default_rng(6)
    for K in (32, 100):
        A = rng.standard_normal((S.shape[0], K)).astype(np.float32)
        B = rng.standard_normal((S.shape[1], K)).astype(np.float32)
        P = mgpu.sddmm(S, A, B)
        assert _rel_err(P.data, _reference(S, A, B, True)) <= 1e-5


@pytest.mark.gpu
def test_mixed_devices_are_refused():
    import cupy

    S = sp.random(8, 6, density=0.5, format="csr", random_state=0)
    with pytest.raises(ValueError, match=r"must be on one device\. Got S on the CPU "
                                         r"\(csr_matrix\), A on the GPU"):
        mgpu.sddmm(S, cupy.ones((8, 2)), np.ones((6, 2)))


def test_dask_input_without_a_cluster():
    # Runs before the module's cluster starts (file order), so no default client exists.
    rng = np.random.default_rng(8)
    S = powerlaw_csr(2000, 700, 30_000, seed=8)
    A, B = rng.standard_normal((2000, 5)), rng.standard_normal((700, 5))
    Sd = from_scipy(S, 3, axis=1, client=None)
    P = mgpu.sddmm(Sd, A, B).compute(scheduler="sync")
    np.testing.assert_allclose(P.tocsr().data, _reference(S, A, B, True), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_kernel_and_fallback_write_every_element(dtype, monkeypatch):
    import cupy
    import cupyx.scipy.sparse as csp

    from mgpu.backends import cupy as gpu

    rng = np.random.default_rng(9)
    S = _awkward_matrix(rng, m=3000, n=900, density=0.01, dtype=dtype)
    A = rng.standard_normal((S.shape[0], 45)).astype(dtype)
    B = rng.standard_normal((S.shape[1], 45)).astype(dtype)
    Sg, Ag, Bg = csp.csr_matrix(S), cupy.asarray(A), cupy.asarray(B)
    assert gpu.sddmm_is_usable_for(Sg, Ag, Bg)
    _poison_new_float_buffers(monkeypatch)
    ref = _reference(S, A, B, True)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for fn in (gpu.sddmm_kernel, gpu.sddmm_fallback):
        P = fn(Sg, Ag, Bg, True).get()
        assert np.isfinite(P.data).all(), fn.__name__
        assert _rel_err(P.data, ref) <= tol, fn.__name__


@pytest.mark.parametrize("Tj, ti, tile_nnz", [(10_000, 256, 2048), (37, 5, 64), (1, 1, 1)])
def test_tile_layout_covers_every_nonzero_once(Tj, ti, tile_nnz):
    from mgpu.backends.sddmm_plan import tile_layout

    rng = np.random.default_rng(Tj)
    S = _awkward_matrix(rng, m=400, n=300, density=0.05)
    lay = tile_layout(S.indptr, S.indices, S.shape, Tj, ti, tile_nnz)
    starts, n_tiles = lay.tile_start, lay.n_tiles
    assert starts[0] == 0 and starts[-1] == S.nnz and (np.diff(starts) > 0).all()
    assert lay.n_panels == -(-S.shape[1] // Tj)
    sizes = np.diff(starts)
    assert sizes.max() <= tile_nnz
    tile = np.repeat(np.arange(n_tiles), sizes)
    rows = lay.active_rows[lay.tile_row0[tile] + lay.local_row]
    cols = lay.tile_panel[tile].astype(np.int64) * Tj + lay.local_col
    assert (lay.local_row >= 0).all() and (lay.local_row < ti).all()
    assert (lay.local_col >= 0).all() and (lay.local_col < Tj).all()
    # rows ascend within a tile: the kernel reads a tile's active-row count off its last nonzero
    assert all((np.diff(lay.local_row[a:b]) >= 0).all() for a, b in zip(starts[:-1], starts[1:]))
    perm = np.arange(S.nnz) if lay.perm is None else lay.perm
    assert np.array_equal(np.sort(perm), np.arange(S.nnz))
    csr_rows = np.repeat(np.arange(S.shape[0]), np.diff(S.indptr))
    assert np.array_equal(rows, csr_rows[perm]) and np.array_equal(cols, S.indices[perm])


def test_tile_layout_of_an_empty_pattern():
    from mgpu.backends.sddmm_plan import tile_layout

    S = sp.csr_matrix((5, 4), dtype=np.float32)
    lay = tile_layout(S.indptr, S.indices, S.shape, 2, 3)
    assert lay.n_tiles == 0 and lay.tile_start.tolist() == [0]


def test_plan_on_the_cpu_and_plans_that_do_not_fit():
    rng = np.random.default_rng(3)
    S = _awkward_matrix(rng)
    A = rng.standard_normal((S.shape[0], 16))
    B = rng.standard_normal((S.shape[1], 16))
    plan = mgpu.sddmm_plan(S, 16)
    assert plan.scheme == "cpu" and plan.K == 16 and plan.nnz == S.nnz
    assert "scheme cpu" in plan.describe()
    np.testing.assert_array_equal(mgpu.sddmm(S, A, B, plan=plan).data, mgpu.sddmm(S, A, B).data)
    with pytest.raises(ValueError, match=r"made for another problem .* K=16\); got .* K=8"):
        mgpu.sddmm(S, A[:, :8], B[:, :8], plan=plan)
    with pytest.raises(ValueError, match="made for another problem"):
        mgpu.sddmm(S.copy(), A, B, plan=plan)
    with pytest.raises(TypeError, match="must come from mgpu.sddmm_plan"):
        mgpu.sddmm(S, A, B, plan="sm-l2")
    with pytest.raises(ValueError, match="'K' parameter of sddmm_plan must be a positive"):
        mgpu.sddmm_plan(S, 0)
    with pytest.raises(ValueError, match="'scheme' parameter of sddmm_plan must be one of"):
        mgpu.sddmm_plan(S, 4, scheme="fast")
    with pytest.raises(ValueError, match="applies to GPU input only"):
        mgpu.sddmm_plan(S, 4, scheme="csr")


def _poison_new_float_buffers(monkeypatch):
    """Every new floating-point CuPy buffer starts as NaN: an element a kernel skips stays NaN."""
    import cupy

    empty = cupy.empty

    def poisoned_empty(*args, **kwargs):
        out = empty(*args, **kwargs)
        if out.dtype.kind == "f":
            out.fill(np.nan)
        return out

    monkeypatch.setattr(cupy, "empty", poisoned_empty)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("K", [7, 32, 45, 130])
@pytest.mark.parametrize("hadamard", [True, False])
def test_gpu_schemes_match_reference(dtype, K, hadamard, monkeypatch):
    """Each kernel, with sizes small enough that panels, K-slices and tile splits all occur."""
    import cupy
    import cupyx.scipy.sparse as csp

    from mgpu.backends import cupy as gpu
    from mgpu.backends.sddmm_plan import tile_layout

    rng = np.random.default_rng(K)
    S = _awkward_matrix(rng, m=700, n=500, density=0.02, dtype=dtype)
    dense = sp.random(90, 70, density=0.4, format="csr", random_state=rng, dtype=dtype)
    _poison_new_float_buffers(monkeypatch)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    # shared memory per block: ti (+ Tj for sm-sm) rows of Tk elements, at most 40 KiB here
    for T, scheme, Tj, ti, tk in [(S, "csr", 0, 0, 0), (S, "sm-l2", 500, 64, 64),
                                  (S, "sm-l2", 37, 5, 32), (dense, "sm-sm", 16, 8, 32),
                                  (dense, "sm-sm", 40, 40, 64)]:
        A = rng.standard_normal((T.shape[0], K)).astype(dtype)
        B = rng.standard_normal((T.shape[1], K)).astype(dtype)
        Sg, Ag, Bg = csp.csr_matrix(T), cupy.asarray(A), cupy.asarray(B)
        out = cupy.empty(T.nnz, dtype=dtype)
        if scheme == "csr":
            gpu.run_csr(Sg, Ag, Bg, hadamard, out)
        else:
            lay = tile_layout(Sg.indptr, Sg.indices, Sg.shape, Tj, ti, tile_nnz=200)
            gpu.run_tiled(Sg, Ag, Bg, hadamard, lay, scheme, tk, out)
        got = out.get()
        label = f"{scheme} Tj={Tj} ti={ti} Tk={tk}"
        assert np.isfinite(got).all(), label
        assert _rel_err(got, _reference(T, A, B, hadamard)) <= tol, label


@pytest.mark.gpu
def test_gpu_plan_is_tuned_reused_and_tied_to_its_matrix(data_dir):
    import cupy
    import cupyx.scipy.sparse as csp

    from mgpu import io

    S = io.load(str(data_dir / "bow" / "ap.dat.gz")).astype(np.float32)
    rng = np.random.default_rng(11)
    Sg = csp.csr_matrix(S)
    for K in (32, 100):
        plan = mgpu.sddmm_plan(Sg, K)
        assert plan.scheme in ("csr", "sm-l2") and plan.K == K and plan.device != "cpu"
        assert plan.l2_bytes > 0 and plan.smem_bytes > 0 and plan.timings_ms
        assert plan.scheme == "csr" or (plan.Tk % 32 == 0 and plan.Tj >= 32)
        for _ in range(2):  # new factors, the same plan
            A = rng.standard_normal((S.shape[0], K)).astype(np.float32)
            B = rng.standard_normal((S.shape[1], K)).astype(np.float32)
            P = mgpu.sddmm(Sg, cupy.asarray(A), cupy.asarray(B), plan=plan)
            assert _rel_err(P.data.get(), _reference(S, A, B, True)) <= 1e-5
        for scheme in ("csr", "sm-l2"):
            forced = mgpu.sddmm_plan(Sg, K, scheme=scheme)
            assert forced.scheme == scheme and not forced.timings_ms
            P = mgpu.sddmm(Sg, cupy.asarray(A), cupy.asarray(B), plan=forced)
            assert _rel_err(P.data.get(), _reference(S, A, B, True)) <= 1e-5
    with pytest.raises(ValueError, match="does not apply"):
        mgpu.sddmm_plan(Sg, 32, scheme="sm-sm")
    with pytest.raises(ValueError, match="made for another problem"):
        mgpu.sddmm(csp.csr_matrix(S), cupy.asarray(A), cupy.asarray(B), plan=plan)
    with pytest.raises(ValueError, match="was made for the GPU, but S is on the CPU"):
        mgpu.sddmm(S, A, B, plan=plan)


# ----------------------------------------------------------------------------- distributed


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(7)
    S = powerlaw_csr(4000, 1500, 80_000, seed=7)
    A = rng.standard_normal((4000, 24)).astype(np.float32)
    B = rng.standard_normal((1500, 24)).astype(np.float32)
    return S, A, B


@pytest.mark.parametrize("axis, parts", [(1, 2), (1, 5), (0, 3)])
def test_distributed_matches_one_device(client, problem, axis, parts):
    S, A, B = problem
    Sd = from_scipy(S, parts, axis=axis, client=client)
    P = mgpu.sddmm(Sd, A, B)
    assert P.chunks == Sd.chunks and P.name.startswith("mgpu-sddmm-")
    got = gather(P)
    assert np.array_equal(got.indptr, S.indptr) and np.array_equal(got.indices, S.indices)
    np.testing.assert_allclose(got.data, _reference(S, A, B, True), rtol=1e-5, atol=1e-5)


def test_distributed_with_dask_factors_and_repeated_calls(client, problem):
    import dask.array as da

    S, A, B = problem
    Sd = from_scipy(S, 4, axis=1, client=client)
    placed = chunk_workers(Sd, client)
    for step in range(3):
        Ad = da.from_array(A * (step + 1), chunks=(1000, 24))
        P = mgpu.sddmm(Sd, Ad, B, hadamard=False)
        np.testing.assert_allclose(gather(P).data, (step + 1) * _reference(S, A, B, False),
                                   rtol=1e-5, atol=1e-4)
    assert chunk_workers(Sd, client) == placed  # S did not move


def test_distributed_bad_input(client, problem):
    import dask.array as da

    S, A, B = problem
    Sd = from_scipy(S, 2, axis=1, client=client)
    with pytest.raises(ValueError, match="must have one row per row of S"):
        mgpu.sddmm(Sd, A[:10], B)
    bad = A.copy()
    bad[3, 4] = np.nan
    with pytest.raises(ValueError, match=r"'A' .* NaN or infinity \(first at row 3, column 4\)"):
        mgpu.sddmm(Sd, bad, B)
    # A dask factor is only seen by the tasks: they fail with the same message.
    with pytest.raises(ValueError, match=r"'A' .* NaN or infinity"):
        mgpu.sddmm(Sd, da.from_array(bad, chunks=(2000, 24)), B).compute()
    # check_finite=False: neither the client nor the tasks look; NaN reaches row 3 only
    ref = gather(mgpu.sddmm(Sd, A, B)).tocsr()
    for factor in (bad, da.from_array(bad, chunks=(2000, 24))):
        got = gather(mgpu.sddmm(Sd, factor, B, check_finite=False)).tocsr()
        row3 = np.repeat(np.arange(S.shape[0]), np.diff(got.indptr)) == 3
        assert row3.any() and np.isnan(got.data[row3]).all()
        np.testing.assert_array_equal(got.data[~row3], ref.data[~row3])


def test_placed_factors_stay_on_their_workers_across_calls(client, problem):
    from mgpu.distributed import place_factors

    S, A, B = problem
    Sd = from_scipy(S, 4, axis=1, client=client)
    A_d, B_d = place_factors(Sd, A, B, client=client)
    assert A_d.chunks == (Sd.chunks[0], (24,)) and B_d.chunks == (Sd.chunks[1], (24,))
    where = chunk_workers(B_d, client)
    for (j, _), holders in where.items():  # each piece of B sits with its column tile of S
        assert set(holders) <= set(chunk_workers(Sd, client)[(0, j)])
    ref = _reference(S, A, B, True)
    for _ in range(2):
        np.testing.assert_allclose(gather(mgpu.sddmm(Sd, A_d, B_d)).data, ref, rtol=1e-5,
                                   atol=1e-5)
    with pytest.raises(TypeError, match="'S' parameter of place_factors must be a dask array"):
        place_factors(S, A, B, client=client)
    with pytest.raises(TypeError, match="'A' parameter of place_factors must be a numpy"):
        place_factors(Sd, A_d, B, client=client)
    bad = B.copy()
    bad[3, 2] = np.inf
    with pytest.raises(ValueError, match=r"'B' parameter of sddmm holds NaN or infinity "
                                         r"\(first at row 3, column 2\)"):
        place_factors(Sd, A, bad, client=client)
