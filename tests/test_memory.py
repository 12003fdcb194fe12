"""Memory budgets. On the CPU: kNN's batches hold no more than their working memory beyond the
inputs, for every metric, where the unbatched distances would be ten times the budget; a
budget that cannot hold one query is refused with the numbers before any work; SDDMM never
forms the dense product; an SDDMM streamed through a device in tiles gives the direct
product whatever the cut. On the GPU (CuPy's memory pool, with a limit standing for a
smaller device): the same promises, operands larger than the device streamed, and what does
not fit refused with the numbers before anything is allocated, never CUDA's out-of-memory
error.

CPU peaks are tracemalloc's, which sees NumPy's allocations (every array of these paths).
GPU peaks are the bytes CuPy's pool holds after the call, emptied before it: the pool keeps
every block it was handed, so that is at least the peak of the call's live arrays."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

import mgpu
from mgpu.backends.memory import DeviceMemoryError
from mgpu.ops.distances import SEMIRINGS
from mgpu.ops.sddmm_stream import HostDevice, plan_stream, sddmm_streamed
from mgpu.backends.numpy_knn import nbytes


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


@pytest.mark.parametrize("order", ["C", "F"])
def test_the_finite_check_of_a_factor_makes_no_mask_of_its_size_and_finds_the_first(
        order, monkeypatch):
    import mgpu.backends.finite as validate

    monkeypatch.setattr(validate, "_FINITE_CHUNK", 1000)
    rng = np.random.default_rng(5)
    A = np.asarray(rng.standard_normal((4000, 40)), order=order)
    B = rng.standard_normal((30, 40))
    S = sp.csr_matrix((np.ones(2), ([3, 3999], [0, 29])), shape=(4000, 30))
    ok, peak = _peak(lambda: validate.all_finite(A))
    assert ok and peak < A.nbytes / 40, (peak, A.nbytes)  # a bool mask of A is an eighth
    A[3999, 7] = np.inf
    A[3100, 39] = np.nan
    with pytest.raises(ValueError, match=r"'A' parameter of sddmm.*first at row 3100, "
                                         r"column 39"):
        mgpu.sddmm(S, A, B)
    assert validate.first_nonfinite(A) == (3100, 39)
    assert validate.first_nonfinite(A[:3000]) is None
    assert validate.first_nonfinite(A[:, :30]) == (3999, 7)
    assert validate.first_nonfinite(A[::2]) == (1550, 39)
    v = np.ones(2500)
    v[[2400, 2300]] = -np.inf
    assert validate.first_nonfinite(v) == (2300,)
    big = np.ones((1100, 1000), order=order)  # past _PARALLEL_SCAN: counted on every core
    assert validate.first_nonfinite(big) is None
    big[1099, 3], big[1000, 999] = np.nan, -np.inf
    assert validate.first_nonfinite(big) == (1000, 999)
    half = np.ones((1100, 1000), np.float16, order=order)  # a dtype numba does not take
    half[7, 9] = np.nan
    assert validate.first_nonfinite(half) == (7, 9)
    C = sp.csr_matrix(([1.0, np.nan, np.inf], [5, 2, 9], [0, 0, 1, 3]), shape=(3, 10))
    assert validate.first_nonfinite(C) == (2, 2)


# ------------------------------------------------------------------ SDDMM streamed in tiles


def _sddmm_reference(S, A, B, hadamard=True):
    """float64 S ∘ (A Bᵀ) at S's nonzeros, in CSR order."""
    C = sp.csr_matrix(S)
    rows = np.repeat(np.arange(C.shape[0]), np.diff(C.indptr))
    v = np.einsum("ij,ij->i", A[rows].astype(np.float64), B[C.indices].astype(np.float64))
    return v * C.data if hadamard else v


def _streaming_case(m=400, n=300, k=12, density=0.04, seed=0):
    rng = np.random.default_rng(seed)
    S = sp.random(m, n, density=density, random_state=rng, format="csr")
    S = sp.csr_matrix(S.multiply(sp.csr_matrix((np.arange(m) % 7 != 3).astype(float)[:, None])))
    S.sort_indices()  # rows 3, 10, ... empty
    return S, rng.standard_normal((m, k)), rng.standard_normal((n, k))


@pytest.mark.parametrize("panels", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("hadamard", [True, False])
def test_streamed_sddmm_gives_the_direct_product_whatever_the_cut(panels, dtype, hadamard):
    S, A, B = _streaming_case()
    S, A, B = S.astype(dtype), A.astype(dtype), B.astype(dtype)
    budget = 2 * -(-B.nbytes // panels)  # B's panels take half
    plan = plan_stream(S.indptr, S.shape[1], A.shape[1], np.dtype(dtype).itemsize, budget)
    assert len(plan.panels) == panels and len(plan.blocks) > 1
    assert plan.panel_bytes + plan.block_bytes <= budget
    done = []
    P = sddmm_streamed(S, A, B, hadamard, dtype, plan, HostDevice(), progress=done.append)
    direct = mgpu.sddmm(S, A, B, hadamard=hadamard)
    assert P.dtype == direct.dtype == dtype
    np.testing.assert_array_equal(P.indptr, S.indptr)
    np.testing.assert_array_equal(P.indices, S.indices)
    np.testing.assert_array_equal(P.data, direct.data)  # the same products, tile or not
    eps = np.finfo(dtype).eps
    np.testing.assert_allclose(P.data, _sddmm_reference(S, A, B, hadamard),
                               rtol=0, atol=40 * eps * np.abs(A).max() * np.abs(B).max() * 12)
    assert sum(done) == S.nnz and len(done) == plan.tiles


def test_streaming_plan_counts_what_a_tile_holds():
    indptr = np.array([0, 2, 4, 6, 8])  # four rows of two
    plan = plan_stream(indptr, 10, 4, 4, budget=500)
    # B whole (160 B); a row is A's 16 B + 4 B of indptr + 2 × (4 + 4 + 4) B = 44 B
    assert plan.panels == ((0, 10),) and plan.panel_bytes == 160
    assert plan.blocks == ((0, 4),) and plan.block_bytes == 176
    plan = plan_stream(indptr, 10, 4, 4, budget=250)
    assert plan.panels == ((0, 5), (5, 10)) and plan.panel_bytes == 80
    assert plan.blocks == ((0, 3), (3, 4))  # 170 B of room: three rows of 44 B
    # a block's nonzeros stay below 2^31 (int32 row pointers), whatever the budget
    huge = np.array([0, 2**30, 2**31, 3 * 2**30, 3 * 2**30 + 5], dtype=np.int64)
    assert plan_stream(huge, 1000, 4, 4, budget=1 << 45).blocks == ((0, 1), (1, 2), (2, 4))
    # nothing to cut
    assert plan_stream(np.array([0]), 0, 4, 4, budget=100).tiles == 1


def test_a_row_too_large_for_the_stream_is_refused_before_any_copy():
    S, A, B = _streaming_case()
    row = int(np.diff(S.indptr).argmax())
    # no device is asked for anything: the refusal comes from the sizes (runs without a GPU)
    with pytest.raises(DeviceMemoryError, match=rf"row {row} of S \(\d+ nonzeros\) with its row "
                       r"of A needs [\d.]+ [kKMG]?i?B on the device beside a panel of B "
                       r"\([\d.]+ [kKMG]?i?B\); the budget is 1\.00 kiB"):
        mgpu.sddmm(S, A, B, device="gpu", working_memory=1024)
    assert issubclass(DeviceMemoryError, MemoryError)


def test_streaming_parameters_are_checked_before_any_work():
    S, A, B = _streaming_case()
    with pytest.raises(ValueError, match=r"'device' parameter of sddmm must be a str among "
                       r"\{'cpu', 'gpu'\} or None\. Got 'tpu'"):
        mgpu.sddmm(S, A, B, device="tpu")
    with pytest.raises(ValueError, match="streamed through the GPU"):
        mgpu.sddmm(S, A, B, working_memory="1 GiB")
    with pytest.raises(ValueError, match="'plan' parameter of sddmm does not apply"):
        mgpu.sddmm(S, A, B, device="gpu", working_memory="1 GiB", plan=mgpu.sddmm_plan(S, 12))
    np.testing.assert_array_equal(mgpu.sddmm(S, A, B, device="cpu").data,
                                  mgpu.sddmm(S, A, B).data)


# ------------------------------------------------------------------------------- on the GPU


@pytest.fixture
def gpu_pool():
    """CuPy's default pool, emptied, with the limit a test sets lifted afterwards."""
    import cupy

    pool = cupy.get_default_memory_pool()
    cupy.cuda.Device().synchronize()
    pool.free_all_blocks()
    yield pool
    cupy.cuda.Device().synchronize()
    pool.set_limit(size=0)
    pool.free_all_blocks()


@pytest.mark.gpu
def test_gpu_streamed_sddmm_of_operands_ten_times_the_device(gpu_pool):
    rng = np.random.default_rng(11)
    m, n, k = 60_000, 50_000, 128
    S = sp.random(m, n, density=4e-4, random_state=rng, format="csr", dtype=np.float32)
    A = rng.standard_normal((m, k), dtype=np.float32)
    B = rng.standard_normal((n, k), dtype=np.float32)
    inputs = A.nbytes + B.nbytes + S.data.nbytes + S.indices.nbytes + S.indptr.nbytes
    limit = inputs // 10  # the device stands at a tenth of the operands
    gpu_pool.set_limit(size=limit)
    done = []
    P = mgpu.sddmm(S, A, B, device="gpu", progress=done.append)
    assert gpu_pool.total_bytes() <= limit
    assert isinstance(P, sp.csr_matrix) and P.dtype == np.float32 and sum(done) == S.nnz
    ref = _sddmm_reference(S, A, B)
    scale = np.abs(S.data)[:, None].max() * np.abs(A).max() * np.abs(B).max()
    np.testing.assert_allclose(P.data, ref, rtol=0, atol=k * 4 * np.finfo(np.float32).eps * scale)
    # the device's own product on the whole problem, once the limit is lifted: the same values
    gpu_pool.set_limit(size=0)
    import cupy
    import cupyx.scipy.sparse as csp

    whole = mgpu.sddmm(csp.csr_matrix(S), cupy.asarray(A), cupy.asarray(B))
    np.testing.assert_array_equal(whole.data.get(), P.data)


@pytest.mark.gpu
def test_gpu_copies_through_the_pinned_buffers_arrive_whole(gpu_pool):
    """Pieces that cut values in two, both buffers reused many times, and the tiles of a
    streamed SDDMM through them: the same values as the CPU backend's tiles."""
    from mgpu.ops.sddmm_stream import GpuDevice

    device = GpuDevice(piece_bytes=100_003)
    rng = np.random.default_rng(13)
    for X in (rng.standard_normal((1_234, 567)), rng.integers(0, 2**31, 300_001).astype(np.int32),
              np.asfortranarray(rng.standard_normal((999, 77), dtype=np.float32)),
              np.empty((0, 4)), np.ones(1, np.float32)):
        got = device.put(X)
        assert got.dtype == X.dtype and got.shape == X.shape
        np.testing.assert_array_equal(got.get(), X)
    S, A, B = _streaming_case(m=3000, n=2000, k=24, density=0.02, seed=2)
    A, B = A.astype(np.float32), B.astype(np.float32)
    plan = plan_stream(S.indptr, S.shape[1], 24, 4, budget=300_000)
    assert len(plan.panels) > 1 and len(plan.blocks) > 1
    P = sddmm_streamed(S, A, B, True, np.float32, plan, device)
    Q = sddmm_streamed(S, A, B, True, np.float32, plan, HostDevice())
    np.testing.assert_allclose(P.data, Q.data, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(P.data, _sddmm_reference(S, A, B), rtol=1e-4, atol=1e-4)
    assert device.seconds["to device"] > 0 and device.seconds["kernel and back"] > 0


@pytest.mark.gpu
def test_gpu_sddmm_that_does_not_fit_is_refused_with_the_numbers(gpu_pool):
    import cupy
    import cupyx.scipy.sparse as csp

    rng = np.random.default_rng(12)
    S = csp.csr_matrix(sp.random(50_000, 40_000, density=1e-3, random_state=rng, format="csr",
                                 dtype=np.float32))
    A = cupy.asarray(rng.standard_normal((50_000, 32), dtype=np.float32))
    B = cupy.asarray(rng.standard_normal((40_000, 32), dtype=np.float32))
    held = gpu_pool.used_bytes()
    gpu_pool.set_limit(size=held + S.nnz * 4)  # room for P's values, not its indices
    with pytest.raises(DeviceMemoryError, match=r"SDDMM of a 50000×40000 S with 2,000,000 "
                       r"nonzeros and K=32 \(float32\) needs 15\.\d\d MiB of GPU memory on "
                       r"device \d; 7\.\d\d MiB of its [\d.]+ MiB are available\. Pass host"):
        mgpu.sddmm(S, A, B)
    assert gpu_pool.used_bytes() == held  # nothing was allocated, nothing was lost
    gpu_pool.set_limit(size=0)
    P = mgpu.sddmm(S, A, B)
    np.testing.assert_allclose(P.data.get(), _sddmm_reference(S.get(), A.get(), B.get()),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_gpu_sddmm_never_forms_the_dense_product_nor_a_layout_it_cannot_hold(gpu_pool):
    import cupy
    import cupyx.scipy.sparse as csp

    from mgpu.backends.cupy import LAYOUT_BYTES_PER_NZ, product_bytes
    from mgpu.backends.sddmm_plan import tile_layout

    rng = np.random.default_rng(13)
    m, n, k = 40_000, 40_000, 64
    S = csp.csr_matrix(sp.random(m, n, density=1e-3, random_state=rng, format="csr",
                                 dtype=np.float32))
    A = cupy.asarray(rng.standard_normal((m, k), dtype=np.float32))
    B = cupy.asarray(rng.standard_normal((n, k), dtype=np.float32))
    base = gpu_pool.total_bytes()
    # the tiled layout's build stays within the bytes per nonzero the planner counts
    for tj, ti in ((4096, 64), (40_000, 256)):
        gpu_pool.free_all_blocks()
        lay = tile_layout(S.indptr, S.indices, S.shape, tj, ti)
        cupy.cuda.Device().synchronize()
        assert gpu_pool.total_bytes() - base <= LAYOUT_BYTES_PER_NZ * S.nnz, (tj, ti)
        del lay
    gpu_pool.free_all_blocks()
    P = mgpu.sddmm(S, A, B)  # tunes (layouts built and dropped), then runs
    cupy.cuda.Device().synchronize()
    grown = gpu_pool.total_bytes() - base
    assert grown <= 2 * product_bytes(S, np.float32) + LAYOUT_BYTES_PER_NZ * S.nnz
    assert grown < m * n * 4 // 10  # nothing of m × n
    np.testing.assert_allclose(P.data.get(), _sddmm_reference(S.get(), A.get(), B.get()),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("metric", ["euclidean", "cosine", "jaccard", "manhattan"])
def test_gpu_knn_stays_within_its_working_memory_and_the_device(gpu_pool, metric):
    import cupy
    import cupyx.scipy.sparse as csp

    X, Q = _inputs("sparse", metric, 20_000, 3000, 400, 0.02)
    Xg, Qg = csp.csr_matrix(X.astype(np.float32)), csp.csr_matrix(Q.astype(np.float32))
    budget = 20_000 * 3000 * 12 // 10  # the unbatched distances and ids: ten budgets
    d1, i1 = mgpu.knn(Xg, Qg, 10, metric=metric, working_memory=1 << 40)
    cupy.cuda.Device().synchronize()
    gpu_pool.free_all_blocks()
    base = gpu_pool.total_bytes()
    d, i = mgpu.knn(Xg, Qg, 10, metric=metric, working_memory=budget)
    cupy.cuda.Device().synchronize()
    copies = 2 * sum(Z.data.nbytes + Z.indices.nbytes + Z.indptr.nbytes for Z in (Xg, Qg))
    results = 3000 * 10 * (4 + 8) + (20_000 + 3000) * 12
    assert gpu_pool.total_bytes() - base <= budget + copies + results
    np.testing.assert_array_equal(i.get(), i1.get())
    # a device with room for less than the budget: batches shrink to what it has
    held = gpu_pool.used_bytes()
    gpu_pool.set_limit(size=held + copies + results + budget // 4)
    d2, i2 = mgpu.knn(Xg, Qg, 10, metric=metric, working_memory=budget)
    np.testing.assert_array_equal(i2.get(), i1.get())
    np.testing.assert_allclose(d2.get(), d1.get(), rtol=1e-5, atol=1e-6)
    # and one with no room for the index's copies, or for a single query beside them, is
    # refused with the numbers
    gpu_pool.set_limit(size=held + copies + results)
    with pytest.raises(DeviceMemoryError, match=r"kNN (index of 20,000×400 \(\w+\)|of 3,000 "
                       r"queries \(k=10\) against a 20,000×400 index) needs [\d.]+ [kMG]?i?B "
                       r"of GPU (working )?memory.* [\d.]+ [kMG]?i?B (of its [\d.]+ [kMG]?i?B )?"
                       r"are available"):
        mgpu.knn(Xg, Qg, 10, metric=metric, working_memory=budget)


@pytest.mark.gpu
def test_gpu_spmm_whose_carries_do_not_fit_is_refused_with_the_numbers(gpu_pool):
    import cupy
    import cupyx.scipy.sparse as csp

    from mgpu.synthetic import band_csr

    A = csp.csr_matrix(band_csr(100_000, 11))
    X = cupy.ones((100_000, 64), dtype=np.float32)
    held = gpu_pool.used_bytes()
    gpu_pool.set_limit(size=held + 100_000 * 64 * 4 + (1 << 20))  # Y and the flag, no carries
    with pytest.raises(DeviceMemoryError, match=r"SpMM of a 100,000×100,000 A with "
                       rf"{A.nnz:,} nonzeros by 64 columns needs [\d.]+ MiB of GPU memory"):
        mgpu.spmm(A, X)
    gpu_pool.set_limit(size=0)
    np.testing.assert_allclose(mgpu.spmm(A, X).get(), np.repeat(
        np.asarray(A.get().sum(axis=1)), 64, axis=1), rtol=1e-5)
