"""SDDMM with a plan on the GPU: the plan's prepared call (mgpu.backends.cupy_sddmm_plan).

Its results against a float64 reference and against the call without a plan, for each
scheme, dtype, hadamard and check; its refusals of NaN and infinity in the words of the
general path; operands that are not the plan's (another dtype, order, alignment, shape,
device, matrix) taken by the general path, which converts or refuses them as before; the
index arrays its results share (sorted S) or own (unsorted S); many calls on two streams.
"""
from __future__ import annotations

import numpy as np
import pytest

import mgpu
from conftest import sddmm_problem, to_gpu as _gpu
from conftest import sddmm_reference as _reference

pytestmark = pytest.mark.gpu


def _close(P, ref: np.ndarray, dtype) -> None:
    got = P.data.get().astype(np.float64)
    tol = 1e-5 if np.dtype(dtype) == np.float32 else 1e-12
    scale = max(float(np.abs(ref).max(initial=0.0)), 1e-300)
    assert float(np.abs(got - ref).max(initial=0.0)) / scale <= tol


def _problem(dtype, K, m=3000, n=2000, density=0.01, seed=0):
    """S (sorted, no duplicates, empty rows 10..19 and columns 50..59) and its factors."""
    return sddmm_problem(dtype, K, m=m, n=n, density=density, seed=seed, sort=True)


def _with(X, at, value):
    X = X.copy()
    X[at] = value
    return X


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("K", [7, 32, 45, 130])
@pytest.mark.parametrize("scheme", ["csr", "sm-l2"])
def test_sddmm_planned_call_matches_reference_and_the_call_without_a_plan(dtype, K, scheme):
    S, A, B = _problem(dtype, K)
    Sg, Ag, Bg = _gpu(S, A, B)
    plan = mgpu.sddmm_plan(Sg, K, scheme=scheme)
    assert plan.scheme == scheme and plan.call is not None
    for hadamard in (True, False):
        ref = _reference(S, A, B, hadamard)
        for check_finite in (True, False):
            assert plan.call(Sg, Ag, Bg, hadamard, check_finite) is not None  # prepared path
            P1 = mgpu.sddmm(Sg, Ag, Bg, hadamard=hadamard, plan=plan, check_finite=check_finite)
            P2 = mgpu.sddmm(Sg, Ag * 3, Bg, hadamard=hadamard, plan=plan,
                            check_finite=check_finite)
            P0 = mgpu.sddmm(Sg, Ag, Bg, hadamard=hadamard, check_finite=check_finite)
            assert P1.dtype == dtype and P1.shape == S.shape and P1.nnz == S.nnz
            _close(P1, ref, dtype)  # the first result, after the second call: its own values
            _close(P2, 3 * ref, dtype)
            _close(P0, ref, dtype)
            # S's pattern, in one copy held by the plan: neither S's arrays nor a new copy
            assert P1.indices is P2.indices and P1.indptr is P2.indptr
            assert P1.indices is not Sg.indices and P1.indptr is not Sg.indptr
            np.testing.assert_array_equal(P1.indices.get(), S.indices)
            np.testing.assert_array_equal(P1.indptr.get(), S.indptr)
            assert P1.has_canonical_format
    P = mgpu.sddmm(Sg, Ag, Bg, plan=plan)
    P.sort_indices()
    P.sum_duplicates()  # nothing to do: the shared arrays stay S's pattern
    np.testing.assert_array_equal(mgpu.sddmm(Sg, Ag, Bg, plan=plan).indices.get(), S.indices)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("scheme", ["csr", "sm-l2"])
def test_sddmm_planned_call_refuses_nan_and_inf_as_the_general_path(dtype, scheme):
    S, A, B = _problem(dtype, 64, seed=1)
    Sg, Ag, Bg = _gpu(S, A, B)
    plan = mgpu.sddmm_plan(Sg, 64, scheme=scheme)
    msg = r"The '{}' parameter of sddmm holds NaN or infinity \(first at row {}, column {}\)"
    cases = [
        ("A", _with(_with(A, (7, 3), np.nan), (200, 1), np.inf), B, 7, 3),
        ("B", A, _with(B, (1999, 63), -np.inf), 1999, 63),
        ("A", _with(A, (12, 0), np.nan), B, 12, 0),  # a row of A no nonzero reads
        ("B", A, _with(B, (55, 23), np.inf), 55, 23),  # a row of B no nonzero reads
    ]
    for name, Ab, Bb, r, c in cases:
        Abg, Bbg = _gpu(Ab, Bb)
        for hadamard in (True, False):
            assert plan.call(Sg, Abg, Bbg, hadamard, True)[1] is True  # flagged
            with pytest.raises(ValueError, match=msg.format(name, r, c)):
                mgpu.sddmm(Sg, Abg, Bbg, hadamard=hadamard, plan=plan)
        # unchecked: no refusal, NaN and infinity only where they spread
        P = mgpu.sddmm(Sg, Abg, Bbg, plan=plan, check_finite=False)
        touched = ~np.isfinite(_reference(S, Ab, Bb, True))
        assert not np.isfinite(P.data.get()[touched]).any()
        np.testing.assert_array_equal(np.isfinite(P.data.get()), ~touched)
        _close(mgpu.sddmm(Sg, Ag, Bg, plan=plan), _reference(S, A, B, True), dtype)
    # S's values: refused with hadamard, not read without it
    Sb = S.copy()
    Sb.data[5] = np.nan
    Sbg = _gpu(Sb)[0]
    bplan = mgpu.sddmm_plan(Sbg, 64, scheme=scheme)
    row = int(np.searchsorted(S.indptr, 5, side="right") - 1)
    with pytest.raises(ValueError, match=rf"The 'S' parameter of sddmm holds NaN or infinity "
                       rf"\(row {row}, column {S.indices[5]}\); clean it, or pass "
                       r"hadamard=False"):
        mgpu.sddmm(Sbg, Ag, Bg, plan=bplan)
    _close(mgpu.sddmm(Sbg, Ag, Bg, plan=bplan, hadamard=False), _reference(S, A, B, False),
           dtype)
    # A is reported before B, and both before S's values
    with pytest.raises(ValueError, match=msg.format("A", 7, 3)):
        mgpu.sddmm(Sbg, *_gpu(_with(A, (7, 3), np.nan), _with(B, (1, 1), np.nan)), plan=bplan)


def test_sddmm_planned_call_leaves_other_operands_to_the_general_path():
    import cupy
    import cupyx.scipy.sparse as csp

    S, A, B = _problem(np.float32, 32, seed=2)
    Sg, Ag, Bg = _gpu(S, A, B)
    plan = mgpu.sddmm_plan(Sg, 32, scheme="csr")
    ref = _reference(S, A, B, True)
    # converted as without a plan: float64 factors give a float64 product
    A64 = cupy.asarray(A.astype(np.float64))
    assert plan.call(Sg, A64, Bg, True, True) is None
    P = mgpu.sddmm(Sg, A64, Bg, plan=plan)
    assert P.dtype == np.float64
    _close(P, ref, np.float32)
    # Fortran order; a base address off the 16-byte boundary the vector loads need
    F = cupy.asfortranarray(Ag)
    raw = cupy.empty(A.size + 1, dtype=np.float32)
    off = raw[1:].reshape(A.shape)
    off[...] = Ag
    assert off.data.ptr % 16
    for X in (F, off):
        assert plan.call(Sg, X, Bg, True, True) is None
        _close(mgpu.sddmm(Sg, X, Bg, plan=plan), ref, np.float32)
    # refused in the general path's words
    with pytest.raises(ValueError, match=r"'A' parameter of sddmm must have one row per row "
                                         r"of S: S is 3000×2000, so A must be 3000×K"):
        mgpu.sddmm(Sg, Ag[:-1], Bg, plan=plan)
    with pytest.raises(ValueError, match=r"B must be 2000×K\. Got B of shape \(32, 2000\) "
                                         r"instead; pass B\.T\."):
        mgpu.sddmm(Sg, Ag, Bg.T.copy(), plan=plan)
    with pytest.raises(ValueError, match=r"made for another problem .* K=32\); got .* K=16"):
        mgpu.sddmm(Sg, Ag[:, :16].copy(), Bg[:, :16].copy(), plan=plan)
    with pytest.raises(TypeError, match=r"'A' parameter of sddmm must hold real numbers"):
        mgpu.sddmm(Sg, Ag.astype(np.complex64), Bg, plan=plan)
    with pytest.raises(TypeError, match=r"'B' parameter of sddmm must be a dense"):
        mgpu.sddmm(Sg, Ag, csp.csr_matrix(Bg), plan=plan)
    with pytest.raises(ValueError, match=r"must be on one device\. Got S on the GPU"):
        mgpu.sddmm(Sg, A, Bg, plan=plan)
    with pytest.raises(ValueError, match="made for another problem"):
        mgpu.sddmm(csp.csr_matrix(S), Ag, Bg, plan=plan)  # the same pattern, other arrays
    with pytest.raises(ValueError, match="was made for the GPU, but S is on the CPU"):
        mgpu.sddmm(S, A, B, plan=plan)
    with pytest.raises(ValueError, match="'working_memory' and 'progress' parameters"):
        mgpu.sddmm(Sg, Ag, Bg, plan=plan, working_memory="1 GiB")
    # S's values are read at every call: new ones (of the plan's dtype, or not) are used
    Sg.data = Sg.data * 2
    _close(mgpu.sddmm(Sg, Ag, Bg, plan=plan), 2 * ref, np.float32)
    Sg.data = Sg.data.astype(np.float64)
    assert plan.call(Sg, Ag, Bg, True, True) is None
    _close(mgpu.sddmm(Sg, Ag, Bg, plan=plan), 2 * ref, np.float32)


def test_sddmm_planned_call_on_unsorted_indices_gives_each_result_its_own():
    S, A, B = _problem(np.float64, 24, m=500, n=400, density=0.05, seed=3)
    for i in range(S.shape[0]):  # reverse the column order inside every row
        a, b = S.indptr[i], S.indptr[i + 1]
        S.indices[a:b] = S.indices[a:b][::-1].copy()
        S.data[a:b] = S.data[a:b][::-1].copy()
    S.has_sorted_indices = False
    Sg, Ag, Bg = _gpu(S, A, B)
    Sg.has_sorted_indices = False
    plan = mgpu.sddmm_plan(Sg, 24, scheme="csr")
    P1, P2 = (mgpu.sddmm(Sg, Ag, Bg, plan=plan) for _ in range(2))
    assert P1.indices is not P2.indices and P1.indices is not Sg.indices
    for P in (P1, P2):
        np.testing.assert_array_equal(P.indices.get(), S.indices)
        np.testing.assert_array_equal(P.indptr.get(), S.indptr)
        _close(P, _reference(S, A, B, True), np.float64)
    P1.sort_indices()  # in place, on its own arrays only
    np.testing.assert_array_equal(P2.indices.get(), S.indices)
    np.testing.assert_array_equal(Sg.indices.get(), S.indices)


def test_sddmm_planned_calls_back_to_back_on_two_streams_with_refusals_between():
    import cupy

    from mgpu.backends import flags

    S, A, B = _problem(np.float32, 32, m=1000, n=800, density=0.02, seed=4)
    Sg, Ag, Bg = _gpu(S, A, B)
    plan = mgpu.sddmm_plan(Sg, 32, scheme="csr")
    bad = _gpu(_with(B, (8, 9), np.nan))[0]
    cupy.cuda.Device().synchronize()
    s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    kept = []
    for i in range(200):
        with s1 if i % 2 else s2:
            kept.append(mgpu.sddmm(Sg, Ag * (i + 1), Bg, plan=plan, hadamard=bool(i % 3)))
            if i % 7 == 3:
                with pytest.raises(ValueError, match=r"'B' .* \(first at row 8, column 9\)"):
                    mgpu.sddmm(Sg, Ag, bad, plan=plan)
    cupy.cuda.Device().synchronize()
    ref = {h: _reference(S, A, B, h) for h in (False, True)}
    for i, P in enumerate(kept):
        _close(P, (i + 1) * ref[bool(i % 3)], np.float32)
    assert all(len(page.free) == flags._SLOTS for page in flags._pages)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sddmm_repeated_call_without_a_plan_takes_the_prepared_call(dtype, monkeypatch):
    """A call without a plan on an S run before takes that S's prepared call (kept for its
    K and dtype while S lives): the float64 reference's values, index arrays of its own,
    NaN and infinity refused in the general path's words; another K, an S with new index
    arrays, factors of another dtype and an S not known free of duplicates take the general
    path; the entry goes with S."""
    import gc

    import cupy
    import cupyx.scipy.sparse as csp

    from mgpu.backends import cupy_sddmm_plan as prep

    S, A, B = _problem(dtype, 32, seed=5)
    Sg, Ag, Bg = _gpu(S, A, B)
    taken = []
    real = prep.PlannedCall.__call__

    def spy(self, *args):
        out = real(self, *args)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(prep.PlannedCall, "__call__", spy)
    assert id(Sg) not in prep._REPEAT
    first = mgpu.sddmm(Sg, Ag, Bg)  # the general path, which prepares the next
    assert taken == [] and id(Sg) in prep._REPEAT
    for hadamard in (True, False):
        ref = _reference(S, A, B, hadamard)
        for check_finite in (True, False):
            P = mgpu.sddmm(Sg, Ag * 2, Bg, hadamard=hadamard, check_finite=check_finite)
            assert taken[-1] is True
            _close(P, 2 * ref, dtype)
            assert P.indices is not Sg.indices and P.indices is not first.indices
            np.testing.assert_array_equal(P.indices.get(), S.indices)
            np.testing.assert_array_equal(P.indptr.get(), S.indptr)
    _close(first, _reference(S, A, B, True), dtype)  # untouched by the calls after it
    n = len(taken)
    with pytest.raises(ValueError, match=r"The 'B' parameter of sddmm holds NaN or infinity "
                                         r"\(first at row 3, column 9\)"):
        mgpu.sddmm(Sg, Ag, _gpu(_with(B, (3, 9), np.inf))[0])
    assert taken[n:] == [True]
    # another K: the general path, then its own entry
    mgpu.sddmm(Sg, Ag[:, :16].copy(), Bg[:, :16].copy())
    assert len(taken) == n + 1
    _close(mgpu.sddmm(Sg, Ag[:, :16].copy(), Bg[:, :16].copy()),
           _reference(S, A[:, :16], B[:, :16], True), dtype)
    assert taken[-1] is True
    # factors of another dtype: converted by the general path, as before
    other = np.float64 if dtype == np.float32 else np.float32
    n = len(taken)
    _close(mgpu.sddmm(Sg, Ag.astype(other), Bg.astype(other)), _reference(S, A, B, True),
           np.float32)
    assert taken[n:] in ([], [False])
    # new index arrays on the same S: not the prepared S any more
    Sg.indices = Sg.indices.copy()
    n = len(taken)
    _close(mgpu.sddmm(Sg, Ag, Bg), _reference(S, A, B, True), dtype)
    assert taken[n:] == [False]
    _close(mgpu.sddmm(Sg, Ag, Bg), _reference(S, A, B, True), dtype)
    assert taken[-1] is True  # prepared again for the new arrays
    # S not known free of duplicates: never prepared
    D = csp.csr_matrix(Sg)
    D._has_canonical_format = False
    D._has_sorted_indices = False
    n = len(taken)
    for _ in range(2):
        _close(mgpu.sddmm(D, Ag, Bg), _reference(S, A, B, True), dtype)
    assert taken[n:] == [] and id(D) not in prep._REPEAT
    # a dense S on the GPU: refused by the general path, as before
    with pytest.raises((TypeError, ValueError), match=r"'S' parameter of sddmm"):
        mgpu.sddmm(cupy.asarray(S.toarray()), Ag, Bg)
    key = id(Sg)
    del Sg, P, first
    gc.collect()
    assert key not in prep._REPEAT
    cupy.cuda.Device().synchronize()
