"""The CPU SpGEMM and SpAdd (mgpu.backends.numpy_spgemm) through their lookups, against scipy.

Integer-valued inputs make every sum exact, so the result must be scipy's bit for bit,
pattern included (sums that cancel to zero are not stored). Real values with adversarial
magnitudes are checked against scipy's float64 product. The inputs are CSR as scipy allows
it: unsorted, with duplicates, int32 or int64 indices, empty rows, zero dimensions.
"""
from __future__ import annotations

from contextlib import nullcontext
from unittest import mock

import numba
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import mgpu.backends.numpy_spgemm as host
from mgpu.backends import spadd_lookup, spgemm_lookup
from mgpu.synthetic import powerlaw_csr

FUZZ = settings(max_examples=40, deadline=None)


# ------------------------------------------------------------------------------ helpers
def _raw_csr(rng, m: int, n: int, *, density: float, dtype=np.float64, index=np.int32,
             messy: bool = True, values: str = "int", empty_rows: float = 0.0,
             ) -> sp.csr_matrix:
    """An m × n CSR matrix kept exactly as built: with ``messy``, the columns of a row in
    random order and about one in four repeated (scipy sums duplicates); ``index`` the dtype
    of indices and indptr; ``values`` "int" (integers in [-3, 3], zero included, so sums
    cancel to exactly zero), "wild" (float64 magnitudes from subnormal to near overflow) or
    "wild32" (the same within float32's range)."""
    lengths = rng.binomial(n, density, size=m) if n else np.zeros(m, dtype=np.int64)
    lengths[rng.random(m) < empty_rows] = 0
    cols = []
    for length in lengths:
        if messy:
            c = rng.integers(0, n, size=length) if n else np.zeros(0, np.int64)
            dup = c[rng.random(length) < 0.25]
            c = np.concatenate([c, dup])
            rng.shuffle(c)
        else:
            c = np.sort(rng.choice(n, size=length, replace=False))
        cols.append(c)
    indptr = np.concatenate([[0], np.cumsum([len(c) for c in cols])]).astype(np.int64)
    indices = np.concatenate(cols).astype(np.int64) if cols else np.zeros(0, np.int64)
    data = _values(rng, len(indices), values)
    A = sp.csr_matrix((data.astype(dtype), indices, indptr), shape=(m, n))
    # set afterwards: the constructor narrows int64 arrays whose contents fit int32
    A.indices, A.indptr = indices.astype(index), indptr.astype(index)
    return A


def _values(rng, size: int, kind: str) -> np.ndarray:
    if kind == "int":
        return rng.integers(-3, 4, size=size).astype(np.float64)
    if kind == "wild":  # products overflow to inf, underflow to subnormals or zero
        table = np.array([1e-300, 1e300, 1.0, -1.0, 5e-324, -2.5e-310, 3.5, -1e155, 7e-170])
        v = rng.standard_normal(size)
        pick = rng.random(size) < 0.6
        v[pick] = rng.choice(table, size=int(pick.sum()))
        return v
    if kind == "wild32":  # within float32's range, products too; subnormals included
        table = np.array([1e-20, 1e15, 1.0, -1.0, 1e-40, -3e-39, 3.5, -2e12])
        v = rng.standard_normal(size)
        pick = rng.random(size) < 0.6
        v[pick] = rng.choice(table, size=int(pick.sum()))
        return v
    raise ValueError(kind)


def _canonical(M) -> sp.csr_matrix:
    """scipy's result in canonical form: a copy, duplicates summed, zeros dropped, sorted."""
    M = sp.csr_matrix(M, copy=True)
    M.sum_duplicates()
    M.eliminate_zeros()
    M.sort_indices()
    return M


def _assert_canonical(C, shape, dtype) -> None:
    """C is a canonical CSR matrix of this shape and dtype, says so, and its index dtype
    is the narrowest that holds it."""
    assert isinstance(C, sp.csr_matrix)
    assert C.shape == shape
    assert C.dtype == dtype
    assert C.indptr.shape == (shape[0] + 1,) and C.indptr[0] == 0
    assert C.indptr[-1] == len(C.indices) == len(C.data)
    assert C.indices.dtype == C.indptr.dtype == host.output_index_dtype(C.nnz, shape)
    assert np.all(C.data != 0), "an exact zero is stored"
    rows = np.repeat(np.arange(shape[0]), np.diff(C.indptr))
    same_row = rows[1:] == rows[:-1]
    assert np.all(np.diff(C.indices.astype(np.int64))[same_row] > 0), "unsorted or duplicate"
    assert np.all((C.indices >= 0) & (C.indices < max(shape[1], 1)))
    assert C.has_sorted_indices and C.has_canonical_format


def _assert_same(C, R) -> None:
    """C equals scipy's R exactly: pattern and values, R canonicalised first."""
    R = _canonical(R)
    _assert_canonical(C, R.shape, R.dtype)
    np.testing.assert_array_equal(C.indptr, R.indptr)
    np.testing.assert_array_equal(C.indices, R.indices)
    np.testing.assert_array_equal(C.data, R.data)


def _pattern(M, dtype=np.float64) -> sp.csr_matrix:
    """M's stored positions as ones of ``dtype`` (stored zeros included)."""
    P = sp.csr_matrix(M, dtype=dtype, copy=True)
    P.data[:] = 1
    return P


def _chunks(many: bool):
    """With ``many``, a chunk as small as the accumulator allows, so that even a small
    product runs in many chunks (each with its own accumulator and row tags)."""
    return mock.patch.object(host, "_MIN_CHUNK_COST", 1) if many else nullcontext()


_dims = st.integers(0, 24)
_index = st.sampled_from([np.int32, np.int64])
_dtype = st.sampled_from([np.float32, np.float64])


# -------------------------------------------------------------------- exact, integer data
@FUZZ
@given(seed=st.integers(0, 2**32 - 1), m=_dims, k=_dims, n=_dims, dtype=_dtype,
       a_index=_index, b_index=_index, messy=st.booleans(), many=st.booleans(),
       density=st.sampled_from([0.05, 0.2, 0.6]))
def test_spgemm_is_scipys_product_exactly(seed, m, k, n, dtype, a_index, b_index, messy,
                                          many, density):
    rng = np.random.default_rng(seed)
    A = _raw_csr(rng, m, k, density=density, dtype=dtype, index=a_index, messy=messy,
                 empty_rows=0.2)
    B = _raw_csr(rng, k, n, density=density, dtype=dtype, index=b_index, messy=messy,
                 empty_rows=0.2)
    kept = [x.copy() for x in (A.data, A.indices, A.indptr, B.data, B.indices, B.indptr)]
    with _chunks(many):
        C = spgemm_lookup(A, B, None)
    _assert_same(C, A @ B)
    for before, after in zip(kept, (A.data, A.indices, A.indptr, B.data, B.indices,
                                    B.indptr)):
        np.testing.assert_array_equal(before, after)  # the inputs are left as they were


@FUZZ
@given(seed=st.integers(0, 2**32 - 1), m=_dims, k=_dims, n=_dims, dtype=_dtype,
       index=_index, mask_index=_index, many=st.booleans(),
       mask_density=st.sampled_from([0.0, 0.1, 0.5, 1.0]))
def test_masked_spgemm_is_scipys_product_on_the_mask_exactly(seed, m, k, n, dtype, index,
                                                             mask_index, many,
                                                             mask_density):
    rng = np.random.default_rng(seed)
    A = _raw_csr(rng, m, k, density=0.3, dtype=dtype, index=index, empty_rows=0.2)
    B = _raw_csr(rng, k, n, density=0.3, dtype=dtype, index=index, empty_rows=0.2)
    mask = _raw_csr(rng, m, n, density=mask_density, index=mask_index, messy=False)
    mask.data[::3] = 0  # only the pattern counts, stored zeros too
    with _chunks(many):
        C = spgemm_lookup(A, B, mask)
    _assert_same(C, (A @ B).multiply(_pattern(mask, dtype)))
    assert C.multiply(_pattern(mask, dtype)).nnz == C.nnz  # nothing off the mask


@FUZZ
@given(seed=st.integers(0, 2**32 - 1), m=_dims, n=_dims, dtype=_dtype, a_index=_index,
       b_index=_index, many=st.booleans(),
       alpha=st.sampled_from([1.0, -1.0, 2.0, 0.5, 0.0, -3.0, 0.1]),
       beta=st.sampled_from([1.0, -1.0, 2.0, 0.5, 0.0, -3.0, 0.1]))
def test_spadd_is_scipys_sum_exactly(seed, m, n, dtype, a_index, b_index, many, alpha, beta):
    rng = np.random.default_rng(seed)
    A = _raw_csr(rng, m, n, density=0.3, dtype=dtype, index=a_index, empty_rows=0.2)
    B = _raw_csr(rng, m, n, density=0.3, dtype=dtype, index=b_index, empty_rows=0.2)
    with _chunks(many):
        C = spadd_lookup(A, B, alpha, beta)
    _assert_same(C, alpha * A + beta * B)


@FUZZ
@given(seed=st.integers(0, 2**32 - 1), m=_dims, n=st.integers(0, 60), dtype=_dtype,
       alpha=st.sampled_from([1.0, -1.0, 2.0, 0.1, -3.0]),
       beta=st.sampled_from([1.0, -1.0, 0.5, 0.1, 7.0]))
def test_spadd_with_extreme_magnitudes_is_scipys_sum_bit_for_bit(seed, m, n, dtype, alpha,
                                                                 beta):
    # Each value is scaled (one rounding), then a column's duplicates are added in storage
    # order and the two sides summed, exactly as scipy does; no step can fuse or reorder,
    # so even overflowing, subnormal and long-duplicated real sums agree to the bit.
    rng = np.random.default_rng(seed)
    kind = "wild" if dtype == np.float64 else "wild32"
    A = _raw_csr(rng, m, n, density=0.6, dtype=dtype, values=kind)
    B = _raw_csr(rng, m, n, density=0.6, dtype=dtype, values=kind)
    C = spadd_lookup(A, B, alpha, beta)
    with np.errstate(over="ignore", invalid="ignore"):
        R = alpha * A + beta * B
    _assert_same(C, R)


def test_spadd_of_a_matrix_and_its_negative_reordered_is_empty():
    rng = np.random.default_rng(7)
    A = _raw_csr(rng, 50, 40, density=0.3)
    # the same entries, each row's storage order reversed
    B = sp.csr_matrix((A.data.copy(), A.indices.copy(), A.indptr.copy()), shape=A.shape)
    for i in range(A.shape[0]):
        lo, hi = A.indptr[i], A.indptr[i + 1]
        B.indices[lo:hi], B.data[lo:hi] = A.indices[lo:hi][::-1], A.data[lo:hi][::-1]
    C = spadd_lookup(A, B, 1.0, -1.0)
    _assert_canonical(C, A.shape, A.dtype)
    assert C.nnz == 0 and _canonical(A).nnz > 0
    _assert_same(spadd_lookup(A, B, 2.0, -1.0), _canonical(A))


def test_products_that_cancel_are_not_stored():
    A = sp.csr_matrix(np.array([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]]))
    B = sp.csr_matrix(np.array([[1.0, 2.0, 5.0], [-1.0, -2.0, 0.0]]))
    C = spgemm_lookup(A, B, None)
    _assert_canonical(C, (3, 3), np.float64)
    np.testing.assert_array_equal(C.indptr, [0, 1, 4, 4])
    np.testing.assert_array_equal(C.indices, [2, 0, 1, 2])
    np.testing.assert_array_equal(C.data, [5.0, 1.0, 2.0, 5.0])


# ------------------------------------------------------- real values, extreme magnitudes
@FUZZ
@given(seed=st.integers(0, 2**32 - 1), m=_dims, k=_dims, n=_dims, many=st.booleans())
def test_spgemm_float64_with_extreme_magnitudes(seed, m, k, n, many):
    rng = np.random.default_rng(seed)
    A = _raw_csr(rng, m, k, density=0.4, values="wild")
    B = _raw_csr(rng, k, n, density=0.4, values="wild")
    with _chunks(many):
        C = spgemm_lookup(A, B, None)
    R = _canonical(A @ B)
    _assert_canonical(C, (m, n), np.float64)
    got, ref = C.toarray(), R.toarray()
    assert np.array_equal(np.isinf(got), np.isinf(ref)), "inf where scipy has none"
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=0)


@FUZZ
@given(seed=st.integers(0, 2**32 - 1), m=_dims, k=_dims, n=_dims, masked=st.booleans())
def test_spgemm_float32_within_float32_error_of_float64(seed, m, k, n, masked):
    rng = np.random.default_rng(seed)
    A = _raw_csr(rng, m, k, density=0.4, values="wild32")
    B = _raw_csr(rng, k, n, density=0.4, values="wild32")
    mask = _raw_csr(rng, m, n, density=0.5, messy=False) if masked else None
    C = spgemm_lookup(A.astype(np.float32), B.astype(np.float32), mask)
    _assert_canonical(C, (m, n), np.float32)
    A32, B32 = (M.astype(np.float32).astype(np.float64) for M in (A, B))
    ref = (A32 @ B32).toarray()  # float64 sums of the float32 inputs
    scale = (abs(A32) @ abs(B32)).toarray()  # the error bound of a sum grows with this
    if masked:
        on = _pattern(mask).toarray()
        ref, scale = ref * on, scale * on
    err = np.abs(C.toarray().astype(np.float64) - ref)
    # a rounding of each product and sum, relative to the terms' magnitudes; a subnormal
    # product is off by up to half float32's smallest step, whatever its size
    bound = 4 * max(k, 1) * np.finfo(np.float32).eps * scale + (k + 1) * 2.0**-149
    assert np.all(err <= bound)


# ----------------------------------------------------------------------- shapes and sizes
@pytest.mark.parametrize(("m", "k", "n"), [(0, 0, 0), (0, 5, 3), (4, 0, 3), (4, 5, 0),
                                           (3, 4, 2), (1, 1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_empty_and_zero_dimension_products(m, k, n, dtype):
    A = sp.csr_matrix((m, k), dtype=dtype)
    B = sp.csr_matrix((k, n), dtype=dtype)
    for C in (spgemm_lookup(A, B, None), spgemm_lookup(A, B, sp.csr_matrix(np.ones((m, n))))):
        _assert_canonical(C, (m, n), dtype)
        assert C.nnz == 0
    if k:  # full operands: a zero dimension elsewhere still gives an empty result
        full = spgemm_lookup(sp.csr_matrix(np.ones((m, k), dtype)),
                             sp.csr_matrix(np.ones((k, n), dtype)), None)
        _assert_same(full, sp.csr_matrix(np.full((m, n), k, dtype)))
    S = spadd_lookup(sp.csr_matrix((m, n), dtype=dtype), sp.csr_matrix((m, n), dtype=dtype),
                     1.0, 2.0)
    _assert_canonical(S, (m, n), dtype)
    assert S.nnz == 0


def test_a_single_very_long_row_and_power_law_rows():
    A = powerlaw_csr(2_000, 20_000, 40_000, row_exponent=1.3, dtype=np.float64, seed=3)
    A.data = np.random.default_rng(3).integers(-3, 4, size=A.nnz).astype(np.float64)
    assert np.diff(A.indptr).max() > A.nnz // 10  # one row holds a large share of A
    B = A.T.tocsr()
    _assert_same(spgemm_lookup(A, B, None), A @ B)
    with _chunks(True):  # the long row alone in its chunk, the rest cut around it
        _assert_same(spgemm_lookup(A, B, None), A @ B)
        mask = _raw_csr(np.random.default_rng(4), 2_000, 2_000, density=0.05, messy=False)
        _assert_same(spgemm_lookup(A, B, mask), (A @ B).multiply(_pattern(mask)))


def test_one_output_column_and_one_inner_dimension():
    rng = np.random.default_rng(11)
    A = _raw_csr(rng, 300, 40, density=0.3)
    b = _raw_csr(rng, 40, 1, density=0.5)
    _assert_same(spgemm_lookup(A, b, None), A @ b)
    a, c = _raw_csr(rng, 200, 1, density=0.7), _raw_csr(rng, 1, 150, density=0.7)
    _assert_same(spgemm_lookup(a, c, None), a @ c)  # an outer product


@pytest.mark.parametrize("factor", [0, None, 10**9], ids=["sorted", "chosen", "scanned"])
@pytest.mark.parametrize("width", [1, 63, 64, 4096, 4097, 150_000])
def test_both_ways_of_ordering_a_row(monkeypatch, factor, width):
    """Rows ordered by a sort and by the bitmap scan (forced each way, and as chosen) on
    widths around a bitmap word and a summary word."""
    if factor is not None:
        monkeypatch.setattr(host, "_WORDS_PER_SORT_STEP", factor)
    rng = np.random.default_rng(width)
    A = _raw_csr(rng, 120, 50, density=0.2, empty_rows=0.1)
    B = _raw_csr(rng, 50, width, density=min(1.0, 40 / width), empty_rows=0.1)
    B.indices[:3] = width - 1  # the last column is reached
    _assert_same(spgemm_lookup(A, B, None), A @ B)


def test_int64_indices_and_sparse_arrays():
    rng = np.random.default_rng(5)
    A = _raw_csr(rng, 60, 70, density=0.1, index=np.int64)
    B = _raw_csr(rng, 70, 80, density=0.1, index=np.int32)
    C = spgemm_lookup(sp.csr_array(A), B, None)
    _assert_same(C, A @ B)
    assert C.indices.dtype == np.int32  # the inputs' index dtypes do not widen the output
    mask = _raw_csr(rng, 60, 80, density=0.3, index=np.int64, messy=False)
    _assert_same(spgemm_lookup(A, sp.csr_array(B), mask), (A @ B).multiply(_pattern(mask)))
    _assert_same(spadd_lookup(sp.csr_array(A), A, 1.0, 1.0), 2.0 * A)


def test_results_do_not_depend_on_the_thread_count():
    rng = np.random.default_rng(9)
    A = _raw_csr(rng, 400, 300, density=0.05, values="wild")
    B = _raw_csr(rng, 300, 500, density=0.05, values="wild")
    before = numba.get_num_threads()
    out = []
    try:
        for threads in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)}):
            numba.set_num_threads(threads)
            with _chunks(True):
                out.append((spgemm_lookup(A, B, None), spadd_lookup(A, A, 1.0, -0.5)))
    finally:
        numba.set_num_threads(before)
    for (C, S) in out[1:]:
        for got, first in ((C, out[0][0]), (S, out[0][1])):
            np.testing.assert_array_equal(got.indptr, first.indptr)
            np.testing.assert_array_equal(got.indices, first.indices)
            np.testing.assert_array_equal(got.data, first.data)


# ------------------------------------------------------------------ the exported helpers
@FUZZ
@given(seed=st.integers(0, 2**32 - 1), m=_dims, k=_dims, n=_dims, index=_index)
def test_row_work_counts_every_product(seed, m, k, n, index):
    rng = np.random.default_rng(seed)
    A = _raw_csr(rng, m, k, density=0.3, index=index)
    B = _raw_csr(rng, k, n, density=0.3, index=index)
    ones = sp.csr_matrix((np.ones(A.nnz), A.indices, A.indptr), shape=A.shape)
    ref = ones @ np.diff(B.indptr).astype(np.float64)  # duplicates counted, as computed
    work = host.row_work(A.indptr, A.indices, B.indptr)
    assert work.dtype == np.int64 and work.shape == (m,)
    np.testing.assert_array_equal(work, ref.astype(np.int64))
    total = host.intermediate_products(A, B)
    assert isinstance(total, int) and total == int(ref.sum())


@pytest.mark.parametrize(("nnz", "shape", "expected"), [
    (0, (0, 0), np.int32),
    (10, (5, 5), np.int32),
    (2**31 - 1, (5, 5), np.int32),
    (2**31, (5, 5), np.int64),
    (10, (5, 2**31 - 1), np.int32),
    (10, (5, 2**31), np.int64),
    (10, (2**31, 5), np.int64),
    (2**40, (2**33, 2**33), np.int64),
])
def test_output_index_dtype(nnz, shape, expected):
    assert host.output_index_dtype(nnz, shape) == np.dtype(expected)


@pytest.mark.parametrize("width", [2**31 - 1, 2**31])
def test_output_index_dtype_is_the_one_scipy_keeps(width):
    # scipy's CSR constructor widens int32 indices where a dimension needs int64; a result
    # built with the dtype chosen must come out with that very dtype (no copy, no surprise)
    dtype = host.output_index_dtype(1, (2, width))
    M = sp.csr_matrix((np.ones(1), np.array([width - 1], dtype), np.array([0, 1, 1], dtype)),
                      shape=(2, width))
    assert M.indices.dtype == M.indptr.dtype == dtype
