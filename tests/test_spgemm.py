"""mgpu.spgemm and mgpu.spadd on both devices against scipy (float64 reference).

The GPU product bins rows by size (a warp's table, a block's, tables in global memory for
the longest), so the inputs here mix row sizes on purpose; `skewed` reaches every bin of both
passes. The host kernels' own property tests are in test_spgemm_host.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import mgpu
from mgpu.backends.instances import (SPGEMM_NUMERIC, SPGEMM_RATIO, SPGEMM_SYMBOLIC,
                                     spgemm_dynamic, spgemm_shared)


def _on(xp, *mats):
    if xp is np:
        return mats
    import cupyx.scipy.sparse as csp

    return tuple(None if M is None else csp.csr_matrix(M) for M in mats)


def _host(C):
    return C.get() if hasattr(C, "get") else C


from conftest import canonical as _canonical  # noqa: E402


def _assert_same_pattern(C, ref):
    """C canonical with exactly ref's pattern (ref canonicalised)."""
    C, ref = _host(C), _canonical(ref)
    assert C.shape == ref.shape
    np.testing.assert_array_equal(np.asarray(C.indptr), ref.indptr)
    np.testing.assert_array_equal(np.asarray(C.indices), ref.indices)
    return C, ref


def _random(rng, m, n, density, *, ints=False, dtype=np.float64):
    A = sp.random(m, n, density=density, format="csr", random_state=rng, dtype=np.float64)
    if ints:
        A.data = rng.integers(-3, 4, size=A.nnz).astype(np.float64)
        A.data[A.data == 0] = 1
    return A.astype(dtype)


def skewed(rng, *, ints=False):
    """A 403×3000 with rows from empty to 2500 nonzeros and B 3000×60000 with rows of 0 to
    60: row products from 0 to ~75k, row outputs from 0 to ~40k."""
    m, k, n = 403, 3000, 60000
    lens = np.concatenate([np.zeros(20, int), rng.integers(1, 4, 200), rng.integers(4, 40, 120),
                           rng.integers(40, 200, 50), rng.integers(300, 900, 10),
                           rng.integers(1500, 2500, 3)])
    rng.shuffle(lens)
    rows = np.repeat(np.arange(m), lens)
    cols = rng.integers(0, k, rows.size)
    A = sp.csr_matrix((rng.standard_normal(rows.size), (rows, cols)), shape=(m, k))
    blens = rng.integers(0, 60, k)
    brow = np.repeat(np.arange(k), blens)
    bcol = rng.integers(0, n, brow.size)
    B = sp.csr_matrix((rng.standard_normal(brow.size), (brow, bcol)), shape=(k, n))
    A.sum_duplicates()
    B.sum_duplicates()
    if ints:
        for X in (A, B):
            X.data = rng.integers(-2, 3, X.nnz).astype(np.float64)
            X.data[X.data == 0] = 1
    return A, B


def _record_kernels(monkeypatch) -> set[str]:
    """The set that every kernel the GPU product launches is added to (by its name)."""
    import mgpu.backends.cupy_spgemm as g

    seen: set[str] = set()
    real = g._kernel

    def record(expr):
        seen.add(expr)
        return real(expr)

    monkeypatch.setattr(g, "_kernel", record)
    return seen


def _record_products(monkeypatch) -> list:
    """The list that every product (cupy_spgemm._Product) the GPU call makes is added to."""
    import mgpu.backends.cupy_spgemm as g

    made: list = []
    real = g._Product

    def product(*args):
        made.append(real(*args))
        return made[-1]

    monkeypatch.setattr(g, "_Product", product)
    return made


def test_skewed_reaches_every_bin():
    """Under the GPU's binning rule (a row's size, or its products / SPGEMM_RATIO when more),
    skewed() has rows in every table of both passes and past the largest."""
    A, B = skewed(np.random.default_rng(0))
    flops = np.add.reduceat(np.diff(B.indptr)[A.indices], A.indptr[:-1])
    flops[np.diff(A.indptr) == 0] = 0
    nnz = np.diff((abs(A) @ abs(B)).indptr)
    sym = np.maximum(np.minimum(flops, B.shape[1]), flops // SPGEMM_RATIO[0])
    num = np.maximum(nnz, flops // SPGEMM_RATIO[1])
    for size, edges in ((sym, [t // 2 for _, t in SPGEMM_SYMBOLIC]),
                        (num, [t // 2 for _, t in SPGEMM_NUMERIC])):
        for lo, hi in zip([0] + edges[:-1], edges):
            assert ((size > lo) & (size <= hi)).any(), (lo, hi)
        assert (size > edges[-1]).any()


@pytest.mark.gpu
@pytest.mark.parametrize("count", ["every", "short"])
@pytest.mark.parametrize("place", ["bitmap", "sort", "dense"])
def test_every_table_runs(monkeypatch, place, count):
    """The kernels of every table (and the global ones) run on skewed(), and agree: with the
    largest tables' rows placed by a bitmap of C's columns, by a sort, and with the longest
    rows in dense accumulators in place of hash tables in global memory; with every row
    counted, and with the short rows (up to the largest shared table's) sized by their
    products, their counts written back by each numeric table. (Its few rows would
    otherwise all go to blocks' tables: see _FEW_WARPS_PER_SM.)"""
    import cupy
    import cupyx.scipy.sparse as csp

    import mgpu.backends.cupy_spgemm as g

    monkeypatch.setattr(g, "_FEW_WARPS_PER_SM", 0)
    if count == "every":  # every symbolic table runs
        monkeypatch.setattr(g, "_SHORT_PRODUCTS", 0)
    else:
        monkeypatch.setattr(g, "_SLACK_PRODUCTS", 1 << 62)
        monkeypatch.setattr(g, "_SHORT_SHARE", 0)
    monkeypatch.setattr(g, "_DENSE_OVER_TABLES", 1e9 if place == "dense" else 0)
    if place == "sort":
        monkeypatch.setattr(g, "_BITMAP_BYTES", 0)
        monkeypatch.setattr(g, "_STATIC_BITMAP_BYTES", 0)
        monkeypatch.setattr(g, "_GLOBAL_BITMAP_BYTES", 0)
    g._tables.cache_clear()
    seen = _record_kernels(monkeypatch)
    made = _record_products(monkeypatch)
    A, B = skewed(np.random.default_rng(8), ints=True)
    C, ref = _assert_same_pattern(mgpu.spgemm(csp.csr_matrix(A), csp.csr_matrix(B)), A @ B)
    np.testing.assert_array_equal(C.data, ref.data)
    want = {spgemm_shared("double", gr, t, True) for gr, t in SPGEMM_NUMERIC}
    if count == "every":
        want |= {spgemm_shared("double", gr, t, False) for gr, t in SPGEMM_SYMBOLIC}
    else:  # C held slack (closed up by the copy, or with the exact zeros by count and copy)
        assert made[-1].slack
    if place == "dense":
        want |= {"mgpu_spgemm_dense<double, false>", "mgpu_spgemm_dense<double, true>",
                 "mgpu_spgemm_dense_count", "mgpu_spgemm_dense_place<double>"}
    else:
        want |= {"mgpu_spgemm_global<double, false>", "mgpu_spgemm_global<double, true>",
                 f"mgpu_spgemm_global_{'gather' if place == 'sort' else 'rank'}<double>"}
    assert want <= seen, sorted(want - seen)
    assert place == "dense" or not {e for e in seen if "dense" in e}, sorted(seen)
    tables = g._tables(cupy.cuda.runtime.getDevice(), True, "double", B.shape[1])
    # a block's tables place by the bitmap (60,000 columns: 1,875 words), a static one where
    # it has at least as many slots as the bitmap words; a warp's sort
    assert [bool(w) for gr, *_, w in tables] == [
        gr > 32 and place != "sort" and (spgemm_dynamic(t, True) or t >= 1875)
        for gr, t, *_ in tables]
    g._tables.cache_clear()


@pytest.mark.gpu
def test_few_rows_run_in_blocks(monkeypatch):
    """A bin of warp tables with few rows (skewed() has 403 in all) runs in blocks' tables,
    with the same product."""
    import cupyx.scipy.sparse as csp

    seen = _record_kernels(monkeypatch)
    A, B = skewed(np.random.default_rng(8), ints=True)
    C, ref = _assert_same_pattern(mgpu.spgemm(csp.csr_matrix(A), csp.csr_matrix(B)), A @ B)
    np.testing.assert_array_equal(C.data, ref.data)
    shared = {e for e in seen if e.startswith("mgpu_spgemm_shared")}
    assert shared and not {e for e in shared if ", 32, " in e}, sorted(shared)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_product_matches_scipy(xp, dtype):
    rng = np.random.default_rng(1)
    A, B = skewed(rng)
    A, B = A.astype(dtype), B.astype(dtype)
    C = mgpu.spgemm(*_on(xp, A, B))
    assert C.dtype == dtype and C.format == "csr"
    ref = A.astype(np.float64) @ B.astype(np.float64)
    C, ref = _assert_same_pattern(C, ref)
    tol = 1e-12 if dtype == np.float64 else 2e-5
    scale = abs(A).astype(np.float64) @ abs(B).astype(np.float64)
    err = abs(C.astype(np.float64) - ref).max() / max(scale.max(), 1e-300)
    assert err <= tol


def test_integer_values_cancel_exactly_as_scipy(xp):
    A, B = skewed(np.random.default_rng(2), ints=True)
    ref = A @ B
    C, ref = _assert_same_pattern(mgpu.spgemm(*_on(xp, A, B)), ref)
    np.testing.assert_array_equal(np.asarray(C.data), ref.data)
    # cancellations happened, and their zeros are not stored
    assert (abs(A) @ abs(B)).nnz > ref.nnz and (np.asarray(C.data) != 0).all()


def test_unsorted_and_duplicate_operands(xp):
    rng = np.random.default_rng(3)
    A, B = _random(rng, 60, 80, 0.1, ints=True), _random(rng, 80, 70, 0.1, ints=True)

    def scramble(X):
        order = np.concatenate([rng.permutation(np.arange(X.indptr[i], X.indptr[i + 1]))
                                for i in range(X.shape[0])]).astype(int)
        rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
        # every entry split in two halves: duplicates that sum to the original
        data = np.concatenate([X.data[order] / 2, X.data[order] / 2])
        r = np.concatenate([rows, rows])
        c = np.concatenate([X.indices[order], X.indices[order]])
        keep = np.argsort(r, kind="stable")
        indptr = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=X.shape[0]))])
        Y = sp.csr_matrix((data[keep], c[keep], indptr), shape=X.shape)
        assert not Y.has_canonical_format
        return Y

    Au, Bu = scramble(A), scramble(B)
    C, ref = _assert_same_pattern(mgpu.spgemm(*_on(xp, Au, Bu)), A @ B)
    np.testing.assert_array_equal(np.asarray(C.data), ref.data)
    A2 = _random(rng, 60, 80, 0.1, ints=True)
    S, sref = _assert_same_pattern(mgpu.spadd(*_on(xp, Au, scramble(A2))), A + A2)
    np.testing.assert_array_equal(np.asarray(S.data), sref.data)


def test_masked_product(xp):
    rng = np.random.default_rng(4)
    A, B = skewed(rng, ints=True)
    M = _random(rng, A.shape[0], B.shape[1], 0.02)
    M.data[:] = 7.0  # values are not used
    ref = (A @ B).multiply(M != 0)
    C, ref = _assert_same_pattern(mgpu.spgemm(*_on(xp, A, B), mask=_on(xp, M)[0]), ref)
    np.testing.assert_array_equal(np.asarray(C.data), ref.data)
    assert ref.nnz > 100


@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (2.5, -1.0), (0.0, 1.0)])
def test_spadd_matches_scipy(xp, alpha, beta):
    rng = np.random.default_rng(5)
    A = _random(rng, 300, 500, 0.02, ints=True)
    B = _random(rng, 300, 500, 0.02, ints=True)
    B = B + A.multiply(rng.random(A.shape) < 0.3) * -1.0  # some entries cancel exactly
    ref = alpha * A + beta * B
    C, ref = _assert_same_pattern(mgpu.spadd(*_on(xp, A, B), alpha=alpha, beta=beta), ref)
    np.testing.assert_array_equal(np.asarray(C.data), ref.data)


def test_empty_shapes(xp):
    for m, k, n in [(0, 5, 4), (5, 0, 4), (5, 4, 0), (3, 3, 3)]:
        A = sp.csr_matrix((m, k))
        B = sp.csr_matrix((k, n))
        C = _host(mgpu.spgemm(*_on(xp, A, B)))
        assert C.shape == (m, n) and C.nnz == 0
    C = _host(mgpu.spadd(*_on(xp, sp.csr_matrix((4, 0)), sp.csr_matrix((4, 0)))))
    assert C.shape == (4, 0) and C.nnz == 0


def test_kind_in_is_kind_out():
    A = sp.csr_array(np.eye(3))
    assert isinstance(mgpu.spgemm(A, A), sp.csr_array)
    assert isinstance(mgpu.spadd(A, A), sp.csr_array)
    assert isinstance(mgpu.spgemm(sp.csr_matrix(A), sp.csr_matrix(A)), sp.csr_matrix)
    C = mgpu.spgemm(sp.coo_matrix(A).astype(np.int64), sp.csc_matrix(A).astype(np.float32))
    assert C.format == "csr" and C.dtype == np.float64


@pytest.mark.parametrize("call,err,text", [
    (lambda A: mgpu.spgemm(A, sp.csr_matrix((4, 2))), ValueError,
     "The 'B' parameter of spgemm must have A.shape[1] = 3 rows"),
    (lambda A: mgpu.spgemm(A.toarray(), A), TypeError, "use mgpu.spmm"),
    (lambda A: mgpu.spgemm(A, A, mask=sp.csr_matrix((2, 3))), ValueError,
     "must have the result's shape (3, 3)"),
    (lambda A: mgpu.spgemm(A, A, mask=sp.csr_matrix(([0.0], ([0], [0])), shape=(3, 3))),
     ValueError, "holds stored zeros"),
    (lambda A: mgpu.spgemm(A, A, to_host=1), ValueError, "'to_host' parameter of spgemm"),
    (lambda A: mgpu.spadd(A, A[:2]), ValueError, "must have A's shape (3, 3)"),
    (lambda A: mgpu.spadd(A, A, alpha=float("inf")), ValueError, "finite"),
    (lambda A: mgpu.spadd(A, A, beta="2"), ValueError, "'beta' parameter of spadd"),
])
def test_bad_input_is_refused(call, err, text):
    A = sp.csr_matrix(np.eye(3))
    with pytest.raises(err, match=None) as info:
        call(A)
    assert text in str(info.value)


def test_nonfinite_is_refused(xp):
    A = sp.csr_matrix(np.eye(3))
    bad = A.copy()
    bad.data[1] = np.nan
    for args, name in (((bad, A), "'A'"), ((A, bad), "'B'")):
        with pytest.raises(ValueError, match="NaN or infinity") as info:
            mgpu.spgemm(*_on(xp, *args))
        assert name in str(info.value) and "row 1, column 1" in str(info.value)


def test_malformed_csr_is_refused(xp):
    """Index arrays out of range or out of order are refused before any kernel reads them."""
    A = sp.csr_matrix(np.eye(3))
    wide = sp.csr_matrix((np.ones(3), np.array([0, 1, 7]), np.array([0, 1, 2, 3])),
                         shape=(3, 3))
    back = sp.csr_matrix((np.ones(3), np.array([0, 1, 2]), np.array([0, 2, 1, 3])),
                         shape=(3, 3))
    for args, name in (((A, wide), "'B'"), ((back, A), "'A'")):
        for call in (mgpu.spgemm, mgpu.spadd):
            with pytest.raises(ValueError, match="not a well-formed CSR matrix") as info:
                call(*_on(xp, *args))
            assert name in str(info.value)
    with pytest.raises(ValueError, match="'mask' parameter of spgemm is not a well-formed"):
        mgpu.spgemm(*_on(xp, A, A), mask=_on(xp, wide)[0])


def test_values_and_indices_of_different_lengths_are_refused(xp):
    """A CSR whose values and column indices differ in length (arrays set by hand) is
    refused before a kernel reads past either."""
    A = sp.csr_matrix(np.eye(3))
    X = _on(xp, A)[0].copy()
    X.data = X.data[:2]
    for args, name in (((X, _on(xp, A)[0]), "'A'"), ((_on(xp, A)[0], X), "'B'")):
        with pytest.raises(ValueError, match="not a well-formed CSR matrix") as info:
            mgpu.spgemm(*args)
        assert name in str(info.value)


@pytest.mark.gpu
def test_devices_must_match():
    import cupyx.scipy.sparse as csp

    A = sp.csr_matrix(np.eye(3))
    with pytest.raises(ValueError, match="must be on one device"):
        mgpu.spgemm(A, csp.csr_matrix(A))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [0, 1, 2047, 2048, 2049, 600_000])
def test_device_prefix_sums(n):
    """The product's own scan (three launches): of int32 values, and of the lengths of the
    B rows that column indices pick, across one tile, several, and more than the
    partials' block takes in one stride."""
    import cupy

    import mgpu.backends.cupy_spgemm as g

    rng = np.random.default_rng(n)
    v = rng.integers(0, 1000, n).astype(np.int32)
    out = cupy.full(n + 1, -1, dtype=cupy.int64)
    out32 = cupy.full(n + 1, -1, dtype=cupy.int32)
    g._scan(cupy.asarray(v), n, out, out32=out32)
    want = np.concatenate([[0], np.cumsum(v, dtype=np.int64)])
    np.testing.assert_array_equal(out.get(), want)
    np.testing.assert_array_equal(out32.get(), want)  # below 2**31 here
    lens = rng.integers(0, 50, 777).astype(np.int32)
    b_ptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    idx = rng.integers(0, 777, n).astype(np.int32)
    g._scan(cupy.asarray(idx), n, out, b_ptr=cupy.asarray(b_ptr))
    np.testing.assert_array_equal(out.get(), np.concatenate([[0], np.cumsum(lens[idx],
                                                                            dtype=np.int64)]))


@pytest.mark.gpu
def test_64bit_index_arrays_are_taken():
    """cupyx operands and masks whose index arrays are int64 give the int32 ones' product
    (the kernels read int32: taken as such, 64-bit arrays would be read as garbage)."""
    import cupy
    import cupyx.scipy.sparse as csp

    A, B = skewed(np.random.default_rng(9), ints=True)
    M = _random(np.random.default_rng(10), A.shape[0], B.shape[1], 0.01)
    wide = []
    for X in (A, B, M):
        Xg = csp.csr_matrix(X)
        Xg.indices = Xg.indices.astype(cupy.int64)
        Xg.indptr = Xg.indptr.astype(cupy.int64)
        wide.append(Xg)
    C, ref = _assert_same_pattern(mgpu.spgemm(wide[0], wide[1]), A @ B)
    np.testing.assert_array_equal(C.data, ref.data)
    masked = _host(mgpu.spgemm(wide[0], wide[1], mask=wide[2]))
    want = _canonical((A @ B).multiply(M != 0))
    np.testing.assert_array_equal(masked.indices, want.indices)
    np.testing.assert_array_equal(masked.data, want.data)


@pytest.mark.gpu
def test_batches_and_row_blocks_to_host(monkeypatch):
    """Scratch and C cut into many pieces (a tiny share of the device for each) give the
    same C; to_host returns it as scipy."""
    import cupyx.scipy.sparse as csp

    import mgpu.backends.cupy_spgemm as g

    A, B = skewed(np.random.default_rng(6), ints=True)
    ref = A @ B
    Ag, Bg = csp.csr_matrix(A), csp.csr_matrix(B)
    whole = mgpu.spgemm(Ag, Bg)
    monkeypatch.setattr(g, "_SCRATCH_SHARE", 2e-7)  # some kB: a batch per row or so
    for C in (mgpu.spgemm(Ag, Bg), mgpu.spgemm(Ag, Bg, to_host=True)):
        C, r = _assert_same_pattern(C, ref)
        np.testing.assert_array_equal(np.asarray(C.data), r.data)
    assert isinstance(mgpu.spgemm(Ag, Bg, to_host=True), sp.csr_matrix)
    np.testing.assert_array_equal(whole.indices.get(), _canonical(ref).indices)


@pytest.mark.gpu
@pytest.mark.parametrize("few", [0, 60, 128, None])
@pytest.mark.parametrize("ints", [True, False])
def test_short_rows_skip_the_symbolic_pass(monkeypatch, few, ints):
    """Rows of at most _SHORT_PRODUCTS products (None: the largest shared numeric table's)
    are sized by their products, not counted: the same C with none, few or most such rows
    (skewed() has rows of 0 to ~75k products and bounds above the counts, so short rows
    beside counted ones in the same bins, and counted rows past the shared tables), and to
    the host in row blocks. Without exact zeros (normal values) the slack is closed up by
    the one-launch copy; with integer values some sums cancel, and the count-and-copy path
    leaves them out too."""
    import cupy
    import cupyx.scipy.sparse as csp

    import mgpu.backends.cupy_spgemm as g

    monkeypatch.setattr(g, "_SHORT_PRODUCTS", few)
    monkeypatch.setattr(g, "_SLACK_PRODUCTS", 1 << 62)  # whatever the product's size
    monkeypatch.setattr(g, "_SHORT_SHARE", 0)  # and whatever their share of its products
    A, B = skewed(np.random.default_rng(11), ints=ints)
    ref = A @ B
    made = _record_products(monkeypatch)
    seen = _record_kernels(monkeypatch)
    for to_host in (False, True):
        if to_host:
            monkeypatch.setattr(g, "_SCRATCH_SHARE", 2e-6)  # C in many row blocks
        C, r = _assert_same_pattern(mgpu.spgemm(csp.csr_matrix(A), csp.csr_matrix(B),
                                                to_host=to_host), ref)
        if ints:
            np.testing.assert_array_equal(C.data, r.data)
        else:
            np.testing.assert_allclose(C.data, r.data, rtol=1e-12, atol=1e-12)
        assert made[-1].slack == (few != 0)
        if few is None:  # the longest rows are counted still, in global memory
            tables = g._tables(cupy.cuda.runtime.getDevice(), True, "double", B.shape[1])
            assert made[-1].few == tables[-1][1] // 2
            assert {"mgpu_spgemm_dense<double, false>",
                    "mgpu_spgemm_global<double, false>"} & seen, sorted(seen)
    if not ints:  # integer sums may or may not cancel in a row block: either path then
        assert any(e.startswith("mgpu_spgemm_close_up<double") for e in seen) == (few != 0)


def _spread(rng, m: int, n: int):
    """A (m × 2000) and B (2000 × n) of small positive integers, A's rows of 1 to 600
    nonzeros (log-uniform) times B's rows of ~20: row products from ~20 to ~12,000, in four
    symbolic bins."""
    lens = np.exp(rng.uniform(0, np.log(600), m)).astype(int) + 1
    rows = np.repeat(np.arange(m), lens)
    A = sp.csr_matrix((rng.integers(1, 4, rows.size).astype(np.float64),
                       (rows, rng.integers(0, 2000, rows.size))), shape=(m, 2000))
    B = sp.random(2000, n, density=20 / n, format="csr", random_state=3,
                  data_rvs=lambda k: rng.integers(1, 4, k).astype(np.float64))
    A.sum_duplicates()
    return A, B


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["small", "large", "long"])
def test_short_rows_skip_the_count_where_it_costs_more(monkeypatch, case):
    """Short rows skip the symbolic pass only where the product has at most _SLACK_PRODUCTS
    products and they hold at least _SHORT_SHARE of them ("small"); a larger product
    ("large") or one whose short rows hold a sliver of the products ("long": rows of at
    most 100 products short) counts them beside the others, in the same bins, and leaves
    C no slack. Same C either way."""
    import cupyx.scipy.sparse as csp

    import mgpu.backends.cupy_spgemm as g

    A, B = _spread(np.random.default_rng(13), 3000, 200_000)
    if case == "large":
        monkeypatch.setattr(g, "_SLACK_PRODUCTS", 0)
    if case == "long":
        monkeypatch.setattr(g, "_SHORT_PRODUCTS", 100)
    made = _record_products(monkeypatch)
    seen = _record_kernels(monkeypatch)
    C, ref = _assert_same_pattern(mgpu.spgemm(csp.csr_matrix(A), csp.csr_matrix(B)), A @ B)
    np.testing.assert_array_equal(C.data, ref.data)
    flops = np.add.reduceat(np.diff(B.indptr)[A.indices], A.indptr[:-1])
    short = flops[flops <= made[-1].few].sum()
    skip = flops.sum() <= g._SLACK_PRODUCTS and short >= g._SHORT_SHARE * flops.sum()
    assert skip == (case == "small")
    assert made[-1].slack == skip
    assert any(e.startswith("mgpu_spgemm_close_up") for e in seen) == skip
    # symbolic tables ran for the counted rows: always some (the rows past `few` products),
    # and those of the short rows' bins too where they were counted
    symbolic = {e for e in seen if e.startswith("mgpu_spgemm_shared") and ", false, " in e}
    assert len(symbolic) >= (1 if skip else 3), sorted(symbolic)


@pytest.mark.gpu
def test_bounds_that_do_not_fit_are_counted(monkeypatch):
    """Where C's places with the short rows' bounds do not fit, those rows are counted too,
    and a C that fits is computed (never refused for the bounds)."""
    import cupyx.scipy.sparse as csp

    import mgpu.backends.cupy_spgemm as g

    tried = []
    real = g._fits

    def fits(p, nnz, entry):
        tried.append((p.slack, nnz))
        if p.slack:
            raise mgpu.DeviceMemoryError("bounds too big")
        return real(p, nnz, entry)

    monkeypatch.setattr(g, "_fits", fits)
    monkeypatch.setattr(g, "_SLACK_PRODUCTS", 1 << 62)
    monkeypatch.setattr(g, "_SHORT_SHARE", 0)
    A, B = skewed(np.random.default_rng(12), ints=True)
    C, ref = _assert_same_pattern(mgpu.spgemm(csp.csr_matrix(A), csp.csr_matrix(B)), A @ B)
    np.testing.assert_array_equal(C.data, ref.data)
    assert [s for s, _ in tried] == [True, False]
    assert tried[0][1] > tried[1][1] >= C.nnz  # bounds, then counts (exact zeros left out)


@pytest.mark.gpu
def test_too_big_a_result_is_refused_with_the_numbers(monkeypatch):
    import cupyx.scipy.sparse as csp

    import mgpu.backends.cupy_spgemm as g

    A, B = skewed(np.random.default_rng(7))
    calls = []

    def tiny(nbytes, what, hint=""):
        calls.append(what)
        if "C of" in what:
            raise mgpu.DeviceMemoryError(f"{what} needs {nbytes} bytes. {hint}")
        return 1 << 40

    monkeypatch.setattr(g, "require_gpu", tiny)
    monkeypatch.setattr(g, "require_gpu_unless_small",
                        lambda n, what, hint="": tiny(n, what() if callable(what) else what, hint))
    with pytest.raises(mgpu.DeviceMemoryError, match="to_host=True") as info:
        mgpu.spgemm(csp.csr_matrix(A), csp.csr_matrix(B))
    # normal random values: no sum cancels, so C's count is scipy's
    assert f"C of {_canonical(A @ B).nnz:,} nonzeros" in str(info.value)
    assert any("SpGEMM of A 403×3000" in w for w in calls)


_REAL = [("matrices/bcsstk13.mtx.gz", "AA"), ("matrices/s3rmt3m3.mtx.gz", "AA"),
         ("matrices/memplus.mtx.gz", "AA"), ("graphs/ca-HepPh.txt.gz", "AAt"),
         ("graphs/p2p-Gnutella31.txt.gz", "AAt"), ("bow/ap.dat.gz", "AAt")]


@pytest.mark.parametrize("path,form", _REAL)
def test_real_data(xp, data_dir, path, form):
    import mgpu.io

    f = data_dir / path
    if not f.exists():
        pytest.skip(f"{f} not present")
    A = sp.csr_matrix(mgpu.io.load(f), dtype=np.float64)
    B = A if form == "AA" else sp.csr_matrix(A.T)
    ref = _canonical(A @ B)
    C = _host(mgpu.spgemm(*_on(xp, A, B)))
    tol = 1e-12 * (abs(A) @ abs(B)).max()
    assert abs(C - ref).max() <= tol
    # the patterns differ at most where one sum came out exactly 0 and the other as a
    # rounding residue (real matrices cancel: FEM stiffness rows sum to zero)
    only = abs(C).astype(bool) != abs(ref).astype(bool)
    assert only.nnz <= 1e-3 * ref.nnz
    assert abs(C.multiply(only)).max() <= tol and abs(ref.multiply(only)).max() <= tol
    assert np.array_equal(np.diff(C.indptr) >= 0, np.ones(C.shape[0], bool))
    assert all(np.all(np.diff(C.indices[C.indptr[i]:C.indptr[i + 1]]) > 0)
               for i in range(C.shape[0]))
