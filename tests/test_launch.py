"""The launcher of the hot small-call kernels (mgpu.backends.launch): the argument slots'
layout and packing on the CPU (a wrong size or offset would be silent garbage on the
device), and on the GPU the same results as CuPy's own launch, for a kernel of every
argument type and for the SDDMM, flag and SpMV kernels that use it."""
from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest
import scipy.sparse as sp

from mgpu.backends import launch


def test_layout_of_a_signature_of_every_kind():
    fmt, offsets, sizes = launch.layout("pqifdp")
    assert offsets == (0, 8, 16, 24, 32, 40)
    assert sizes == (8, 8, 4, 4, 8, 8)
    assert struct.calcsize(fmt) == 6 * launch.SLOT  # each value in its own 8-byte slot
    assert launch.layout("") == ("<", (), ())
    with pytest.raises(ValueError, match=r"argument 2 of kernel signature 'ppx' is 'x'; "
                       r"expected one of pqifd"):
        launch.layout("ppx")


class _Function:
    ptr = 0x1234


def _captured(signature: str, args: tuple, grid=(7,), block=(128,), shared_mem=0):
    """Launch through a stand-in driver call; return its arguments and the bytes each
    kernelParams entry points at (as many as the parameter's size)."""
    seen = {}

    class _Stream:
        ptr = 0xABC

    def fake_launch(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        _, _, sizes = launch.layout(signature)
        table = (ctypes.c_void_p * len(signature)).from_address(params)
        seen["call"] = (f, gx, gy, gz, bx, by, bz, smem, stream, extra)
        seen["bytes"] = [ctypes.string_at(table[i], n) for i, n in enumerate(sizes)]

    L = launch.Launcher(_Function(), signature, launch=fake_launch,
                        current_stream=lambda: _Stream())
    L(grid, block, args, shared_mem)
    return seen


def test_packed_values_are_what_each_parameter_reads():
    args = (0xDEAD_BEEF_0000_1000, -3, -(2**40), 1.5, -2.25, 0, 2**31 - 1)
    seen = _captured("piqfdpi", args, grid=(5, 2), block=(32, 8), shared_mem=96)
    assert seen["call"] == (0x1234, 5, 2, 1, 32, 8, 1, 96, 0xABC, 0)
    want = [struct.pack("<Q", args[0]), struct.pack("<i", -3), struct.pack("<q", -(2**40)),
            struct.pack("<f", 1.5), struct.pack("<d", -2.25), struct.pack("<Q", 0),
            struct.pack("<i", 2**31 - 1)]
    assert seen["bytes"] == want


def test_a_later_call_overwrites_every_slot():
    L_args = [(1, 2, 3.0), (4, -5, -6.5)]
    out = []
    for args in L_args:
        out.append(_captured("pif", args)["bytes"])
    assert out[1] == [struct.pack("<Q", 4), struct.pack("<i", -5), struct.pack("<f", -6.5)]


@pytest.mark.parametrize("signature, args, error, match", [
    ("i", (2**31,), struct.error, "format requires"),          # past int32: never truncated
    ("q", (2**63,), struct.error, "out of range"),
    ("p", (-1,), struct.error, "out of range"),                # a negative address
    ("p", (np.zeros(3),), TypeError, "integer"),               # an array for its address
    ("i", (1.5,), struct.error, "integer"),                    # a float for an int
    ("pq", (1,), struct.error, "pack_into expected 2 items"),  # too few values
])
def test_values_that_do_not_fit_their_type_are_refused(signature, args, error, match):
    with pytest.raises(error, match=match):
        _captured(signature, args)


def _prepared(signature: str, args: tuple, free: tuple, grid=(3,), block=(64,), smem=0):
    """A PreparedLaunch through a stand-in driver call; the calls' arguments and the bytes
    each kernelParams entry points at, per launch, go to the returned list."""
    seen = []

    class _Stream:
        ptr = 0xABC

    def fake_launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        _, _, sizes = launch.layout(signature)
        table = (ctypes.c_void_p * len(signature)).from_address(params)
        seen.append(((f, gx, gy, gz, bx, by, bz, shared, stream, extra),
                     [ctypes.string_at(table[i], n) for i, n in enumerate(sizes)]))

    L = launch.Launcher(_Function(), signature, launch=fake_launch,
                        current_stream=lambda: _Stream())
    return L.prepare(grid, block, args, free, shared_mem=smem), seen


def test_a_prepared_launch_packs_its_fixed_arguments_once_and_writes_the_free_ones():
    args = (0, 7, -(2**40), 0, 1.5, 2**31 - 1, 0)
    prepared, seen = _prepared("piqpfip", args, free=(0, 3, 6), grid=(5, 2), block=(32, 8),
                               smem=48)
    prepared(0xDEAD_0000_1000, 0x10, 2**64 - 1)
    prepared(0x20, 0, 0x30)
    assert [call for call, _ in seen] == [(0x1234, 5, 2, 1, 32, 8, 1, 48, 0xABC, 0)] * 2
    fixed = [struct.pack("<i", 7), struct.pack("<q", -(2**40)), struct.pack("<f", 1.5),
             struct.pack("<i", 2**31 - 1)]
    for (_, got), ptrs in zip(seen, [(0xDEAD_0000_1000, 0x10, 2**64 - 1), (0x20, 0, 0x30)]):
        assert [got[i] for i in (1, 2, 4, 5)] == fixed  # untouched by the calls
        assert [got[i] for i in (0, 3, 6)] == [struct.pack("<Q", p) for p in ptrs]


def test_a_prepared_launch_refuses_what_is_not_a_device_address():
    prepared, seen = _prepared("pip", (0, 1, 0), free=(0, 2))
    with pytest.raises(TypeError):
        prepared(np.zeros(3), 0)  # an array for its address
    with pytest.raises(ValueError, match=r"argument 2: a negative device address \(-8\)"):
        prepared(0, -8)
    with pytest.raises(ValueError, match="zip"):
        prepared(0)  # one address short
    assert not seen  # none of them launched
    with pytest.raises(ValueError, match=r"argument 1 of kernel signature 'pip' cannot change "
                                         r"per call: only pointers \('p'\) do"):
        _prepared("pip", (0, 1, 0), free=(0, 1))
    with pytest.raises(ValueError, match="argument 3 of kernel signature 'pip' cannot"):
        _prepared("pip", (0, 1, 0), free=(3,))
    with pytest.raises(struct.error):  # the fixed values are packed as a launcher packs them
        _prepared("pip", (0, 2**31, 0), free=(0,))


# ------------------------------------------------------------------------------------ GPU

_MIXED = r"""
extern "C" __global__ void mixed(int a, long long b, float c, double d, const float* e,
                                 int f, double g, long long h, double* out, float* echo) {
    out[0] = a; out[1] = (double)b; out[2] = c; out[3] = d; out[4] = f; out[5] = g;
    out[6] = (double)h;
    echo[threadIdx.x] = e[threadIdx.x] * 2.0f;
}
"""


@pytest.mark.gpu
def test_every_argument_type_reaches_the_kernel_as_cupys_launch_passes_it():
    import cupy

    kernel = cupy.RawKernel(_MIXED, "mixed")
    e = cupy.arange(32, dtype=cupy.float32)
    vals = (-7, -(2**40) + 3, 1.25, -3.0e200, 2**31 - 1, 0.5, 2**62 + 1)
    out1, echo1 = cupy.full(7, np.nan), cupy.zeros(32, cupy.float32)
    out2, echo2 = cupy.full(7, np.nan), cupy.zeros(32, cupy.float32)
    kernel((1,), (32,), (np.int32(vals[0]), np.int64(vals[1]), np.float32(vals[2]),
                         np.float64(vals[3]), e, np.int32(vals[4]), np.float64(vals[5]),
                         np.int64(vals[6]), out1, echo1))
    L = launch.Launcher(kernel.kernel, "iqfdpidqpp")
    L((1,), (32,), (vals[0], vals[1], vals[2], vals[3], e.data.ptr, vals[4], vals[5],
                    vals[6], out2.data.ptr, echo2.data.ptr))
    want = np.array([vals[0], vals[1], 1.25, -3.0e200, vals[4], 0.5, float(vals[6])])
    np.testing.assert_array_equal(out1.get(), want)
    np.testing.assert_array_equal(out2.get(), out1.get())
    np.testing.assert_array_equal(echo2.get(), 2 * np.arange(32, dtype=np.float32))


@pytest.mark.gpu
def test_launches_on_the_current_stream():
    """The launch goes to the stream current at the call: captured into a graph on a
    non-blocking stream, it has run nowhere until the graph is launched (a launch on any
    other stream would have written ``out`` at once, and left the graph empty)."""
    import cupy

    kernel = cupy.RawKernel(_MIXED, "mixed")
    e = cupy.ones(32, dtype=cupy.float32)
    out, echo = cupy.zeros(7), cupy.zeros(32, cupy.float32)
    L = launch.Launcher(kernel.kernel, "iqfdpidqpp")
    L((1,), (32,), (0, 0, 0.0, 0.0, e.data.ptr, 0, 0.0, 0, out.data.ptr, echo.data.ptr))
    cupy.cuda.Device().synchronize()  # compiled and loaded, the operands ready
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        try:
            L((1,), (32,), (1, 2, 3.0, 4.0, e.data.ptr, 5, 6.0, 7, out.data.ptr,
                            echo.data.ptr))
        finally:
            graph = s.end_capture()
    cupy.cuda.Device().synchronize()
    np.testing.assert_array_equal(out.get(), np.zeros(7))  # captured, not run
    graph.launch(s)
    s.synchronize()
    np.testing.assert_array_equal(out.get(), [1, 2, 3, 4, 5, 6, 7])
    np.testing.assert_array_equal(echo.get(), np.full(32, 2, dtype=np.float32))


@pytest.mark.gpu
def test_a_thread_whose_first_cuda_call_is_a_launch_gets_the_devices_context():
    """A thread that has made no CUDA runtime call (a Dask worker's thread) has no current
    context; the driver's launch would fail there with CUDA_ERROR_INVALID_CONTEXT. Its
    first products, with operands made in the main thread, must run and be right."""
    import threading

    import cupy
    import cupyx.scipy.sparse as csp

    import mgpu

    S, A, B = _sddmm_problem(np.float32, np.int32)
    x = np.random.default_rng(3).standard_normal(S.shape[1]).astype(np.float32)
    Sd, Ad, Bd, xd = csp.csr_matrix(S), cupy.asarray(A), cupy.asarray(B), cupy.asarray(x)
    cupy.cuda.Device().synchronize()
    got, errors = {}, []

    def work():
        try:
            got["sddmm"] = mgpu.sddmm(Sd, Ad, Bd).get().toarray()
            got["spmv"] = mgpu.spmv(Sd, xd).get()
        except Exception as e:  # the main thread re-raises it below
            errors.append(e)

    for _ in range(2):  # two fresh threads: the binding is per thread
        t = threading.Thread(target=work)
        t.start()
        t.join()
        assert not errors, errors[0]
        S64 = S.astype(np.float64)
        want = S64.multiply(A.astype(np.float64) @ B.astype(np.float64).T).toarray()
        np.testing.assert_allclose(got["sddmm"], want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got["spmv"], S64 @ x.astype(np.float64), rtol=1e-5,
                                   atol=1e-5)


def _sddmm_problem(dtype, index, m=700, n=500, K=40, seed=0):
    rng = np.random.default_rng(seed)
    S = sp.random(m, n, density=0.02, format="csr", random_state=rng, dtype=np.float64)
    S.data += 0.5
    S = S.astype(dtype)
    S.indptr, S.indices = S.indptr.astype(index), S.indices.astype(index)
    A = rng.standard_normal((m, K)).astype(dtype)
    B = rng.standard_normal((n, K)).astype(dtype)
    return S, A, B


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("index", [np.int32, np.int64])
@pytest.mark.parametrize("K", [40, 7])
def test_sddmm_csr_launch_matches_cupys_launch_of_the_same_kernel(dtype, index, K):
    """The product, P's index arrays and the flag from one launch of the launcher, against
    CuPy's launch of the same instantiation (bit for bit) and a float64 reference."""
    import cupy
    import cupyx.scipy.sparse as csp

    from mgpu.backends import cupy as gpu
    from mgpu.backends.flags import device_flag

    S, A, B = _sddmm_problem(dtype, index, K=K)
    Sg = csp.csr_matrix(S)
    Sg.indptr, Sg.indices = cupy.asarray(S.indptr), cupy.asarray(S.indices)
    Ag, Bg = cupy.asarray(A), cupy.asarray(B)
    for hadamard in (False, True):
        values, indices, indptr = gpu.csr_output(Sg, Ag.dtype)
        with device_flag() as flag:
            gpu.run_csr(Sg, Ag, Bg, hadamard, values, indices, indptr,
                        (Ag, Bg, Sg.data) if hadamard else (Ag, Bg), flag)
            assert not flag.raised()
        W = gpu._vector_width(Ag, Bg)
        V = gpu._lanes(K // W)
        nz_per_warp, blocks = gpu._csr_launch(int(Sg.nnz), V)
        expr = f"mgpu_sddmm_csr<{gpu.c_type(Ag.dtype)}, {gpu.c_type(Sg.indptr.dtype)}, {W}, {V}>"
        ref = cupy.empty_like(values)
        null = np.uint64(0)
        gpu._sddmm_function(expr)((blocks,), (256,), (
            Sg.indptr, Sg.indices, Sg.data, Ag, Bg, np.int64(S.shape[0]), np.int64(S.nnz),
            np.int32(K), np.int32(hadamard), np.int32(nz_per_warp), ref, null, null,
            np.int64(blocks), null, np.int64(0), null, np.int64(0), null, np.int64(0), null))
        np.testing.assert_array_equal(values.get(), ref.get())
        np.testing.assert_array_equal(indices.get(), S.indices)
        np.testing.assert_array_equal(indptr.get(), S.indptr)
        rows = np.repeat(np.arange(S.shape[0]), np.diff(S.indptr))
        want = np.einsum("ik,ik->i", A[rows].astype(np.float64), B[S.indices].astype(np.float64))
        if hadamard:
            want *= S.data
        tol = 1e-5 if dtype == np.float32 else 1e-12
        assert np.abs(values.get() - want).max() <= tol * np.abs(want).max()
    # the extra blocks' check: a NaN in the last value of each array, one array at a time
    for name in ("A", "B", "S"):
        Ab, Bb, Sd = Ag.copy(), Bg.copy(), Sg.data.copy()
        {"A": Ab, "B": Bb, "S": Sd}[name].ravel()[-1] = np.inf
        values, indices, indptr = gpu.csr_output(Sg, Ag.dtype)
        with device_flag() as flag:
            gpu.run_csr(Sg, Ab, Bb, True, values, indices, indptr, (Ab, Bb, Sd), flag)
            assert flag.raised(), name


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sddmm_by_every_scheme_gives_p_its_own_index_arrays(dtype):
    """P's indices and indptr are S's, in arrays of P's own (the CSR kernel writes them in
    its launch, the launch after a tiled product copies them), checked or not, hadamard
    or not; a factor's NaN refused by every scheme."""
    import cupy
    import cupyx.scipy.sparse as csp

    import mgpu

    S, A, B = _sddmm_problem(dtype, np.int32, m=3000, n=2000, K=64, seed=3)
    Sg, Ag, Bg = csp.csr_matrix(S), cupy.asarray(A), cupy.asarray(B)
    rows = np.repeat(np.arange(S.shape[0]), np.diff(S.indptr))
    plain = np.einsum("ik,ik->i", A[rows].astype(np.float64), B[S.indices].astype(np.float64))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for scheme in ("csr", "sm-l2", None):
        plan = None if scheme is None else mgpu.sddmm_plan(Sg, 64, scheme=scheme)
        for hadamard in (True, False):
            for check in (True, False):
                P = mgpu.sddmm(Sg, Ag, Bg, plan=plan, hadamard=hadamard, check_finite=check)
                assert P.indices.data.ptr != Sg.indices.data.ptr
                assert P.indptr.data.ptr != Sg.indptr.data.ptr
                np.testing.assert_array_equal(P.indices.get(), S.indices)
                np.testing.assert_array_equal(P.indptr.get(), S.indptr)
                want = plain * S.data if hadamard else plain
                assert np.abs(P.data.get() - want).max() <= tol * np.abs(want).max()
        Bb = Bg.copy()
        Bb[1999, 63] = np.nan
        with pytest.raises(ValueError, match=r"'B' parameter of sddmm holds NaN or infinity "
                           r"\(first at row 1999, column 63\)"):
            mgpu.sddmm(Sg, Ag, Bb, plan=plan)


@pytest.mark.gpu
def test_sddmm_csr_launch_sizes_follow_the_factors_alignment():
    """The CSR launch's remembered sizes and kernel are keyed by the factors' alignment too:
    the same shapes with A 4 bytes off a 16-byte boundary (no vector loads), between calls
    with aligned A, all against a float64 reference, checked and not."""
    import cupy
    import cupyx.scipy.sparse as csp

    import mgpu

    S, A, B = _sddmm_problem(np.float32, np.int32, m=900, n=700, K=32, seed=5)
    Sg, Bg = csp.csr_matrix(S), cupy.asarray(B)
    aligned = cupy.asarray(A)
    buf = cupy.empty(A.size + 1, dtype=cupy.float32)
    off = buf[1:].reshape(A.shape)  # C-ordered, 4 bytes past the pool's alignment
    off[...] = aligned
    assert off.data.ptr % 16 == 4 and off.flags.c_contiguous
    rows = np.repeat(np.arange(S.shape[0]), np.diff(S.indptr))
    want = np.einsum("ik,ik->i", A[rows].astype(np.float64), B[S.indices].astype(np.float64))
    for Ag in (aligned, off, aligned, off):
        for check in (True, False):
            P = mgpu.sddmm(Sg, Ag, Bg, hadamard=False, check_finite=check)
            assert np.abs(P.data.get() - want).max() <= 1e-5 * np.abs(want).max()
            np.testing.assert_array_equal(P.indices.get(), S.indices)


@pytest.mark.gpu
def test_sddmm_of_an_empty_pattern_has_its_index_arrays_and_its_check():
    import cupy
    import cupyx.scipy.sparse as csp

    from mgpu.backends import cupy as gpu
    from mgpu.backends.flags import device_flag

    Sg = csp.csr_matrix((5000, 40), dtype=cupy.float32)
    A = cupy.ones((5000, 8), cupy.float32)
    B = cupy.ones((40, 8), cupy.float32)
    B[39, 7] = np.nan
    with device_flag() as flag:
        P = gpu.sddmm_kernel(Sg, A, B, False, None, flag)
        assert flag.raised()
    assert P.nnz == 0 and P.shape == (5000, 40)
    np.testing.assert_array_equal(P.indptr.get(), np.zeros(5001))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_spmv_carries_added_in_the_merge_launch_match_the_carry_passes(dtype, monkeypatch):
    """The merge launch's last block adds the carries (rows cut by one tile, by hundreds,
    a compacting plan, many calls in a row and on two streams: the counter is set back
    each time) as the passes' own launches do, against a float64 reference."""
    import cupy
    import cupyx.scipy.sparse as csp

    import mgpu
    from mgpu.backends import cupy_spmv as gpu

    rng = np.random.default_rng(1)
    m, n = 3000, 60_000
    A = sp.random(m, n, density=0.0005, format="lil", random_state=rng, dtype=np.float64)
    A[17, :] = rng.standard_normal(n)  # one row over about 150 tiles
    A[2000:2600, :] = 0  # empty rows: the plan compacts A
    A = A.tocsr().astype(dtype)
    x = rng.standard_normal(n).astype(dtype)
    ref = A.astype(np.float64) @ x.astype(np.float64)
    Ag, xg = csp.csr_matrix(A), cupy.asarray(x)
    tol = (1e-5 if dtype == np.float32 else 1e-12) * np.abs(ref).max()
    results = {}
    for fused in (True, False):
        monkeypatch.setattr(gpu, "_FUSED_CARRIES", 4096 if fused else 0)
        got = [mgpu.spmv(Ag, xg * (i + 1)) for i in range(30)]
        got += [mgpu.spmv(Ag, xg, plan=mgpu.spmv_plan(Ag))]
        got += [gpu.spmv_merge(Ag, xg, items=3)]
        s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
        cupy.cuda.Device().synchronize()
        for i in range(10):
            with s1 if i % 2 else s2:
                got.append(mgpu.spmv(Ag, xg * (i + 1)))
        cupy.cuda.Device().synchronize()
        for i, y in enumerate(got[:30]):
            assert np.abs(y.get() - (i + 1) * ref).max() <= (i + 1) * tol
        for y in got[30:32]:
            assert np.abs(y.get() - ref).max() <= tol
        for i, y in enumerate(got[32:]):
            assert np.abs(y.get() - (i + 1) * ref).max() <= (i + 1) * tol
        results[fused] = got[30].get()
    n_tiles = -(-(m + A.nnz) // (128 * gpu.spmv_items(m, A.nnz)))
    assert 1 < n_tiles <= 4096  # the fused case above did add in the merge launch
    np.testing.assert_allclose(results[True], results[False], rtol=0, atol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_spmv_fused_carries_of_thousands_of_tiles(dtype, monkeypatch):
    """Thousands of tiles (each thread of the last block sums a run of up to 32 carries):
    rows cut once or twice, rows cut at the runs' edges, rows over many runs and empty
    rows, added by the merge launch's last block as the carry passes add them, against a
    float64 reference."""
    import cupy
    import cupyx.scipy.sparse as csp

    import mgpu
    from mgpu.backends import cupy_spmv as gpu

    rng = np.random.default_rng(7)
    m, n = 6000, 20_000
    lengths = rng.integers(0, 420, m)
    lengths[rng.random(m) < 0.1] = 0  # empty rows
    lengths[[5, 3000, 5999]] = [19_000, 20_000, 15_000]  # rows over many tiles, the last one
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    indices = rng.integers(0, n, indptr[-1])
    A = sp.csr_matrix((rng.standard_normal(indptr[-1]), indices, indptr), shape=(m, n))
    A.sum_duplicates()  # a long row keeps thousands of distinct columns
    A = A.astype(dtype)
    x = rng.standard_normal(n).astype(dtype)
    ref = A.astype(np.float64) @ x.astype(np.float64)
    n_tiles = -(-(m + A.nnz) // (128 * gpu.spmv_items(m, A.nnz)))
    assert 1000 < n_tiles <= 4096  # fused as patched below, and runs of many carries a thread
    Ag, xg = csp.csr_matrix(A), cupy.asarray(x)
    tol = (1e-5 if dtype == np.float32 else 1e-12) * np.abs(ref).max()
    results = {}
    for fused in (True, False):
        monkeypatch.setattr(gpu, "_FUSED_CARRIES", 4096 if fused else 0)
        got = [mgpu.spmv(Ag, xg * (i + 1)) for i in range(5)]
        for i, y in enumerate(got):
            assert np.abs(y.get() - (i + 1) * ref).max() <= (i + 1) * tol
        results[fused] = got[0].get()
    np.testing.assert_allclose(results[True], results[False], rtol=0, atol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_spmv_captured_in_a_cuda_graph_takes_the_carry_passes(dtype, monkeypatch):
    """A call captured into a CUDA graph on a stream that already has its counter of
    finished blocks (made by a call before the capture, as a warm-up makes it) launches the
    carry passes, not the last block's walk; the graph's replays, with x changed in place
    between them and fused calls on the same stream in between, give the float64
    reference's products."""
    import cupy
    import cupyx.scipy.sparse as csp

    import mgpu
    from mgpu.backends import cupy_spmv as gpu
    from mgpu.backends.graph import Replay

    rng = np.random.default_rng(3)
    m, n = 5000, 40_000
    A = sp.random(m, n, density=0.002, format="lil", random_state=rng, dtype=np.float64)
    A[11, :] = rng.standard_normal(n)  # one row over hundreds of tiles
    A = A.tocsr().astype(dtype)
    x = rng.standard_normal(n).astype(dtype)
    ref = A.astype(np.float64) @ x.astype(np.float64)
    n_tiles = -(-(m + A.nnz) // (128 * gpu.spmv_items(m, A.nnz)))
    assert 1 < n_tiles <= gpu._FUSED_CARRIES  # fused outside a capture
    Ag, xg = csp.csr_matrix(A), cupy.asarray(x)
    tol = (1e-5 if dtype == np.float32 else 1e-12) * np.abs(ref).max()
    passes = []  # the tiles of each call that launched the carry passes
    real = gpu._add_carries

    def spy(*args, **kwargs):
        passes.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(gpu, "_add_carries", spy)
    s = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.Device().synchronize()
    with s:
        y0 = mgpu.spmv(Ag, xg, check_finite=False)  # the stream's counter is made here
        assert not passes  # outside a capture: the merge launch's last block
        assert (cupy.cuda.runtime.getDevice(), s.ptr) in gpu._done
        s.synchronize()
        replay = Replay(lambda: mgpu.spmv(Ag, xg, check_finite=False), s)
    assert passes == [n_tiles]  # the capture took the passes
    assert np.abs(y0.get() - ref).max() <= tol
    for scale in (1.0, -2.0, 0.5):
        with s:
            xg[...] = cupy.asarray(x * dtype(scale))
            y = replay()
            s.synchronize()
        assert np.abs(y.get() - scale * ref).max() <= abs(scale) * tol
    beside = []
    with s:
        xg[...] = cupy.asarray(x)
        for i in range(10):  # replays and fused calls one after another on the stream
            y = replay()
            beside.append(mgpu.spmv(Ag, xg * dtype(i + 1), check_finite=False))
        s.synchronize()
    assert passes == [n_tiles]  # the calls outside the capture took the last block again
    assert np.abs(y.get() - ref).max() <= tol
    for i, got in enumerate(beside):
        assert np.abs(got.get() - (i + 1) * ref).max() <= (i + 1) * tol
