"""The checked GPU calls of SDDMM, SpMV and SpMM: one finiteness flag a call, in pinned host
memory, read after the call's one wait (mgpu.backends.flags).

Refusals name the first bad place as the host checks do; every value of a factor or of x is
checked, also one that no stored value of S or A reads (refused all the same: a factor
holding NaN is bad input whatever the pattern); the flag of a refused call never reaches the
next one; calls on several streams keep their own flags.
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import mgpu
from conftest import sddmm_problem, to_gpu as _gpu
from conftest import sddmm_reference as _sddmm_reference

pytestmark = pytest.mark.gpu


@pytest.fixture(params=["own block", "search launch"])
def tile_search(request, monkeypatch):
    """Each SpMV tile found on the merge path by its own block, or by a search launch first
    (as in test_spmv.py: both forced here)."""
    from mgpu.backends import cupy_spmv as gpu

    monkeypatch.setattr(gpu, "_SEARCH_WAVES", 10**9 if request.param == "own block" else 0)
    return request.param


def _problem(dtype, seed=0, m=400, n=300, K=24):
    """S with empty rows 10..19 and empty columns 50..59, factors, all on the host."""
    return sddmm_problem(dtype, K, m=m, n=n, density=0.03, seed=seed)


def _tol(dtype) -> float:
    return 1e-5 if dtype == np.float32 else 1e-12


def _close(P, ref, dtype) -> None:
    got = P.data.get().astype(np.float64)
    scale = max(float(np.abs(ref).max(initial=0.0)), 1e-300)
    assert float(np.abs(got - ref).max(initial=0.0)) / scale <= _tol(dtype)


def _with(X, at, value):
    X = X.copy()
    X[at] = value
    return X


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sddmm_checked_call_refuses_nan_and_inf_at_the_first_place(dtype):
    S, A, B = _problem(dtype)
    msg = r"The '{}' parameter of sddmm holds NaN or infinity \(first at row {}, column {}\)"
    cases = [
        ("A", _with(_with(A, (7, 3), np.nan), (200, 1), np.inf), B, 7, 3),
        ("B", A, _with(B, (33, 20), -np.inf), 33, 20),
        # rows of A that no nonzero of S touches (S's rows 10..19 are empty), and columns
        # of S that are empty (B's rows 50..59): refused, as on the CPU
        ("A", _with(A, (12, 0), np.nan), B, 12, 0),
        ("B", A, _with(B, (55, 23), np.inf), 55, 23),
    ]
    for name, Ab, Bb, r, c in cases:
        for hadamard in (True, False):
            with pytest.raises(ValueError, match=msg.format(name, r, c)):
                mgpu.sddmm(*_gpu(S, Ab, Bb), hadamard=hadamard)
    # A is reported before B, and both before S's values
    Sb = S.copy()
    Sb.data[5] = np.nan
    with pytest.raises(ValueError, match=msg.format("A", 7, 3)):
        mgpu.sddmm(*_gpu(Sb, _with(A, (7, 3), np.nan), _with(B, (1, 1), np.nan)))
    with pytest.raises(ValueError, match=msg.format("B", 1, 1)):
        mgpu.sddmm(*_gpu(Sb, A, _with(B, (1, 1), np.nan)))
    row = int(np.searchsorted(S.indptr, 5, side="right") - 1)
    with pytest.raises(ValueError, match=rf"The 'S' parameter of sddmm holds NaN or infinity "
                       rf"\(row {row}, column {S.indices[5]}\); clean it, or pass "
                       r"hadamard=False"):
        mgpu.sddmm(*_gpu(Sb, A, B))
    # S's values are not used without hadamard: no refusal, the plain sampled product
    _close(mgpu.sddmm(*_gpu(Sb, A, B), hadamard=False), _sddmm_reference(S, A, B, False), dtype)
    # an empty pattern still has its factors checked; a float32 factor beside a float64 one
    with pytest.raises(ValueError, match=msg.format("A", 2, 2)):
        mgpu.sddmm(*_gpu(sp.csr_matrix(S.shape, dtype=dtype), _with(A, (2, 2), np.nan), B))
    with pytest.raises(ValueError, match=msg.format("B", 4, 0)):
        mgpu.sddmm(*_gpu(S, A.astype(np.float64), _with(B, (4, 0), np.inf).astype(np.float32)))
    # unchecked: no refusal, NaN only where it spreads
    P = mgpu.sddmm(*_gpu(S, _with(A, (12, 0), np.nan), B), check_finite=False)
    _close(P, _sddmm_reference(S, A, B, True), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sddmm_with_a_plan_and_a_tiled_scheme_is_checked_too(dtype):
    S, A, B = _problem(dtype, seed=1, m=3000, n=2000, K=64)
    Sg, Ag, Bg = _gpu(S, A, B)
    for scheme in ("csr", "sm-l2"):
        plan = mgpu.sddmm_plan(Sg, 64, scheme=scheme)
        _close(mgpu.sddmm(Sg, Ag, Bg, plan=plan), _sddmm_reference(S, A, B, True), dtype)
        with pytest.raises(ValueError, match=r"'B' parameter of sddmm holds NaN or infinity "
                           r"\(first at row 1999, column 63\)"):
            mgpu.sddmm(Sg, Ag, _gpu(_with(B, (1999, 63), np.nan))[0], plan=plan)
        _close(mgpu.sddmm(Sg, Ag, Bg, plan=plan), _sddmm_reference(S, A, B, True), dtype)


def test_sddmm_many_calls_back_to_back_and_refused_calls_between():
    """300 calls: the results of good calls kept and compared at the end (no buffer reused
    under a result still held), every seventh call refused, the next good call fine; the
    flags all back in their page afterwards."""
    import cupy

    from mgpu.backends import flags

    S, A, B = _problem(np.float32, seed=2)
    Sg, Ag, Bg = _gpu(S, A, B)
    bad = _gpu(_with(A, (3, 4), np.inf))[0]
    rng = np.random.default_rng(3)
    scales = rng.uniform(0.5, 2.0, size=300).astype(np.float32)
    kept = []
    for i, s in enumerate(scales):
        if i % 7 == 3:
            with pytest.raises(ValueError, match=r"\(first at row 3, column 4\)"):
                mgpu.sddmm(Sg, bad, Bg)
        kept.append(mgpu.sddmm(Sg, Ag * s, Bg, hadamard=bool(i % 2)))
    ref = {h: _sddmm_reference(S, A, B, h) for h in (False, True)}
    for i, (s, P) in enumerate(zip(scales, kept)):
        _close(P, float(s) * ref[bool(i % 2)], np.float32)
    cupy.cuda.Device().synchronize()
    assert all(len(page.free) == flags._SLOTS for page in flags._pages)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_spmv_and_spmm_checked_calls_refuse_any_bad_value_of_x(dtype, tile_search):
    """x's NaN anywhere (the blocks of the merge kernel scan it in shares, whether a tile
    finds its place itself or by a search launch), in entries no stored value reads, on
    matrices of one tile and of many, with a compacting plan too."""
    rng = np.random.default_rng(4)
    for m, n, density in ((30, 50_000, 1e-4), (20_000, 3_000, 2e-3), (5, 7, 0.3)):
        A = sp.random(m, n, density=density, format="csr", random_state=rng, dtype=dtype)
        A.data += 0.5
        read = np.zeros(n, bool)
        read[A.indices] = True
        x = rng.standard_normal(n).astype(dtype)
        for at in sorted({0, n - 1, int(np.flatnonzero(~read)[-1]) if (~read).any() else 0}):
            xb = _with(x, at, np.nan)
            Ag, xg = _gpu(A, xb)
            with pytest.raises(ValueError, match=rf"The 'x' parameter of spmv holds NaN or "
                               rf"infinity \(first at index {at}\)"):
                mgpu.spmv(Ag, xg)
            with pytest.raises(ValueError, match=rf"\(first at index {at}\)"):
                mgpu.spmv(Ag, xg, plan=mgpu.spmv_plan(Ag))
        Ag, xg = _gpu(A, x)
        ref = A.astype(np.float64) @ x.astype(np.float64)
        for plan in (None, mgpu.spmv_plan(Ag)):
            y = mgpu.spmv(Ag, xg, plan=plan).get()
            assert np.abs(y - ref).max(initial=0) <= _tol(dtype) * max(np.abs(ref).max(), 1)
        Ab = A.copy()
        Ab.data[-1] = np.inf
        r = int(np.searchsorted(A.indptr, A.nnz - 1, side="right") - 1)
        for func, v in ((mgpu.spmv, x), (mgpu.spmm, np.stack([x, x], axis=1))):
            with pytest.raises(ValueError, match=rf"The 'A' parameter of {func.__name__} holds "
                               rf"NaN or infinity \(first at row {r}, column {A.indices[-1]}\)"):
                func(*_gpu(Ab, v))


def test_spmv_many_calls_and_refusals_between():
    rng = np.random.default_rng(5)
    A = sp.random(3000, 2000, density=0.01, format="csr", random_state=rng)
    x = rng.standard_normal(2000)
    Ag, xg = _gpu(A, x)
    xbad = _gpu(_with(x, 1234, np.inf))[0]
    ref = A @ x
    kept = []
    for i in range(300):
        if i % 11 == 5:
            with pytest.raises(ValueError, match=r"\(first at index 1234\)"):
                mgpu.spmv(Ag, xbad)
        kept.append(mgpu.spmv(Ag, xg * (i + 1)))
    for i, y in enumerate(kept):
        np.testing.assert_allclose(y.get(), (i + 1) * ref, rtol=1e-12, atol=1e-12)


def test_checked_calls_on_two_streams():
    """Calls on two non-blocking streams, interleaved with refused calls on each: each
    stream's call waits for its own work and reads its own flag."""
    import cupy

    S, A, B = _problem(np.float64, seed=6)
    Sg, Ag, Bg = _gpu(S, A, B)
    bad = _gpu(_with(B, (8, 9), np.nan))[0]
    rng = np.random.default_rng(7)
    Ad = sp.random(2000, 1500, density=0.01, format="csr", random_state=rng)
    x = rng.standard_normal(1500)
    Adg, xg = _gpu(Ad, x)
    xbad = _gpu(_with(x, 77, -np.inf))[0]
    cupy.cuda.Device().synchronize()  # the operands are ready for every stream
    s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    out = []
    for i in range(20):
        with s1 if i % 2 else s2:
            out.append((mgpu.sddmm(Sg, Ag * (i + 1), Bg), mgpu.spmv(Adg, xg * (i + 1))))
        with s2 if i % 2 else s1:
            with pytest.raises(ValueError, match=r"'B' .* \(first at row 8, column 9\)"):
                mgpu.sddmm(Sg, Ag, bad)
            with pytest.raises(ValueError, match=r"'x' .* \(first at index 77\)"):
                mgpu.spmv(Adg, xbad)
    cupy.cuda.Device().synchronize()
    ref_p, ref_y = _sddmm_reference(S, A, B, True), Ad @ x
    for i, (P, y) in enumerate(out):
        _close(P, (i + 1) * ref_p, np.float64)
        np.testing.assert_allclose(y.get(), (i + 1) * ref_y, rtol=1e-12, atol=1e-12)


def test_flag_slots_are_zeroed_when_taken_and_kept_out_while_a_kernel_may_write():
    import cupy

    from mgpu.backends import flags

    good = cupy.ones(1000, cupy.float32)
    bad = good.copy()
    bad[999] = np.nan
    with flags.device_flag() as f:
        flags.flag_nonfinite((good, bad[::2], bad), f)  # a strided array is copied first
        assert f.raised() and f.raised()  # read once, then remembered
    with flags.device_flag() as g:  # the same slot, zeroed
        flags.flag_nonfinite((good, good.astype(cupy.float64)), g)
        assert not g.raised()
    with pytest.raises(RuntimeError, match="between"):
        with flags.device_flag() as h:
            flags.flag_nonfinite((bad,), h)
            raise RuntimeError("an error between the launches and the read")
    with flags.device_flag() as k:  # given back after a wait: zeroed again
        flags.flag_nonfinite((good,), k)
        assert not k.raised()
    cupy.cuda.Device().synchronize()
    assert all(len(page.free) == flags._SLOTS for page in flags._pages)
