"""mgpu.spgemm of two dask arrays held on the workers, SPMD (mgpu.distributed.spgemm_spmd):
on a CPU LocalCluster (the host communicator), against scipy's ``A @ B``; C's rows cut by
their work; refusals; two GPU workers (NCCL) marked."""
from __future__ import annotations

import importlib

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from distributed import Future

import mgpu
from mgpu.distributed import from_scipy, gather
from mgpu.partition import spgemm_row_work, split_counts

from conftest import canonical as _canonical  # noqa: E402
from conftest import skewed_product as _skewed  # noqa: E402

held = importlib.import_module("mgpu.distributed.spgemm_spmd")


def _operands(seed=0, m=500, k=300, n=400, dtype=np.float64):
    rng = np.random.default_rng(seed)
    A = sp.random(m, k, density=0.02, format="csr", random_state=rng, dtype=np.float64)
    B = sp.random(k, n, density=0.03, format="csr", random_state=rng, dtype=np.float64)
    A.data[A.indptr[7]:A.indptr[8]] = 0.0  # an empty row of A
    A.eliminate_zeros()
    return A.astype(dtype), B.astype(dtype)


def _assert_equal(C, ref, rtol=1e-12):
    assert isinstance(C, da.Array)
    got, ref = gather(C), _canonical(ref)
    assert got.shape == ref.shape and got.dtype == C.dtype
    np.testing.assert_array_equal(got.indptr, ref.indptr)
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_allclose(got.data, ref.data, rtol=rtol, atol=0)


def _tiles_held(C):
    """C's chunks are futures of finished tasks (held on the workers), one per worker."""
    graph = dict(C.__dask_graph__())
    futures = [graph[key] for (key,) in C.__dask_keys__()]
    assert all(isinstance(f, Future) and f.status == "finished" for f in futures)
    return futures


@pytest.mark.parametrize(("a_parts", "b_parts"), [(2, 2), (3, 2), (2, 5), (4, 4)])
def test_two_held_operands_equal_scipy(client, a_parts, b_parts):
    A, B = _operands()
    C = mgpu.spgemm(from_scipy(A, a_parts), from_scipy(B, b_parts))
    _assert_equal(C, A @ B)
    # one tile of C per worker holding A's tiles, cut at prefix sums of the rows' work
    futures = _tiles_held(C)
    assert len(futures) == 2
    bounds = split_counts(spgemm_row_work(A, B), 2)
    assert C.chunks[0] == tuple(int(s) for s in np.diff(bounds))
    assert client.who_has(futures) and all(client.who_has(futures).values())
    assert all(not v for v in client.run(lambda: len(held._HELD)).values())


def test_c_is_cut_by_work_not_by_as_tiles(client):
    """A's tiles are cut at nnz prefix sums (rows 0..99 and 100..199 in equal halves); C's
    rows at prefix sums of the work, so the light rows and a few heavy ones go together."""
    A, B = _skewed()
    At = from_scipy(A, 2)
    assert At.chunks[0] == (100, 100)
    C = mgpu.spgemm(At, from_scipy(B, 2))
    _assert_equal(C, A @ B)
    work = spgemm_row_work(A, B)
    assert C.chunks[0] != (100, 100)
    halves = [work[:C.chunks[0][0]].sum(), work[C.chunks[0][0]:].sum()]
    assert max(halves) - min(halves) <= work.max()


def test_a_times_its_transpose_float32_and_dense_chunks(client):
    A, _ = _operands(seed=3, dtype=np.float32)
    C = mgpu.spgemm(from_scipy(A, 2), from_scipy(sp.csr_matrix(A.T), 2))
    assert C.dtype == np.float32
    _assert_equal(C, (A.astype(np.float64) @ A.T.astype(np.float64)).astype(np.float32),
                  rtol=1e-5)
    # a dask array of dense chunks of your own: made CSR on the workers; int values: float64
    D = da.from_array(A.toarray().round().astype(np.int64), chunks=(150, -1))
    Bd = from_scipy(sp.csr_matrix(A.T), 2)
    C = mgpu.spgemm(D, Bd)
    assert C.dtype == np.float64
    _assert_equal(C, sp.csr_matrix(A.toarray().round()) @ A.T.astype(np.float64))


def test_sparse_array_tiles_give_sparse_array_tiles(client):
    A, B = _operands(seed=2)
    Ad = da.from_array(sp.csr_array(A), chunks=(250, -1), asarray=False)
    C = mgpu.spgemm(Ad, from_scipy(B, 2))
    assert isinstance(C._meta, sp.csr_array)
    kinds = client.gather(client.map(lambda c: type(c).__name__, _tiles_held(C)))
    assert kinds == ["csr_array", "csr_array"]
    _assert_equal(C, A @ B)


def test_an_empty_product_and_more_workers_than_work(client):
    A = sp.csr_matrix((40, 30))
    B = sp.random(30, 20, density=0.1, format="csr", random_state=0)
    C = mgpu.spgemm(from_scipy(A, 2), from_scipy(B, 2))
    assert gather(C).nnz == 0 and C.shape == (40, 20)
    A2 = sp.csr_matrix(([2.0], ([0], [3])), shape=(40, 30))  # one row with work
    _assert_equal(mgpu.spgemm(from_scipy(A2, 2), from_scipy(B, 2)), A2 @ B)


def test_a_nan_in_a_tile_is_refused_naming_its_row(client):
    A, B = _operands(seed=5)
    B = B.tolil()
    B[250, 3] = np.inf
    B = B.tocsr()
    with pytest.raises(ValueError, match=r"^The 'B' parameter of spgemm holds NaN or infinity "
                                         r"\(first at row 250, column 3\)"):
        mgpu.spgemm(from_scipy(A, 2), from_scipy(B, 2))
    assert all(not v for v in client.run(lambda: len(held._HELD)).values())


def _told(a, b, room=None):
    """What each rank tells the others: its tiles of A and B as (index, rows, nnz), no
    refusal, its GPU's available bytes."""
    return ([a, b], None, room)


def test_a_refusal_of_any_rank_is_raised_on_every_rank_in_its_own_words():
    every = [_told([(0, (0, 5), 3)], []),
             ([[(1, (5, 9), 2)], []], "The 'A' parameter of spgemm holds NaN (row 7)", None)]
    with pytest.raises(ValueError, match=r"^The 'A' parameter of spgemm holds NaN \(row 7\)$"):
        held._plan(every, ((9, 4), (4, 2)), np.dtype(np.float64), False, "auto")


def test_the_plan_gathers_where_both_fit_else_passes_b_round():
    from mgpu.backends.memory import DeviceMemoryError

    f32 = np.dtype(np.float32)
    shapes = ((2000, 1000), (1000, 3000))
    every = [_told([(0, (0, 1000), 10**6)], [(0, (0, 500), 10**6)], 10**9),
             _told([(1, (1000, 2000), 10**6)], [(1, (500, 1000), 10**6)], 10**9)]
    assert held._plan(every, shapes, f32, True, "auto") == "gather"
    assert held._plan(every, shapes, f32, True, "ring") == "ring"
    assert held._plan(every, shapes, f32, False, "auto") == "gather"  # CPU workers
    # rank 1 has 10 MB: A and B gathered (2e6 nonzeros each, as gathered, padded, and as
    # assembled) do not fit; two blocks of B (500 rows, 1e6 nonzeros each) do
    every[1] = _told(*every[1][0], 2 * 10**7)
    assert held._plan(every, shapes, f32, True, "auto") == "ring"
    need = 2 * (4e6 * 8) + (2 * 2000 + 2 + 2 * 1000 + 2) * 8
    with pytest.raises(DeviceMemoryError, match=rf"A and B gathered take {need / 2**20:.2f} MiB "
                                                r"on every GPU; rank 1's has 19.07 MiB "
                                                r"available\. Set mgpu.spgemm.held-operands"):
        held._plan(every, shapes, f32, True, "gather")
    # nor do two blocks of B: both numbers
    every[1] = _told(*every[1][0], 10**7)
    ring = 2 * (500 * 8 + 10**6 * 8)
    with pytest.raises(DeviceMemoryError, match=rf"passing B's tiles round takes "
                                                rf"{ring / 2**20:.2f} MiB beside A's \(rank 1's "
                                                r"has 9.54 MiB\)"):
        held._plan(every, shapes, f32, True, "auto")
    big = [_told([(0, (0, 10), 2**31)], [(0, (0, 5), 1)], 2**40)]
    with pytest.raises(ValueError, match="A has 2,147,483,648 nonzeros"):
        held._plan(big, ((10, 5), (5, 3)), f32, True, "auto")


@pytest.mark.parametrize(("a_parts", "b_parts"), [(2, 2), (3, 2), (4, 5)])
def test_b_passed_round_the_ring_equals_scipy_in_as_tiles(client, a_parts, b_parts):
    import dask

    A, B = _operands(seed=11)
    At = from_scipy(A, a_parts)
    with dask.config.set({"mgpu.spgemm.held-operands": "ring"}):
        C = mgpu.spgemm(At, from_scipy(B, b_parts))
    _assert_equal(C, A @ B)
    assert C.chunks[0] == At.chunks[0]  # C in A's own tiles
    assert len(_tiles_held(C)) == a_parts
    # integer values: every partial sum exact, so the pattern and values are scipy's
    Ai, Bi = A.copy(), B.copy()
    for X in (Ai, Bi):
        X.data = np.ceil(X.data * 5)  # 1..5
        X.data[::2] *= -1  # and cancellations to exact zeros, which C leaves out
    with dask.config.set({"mgpu.spgemm.held-operands": "ring"}):
        Ci = mgpu.spgemm(from_scipy(Ai, a_parts), from_scipy(Bi, b_parts))
    got, ref = gather(Ci), _canonical(Ai @ Bi)
    assert (abs(Ai) @ abs(Bi)).nnz > ref.nnz  # some sums cancel to exact zeros
    assert (got != ref).nnz == 0 and got.nnz == ref.nnz
    assert all(not v for v in client.run(lambda: len(held._HELD)).values())


def test_a_bad_held_operands_setting_is_refused(client):
    import dask

    A, B = _operands(seed=1)
    with dask.config.set({"mgpu.spgemm.held-operands": "scatter"}):
        with pytest.raises(ValueError, match=r"mgpu.spgemm.held-operands must be one of "
                                             r"\['auto', 'gather', 'ring'\]. Got 'scatter'"):
            mgpu.spgemm(from_scipy(A, 2), from_scipy(B, 2))


@pytest.mark.parametrize(("exc", "message", "call"), [
    (TypeError, r"^The 'B' parameter of spgemm is a dask array, which needs A as one too",
     lambda A, B, t: mgpu.spgemm(A, t["B"])),
    (TypeError, r"^The 'B' parameter of spgemm is a dask array, which needs A as one too",
     lambda A, B, t: mgpu.spgemm(A, t["B"], parts=2)),
    (ValueError, r"^The 'mask' parameter of spgemm is not taken with a dask B",
     lambda A, B, t: mgpu.spgemm(t["A"], t["B"], mask=sp.csr_matrix((A.shape[0], B.shape[1])))),
    (ValueError, r"^The 'B' parameter of spgemm must have A.shape\[1\] = 300 rows",
     lambda A, B, t: mgpu.spgemm(t["A"], t["short"])),
])
def test_refused_before_any_task(client, exc, message, call):
    A, B = _operands(seed=1)
    t = {"A": from_scipy(A, 2), "B": from_scipy(B, 2), "short": from_scipy(B[:200], 2)}
    before = set(client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.tasks)))
    with pytest.raises(exc, match=message):
        call(A, B, t)
    after = set(client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.tasks)))
    assert after - before == set()


def test_a_tile_lost_before_it_was_collected_says_so():
    with pytest.raises(RuntimeError, match=r"rows 10\.\.19 of C were made by worker w"):
        held._take("no-such-job", 0, (10, 20), "w")


@pytest.mark.gpu
@pytest.mark.multi_gpu(2)
def test_two_gpu_workers_gather_through_nccl_and_equal_one_device():
    """Two GPU workers: C's tiles are cupyx on the devices (scipy with to_host), equal to
    the one-device product's rows."""
    import cupyx.scipy.sparse as csp
    import dask

    A, _ = _operands(seed=7, m=3000, k=2000, n=10)
    B = sp.csr_matrix(A.T)
    one = mgpu.spgemm(csp.csr_matrix(A), csp.csr_matrix(B)).get()
    with mgpu.connect(gpus=True, n_workers=2) as client:
        At, Bt = from_scipy(A, 4, client=client), from_scipy(B, 3, client=client)
        C = mgpu.spgemm(At, Bt)
        futures = _tiles_held(C)
        kinds = client.gather(client.map(lambda c: type(c).__module__, futures))
        got = gather(C)
        host = gather(mgpu.spgemm(At, Bt, to_host=True))
        # B's tiles passed round the two GPUs through NCCL, C in A's four tiles
        with dask.config.set({"mgpu.spgemm.held-operands": "ring"}):
            R = mgpu.spgemm(At, Bt)
        assert R.chunks[0] == At.chunks[0] and len(_tiles_held(R)) == 4
        ring = gather(R)
    assert all(k.startswith("cupyx") for k in kinds) and len(futures) == 2
    np.testing.assert_array_equal(ring.indptr, one.indptr)
    np.testing.assert_array_equal(ring.indices, one.indices)
    np.testing.assert_allclose(ring.data, one.data, rtol=1e-12)
    for X in (got, host):
        np.testing.assert_array_equal(X.indptr, one.indptr)
        np.testing.assert_array_equal(X.indices, one.indices)
        np.testing.assert_allclose(X.data, one.data, rtol=1e-12)
