"""mgpu.spgemm across a cluster (``parts=N``, or a dask A), on a CPU LocalCluster, against
scipy's ``A @ B``; the tiles cut by work; refusals before any task. GPU workers marked."""
from __future__ import annotations

import importlib

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from distributed import Future

import mgpu
from mgpu.distributed import chunk_workers, from_scipy, gather, workers_now
from mgpu.distributed.inputs import is_placed
from mgpu.partition import imbalance, part_sums, spgemm_row_work, spgemm_split, split

# the module (mgpu.distributed.spgemm is the function it exports)
dist_spgemm = importlib.import_module("mgpu.distributed.spgemm")


from conftest import canonical as _canonical  # noqa: E402
from conftest import skewed_product as _skewed  # noqa: E402


def _assert_equal(C, ref):
    """C (a dask array of CSR tiles, computed here) canonical, with ref's pattern and values."""
    assert isinstance(C, da.Array)
    got, ref = gather(C), _canonical(ref)
    assert got.shape == ref.shape and got.dtype == C.dtype
    np.testing.assert_array_equal(got.indptr, ref.indptr)
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_allclose(got.data, ref.data, rtol=1e-12, atol=0)
    return got


def _operands(seed=0, m=500, k=300, n=400, dtype=np.float64):
    rng = np.random.default_rng(seed)
    A = sp.random(m, k, density=0.02, format="csr", random_state=rng, dtype=np.float64)
    B = sp.random(k, n, density=0.03, format="csr", random_state=rng, dtype=np.float64)
    if m > 7:
        A.data[A.indptr[7]:A.indptr[8]] = 0.0  # an empty row of A
    A.eliminate_zeros()
    return A.astype(dtype), B.astype(dtype)


def _tasks(dask_scheduler):
    return [str(k) for k in dask_scheduler.tasks]


# ---------------------------------------------------------------- parts=N

@pytest.mark.parametrize("parts", [1, 2, 3])
def test_parts_equals_scipy_and_stays_on_the_workers(client, parts):
    A, B = _operands()
    done = []
    C = mgpu.spgemm(A, B, parts=parts, client=client, progress=done.append)
    assert C.numblocks == (parts, 1) and C.chunks[1] == (B.shape[1],)
    assert C.chunks[0] == tuple(np.diff(spgemm_split(A, B, parts)))
    assert C.name.startswith("mgpu-spgemm-")
    assert type(C._meta) is sp.csr_matrix and C.dtype == np.float64
    # placed, not gathered: each chunk is the future of its own key, held by a worker
    assert is_placed(C) and all(isinstance(v, Future) for v in dict(C.dask).values())
    workers = set(workers_now(client))
    assert all(w and set(w) <= workers for w in chunk_workers(C, client).values())
    work = spgemm_row_work(A, B)
    assert len(done) == parts and sum(done) == int(work.sum())
    _assert_equal(C, A @ B)
    assert (sp.csr_matrix(C.compute()) != A @ B).nnz == 0


def test_the_tiles_are_cut_by_work_not_nnz(client):
    A, B = _skewed()
    by_nnz, by_work = split(A, 2), spgemm_split(A, B, 2)
    work = spgemm_row_work(A, B)
    np.testing.assert_array_equal(work, np.where(np.arange(200) < 100, 5, 300))
    np.testing.assert_array_equal(by_nnz, [0, 100, 200])  # equal nnz: half the rows each
    assert by_work[1] > 140  # the light rows and half the heavy ones against the rest
    assert imbalance(part_sums(work, by_work)) < 1.02 < 1.9 < imbalance(part_sums(work, by_nnz))
    C = mgpu.spgemm(A, B, parts=2, client=client)
    assert C.chunks[0] == tuple(np.diff(by_work))
    _assert_equal(C, A @ B)


def test_row_work_is_each_rows_intermediate_products():
    A, B = _operands(seed=3, m=80, k=60, n=70)
    A.data[::5] = 0.0  # stored zeros count: they cost a pass over their row of B
    pattern = sp.csr_matrix((np.ones(A.nnz), A.indices, A.indptr), shape=A.shape)
    np.testing.assert_array_equal(spgemm_row_work(A, B), pattern @ np.diff(B.indptr))
    np.testing.assert_array_equal(spgemm_row_work(A.tocoo(), B.tocsc()),
                                  spgemm_row_work(A, B))


def test_parts_with_a_mask_float32_and_a_sparse_array(client):
    A, B = _operands(seed=1, dtype=np.float32)
    M = sp.random(A.shape[0], B.shape[1], density=0.2, format="csr", random_state=5)
    C = mgpu.spgemm(sp.csr_array(A), B, mask=M, parts=3)
    assert C.dtype == np.float32 and C.numblocks == (3, 1)
    ref = sp.csr_matrix((A @ B).multiply(M != 0))
    got = gather(C)
    ref = _canonical(ref)
    np.testing.assert_array_equal(got.indptr, ref.indptr)
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_allclose(got.data, ref.data, rtol=1e-5)
    # int operands compute in float64, as on one device
    Ci = mgpu.spgemm(A.astype(np.int64), B.astype(np.int64), parts=2)
    assert Ci.dtype == np.float64


def test_parts_as_many_as_rows_and_an_empty_product(client):
    A, B = _operands(seed=2, m=6, k=5, n=4)
    C = mgpu.spgemm(A, B, parts=6)
    assert sum(C.chunks[0]) == 6 and C.numblocks[0] <= 6
    _assert_equal(C, A @ B)
    Z = mgpu.spgemm(sp.csr_matrix((6, 5)), B, parts=3)  # no work at all: cut by rows
    assert Z.chunks[0] == (2, 2, 2) and gather(Z).nnz == 0


# ---------------------------------------------------------------- a dask A

def test_a_dask_a_from_scipy_equals_scipy_in_its_row_tiles(client):
    A, B = _operands(seed=6)
    tiles = from_scipy(A, 3, axis=0)
    C = mgpu.spgemm(tiles, B)
    assert C.chunks == (tiles.chunks[0], (B.shape[1],))
    assert not is_placed(C)  # lazy
    _assert_equal(C, A @ B)
    # the local op's name routes a dask A here too
    _assert_equal(mgpu.ops.spgemm(tiles, B), A @ B)
    M = sp.random(A.shape[0], B.shape[1], density=0.1, format="csr", random_state=3)
    _assert_equal(mgpu.spgemm(tiles, B, mask=M), sp.csr_matrix((A @ B).multiply(M != 0)))


@pytest.mark.parametrize("kind", ["array", "dense"])
def test_a_users_dask_a_cut_by_columns(client, kind):
    A, B = _operands(seed=7, m=120, k=90, n=70)
    local = sp.csr_array(A) if kind == "array" else A.toarray()
    Ad = da.from_array(local, chunks=(40, 30), asarray=kind == "dense")
    C = mgpu.spgemm(Ad, B)
    assert C.numblocks[1] == 1 and sum(C.chunks[0]) == 120
    got = C.compute()
    assert isinstance(got, sp.sparray) == (kind == "array")
    assert (sp.csr_matrix(got) != A @ B).nnz == 0


def test_nan_in_a_tile_of_a_dask_a_fails_its_task_naming_as_row(client):
    A, B = _operands(seed=8)
    A = A.tolil()
    A[400, 3] = np.inf
    C = mgpu.spgemm(from_scipy(A.tocsr(), 3), B)  # refused when the tile runs, not here
    with pytest.raises(ValueError, match=r"^The 'A' parameter of spgemm holds NaN or infinity "
                                         r"\(first at row 400, column 3\)"):
        C.compute()


def test_a_malformed_tile_of_a_dask_a_fails_its_task_before_any_kernel(client):
    """A tile whose column indices run past A's columns is refused as the one-device op
    refuses it: the kernels would read B's row pointers out of range."""
    A, B = _operands(seed=8)
    A = A.tocsr()
    bad = A[:100].copy()
    bad.indices[0] = A.shape[1] + 5
    tiles = da.concatenate([da.from_array(bad, chunks=bad.shape, asarray=False),
                            da.from_array(A[100:], chunks=(A.shape[0] - 100, A.shape[1]),
                                          asarray=False)])
    C = mgpu.spgemm(tiles, B)  # refused when the tile runs, not here
    with pytest.raises(ValueError, match=r"^The 'A' parameter of spgemm is not a well-formed "
                                         r"CSR matrix"):
        C.compute()


# ---------------------------------------------------------------- refusals, before any task

A0, B0 = _operands(seed=9, m=30, k=20, n=10)


def _nan_b():
    B = B0.copy()
    B.data[2] = np.nan
    return B


REFUSALS = [  # (exception, message, call with the dask tiles of A0, B0 and a mask)
    (TypeError, r"^The 'B' parameter of spgemm is a dask array, which needs A as one too",
     lambda t: mgpu.spgemm(A0, t["B"])),
    (TypeError, r"^The 'B' parameter of spgemm .*dask array",
     lambda t: mgpu.spgemm(A0, da.from_array(B0.toarray()), parts=2)),
    (TypeError, r"^The 'mask' parameter of spgemm .*dask array",
     lambda t: mgpu.spgemm(t["A"], B0, mask=t["mask"])),
    (ValueError, r"^The 'B' parameter of spgemm must have A.shape\[1\] = 20 rows",
     lambda t: mgpu.spgemm(t["A"], B0[:15])),
    (ValueError, r"^The 'B' parameter of spgemm must have A.shape\[1\] = 20 rows",
     lambda t: mgpu.spgemm(A0, B0[:15], parts=2)),
    (ValueError, r"^The 'B' parameter of spgemm holds NaN or infinity \(first at row",
     lambda t: mgpu.spgemm(t["A"], _nan_b())),
    (ValueError, r"^The 'B' parameter of spgemm holds NaN or infinity",
     lambda t: mgpu.spgemm(A0, _nan_b(), parts=2)),
    (TypeError, r"^The 'B' parameter of spgemm must be a scipy or cupyx sparse matrix.*spmm",
     lambda t: mgpu.spgemm(t["A"], B0.toarray())),
    (ValueError, r"^The 'mask' parameter of spgemm must have the result's shape \(30, 10\)",
     lambda t: mgpu.spgemm(t["A"], B0, mask=sp.csr_matrix((30, 11)))),
    (ValueError, r"^The 'mask' parameter of spgemm must have the result's shape",
     lambda t: mgpu.spgemm(A0, B0, mask=sp.csr_matrix((29, 10)), parts=2)),
    (ValueError, r"^The 'parts' parameter of spgemm must be an int >= 1 or None\. Got 0",
     lambda t: mgpu.spgemm(A0, B0, parts=0)),
    (ValueError, r"^The 'parts' parameter of spgemm must be an int",
     lambda t: mgpu.spgemm(A0, B0, parts=1.5)),
    (ValueError, r"^The 'parts' parameter of spgemm must be an int in \[1, 30\] \(at most "
                 r"A's 30 rows\)\. Got 31 instead\.$",
     lambda t: mgpu.spgemm(A0, B0, parts=31)),
    (ValueError, r"^The 'parts' parameter of spgemm is for scipy or cupyx A",
     lambda t: mgpu.spgemm(t["A"], B0, parts=2)),
    (ValueError, r"^The 'progress' parameter of spgemm is for scipy or cupyx A",
     lambda t: mgpu.spgemm(t["A"], B0, progress=print)),
    (ValueError, r"^The 'client' parameter of spgemm is for a product spread",
     lambda t: mgpu.spgemm(A0, B0, client=mgpu.distributed.cluster.current_client())),
    (ValueError, r"^The 'client' parameter of spgemm must be a distributed.Client",
     lambda t: mgpu.spgemm(A0, B0, parts=2, client="tcp://x")),
    (TypeError, r"^The 'A' parameter of spgemm must be",
     lambda t: mgpu.spgemm(A0.toarray(), B0, parts=2)),
]


@pytest.mark.parametrize(("exc", "message", "call"), REFUSALS,
                         ids=[f"refusal-{i}" for i in range(len(REFUSALS))])
def test_refused_before_any_task(client, exc, message, call):
    tiles = {"A": from_scipy(A0, 2), "B": from_scipy(B0, 2),
             "mask": from_scipy(sp.csr_matrix(np.ones((30, 10))), 2)}
    before = set(client.run_on_scheduler(_tasks))
    with pytest.raises(exc, match=message):
        call(tiles)
    assert set(client.run_on_scheduler(_tasks)) - before == set()


def test_parts_without_a_cluster_is_refused(monkeypatch):
    monkeypatch.setattr(dist_spgemm, "current_client", lambda: None)
    with pytest.raises(ValueError, match=r"^The 'parts' parameter of spgemm spreads the "
                                         r"product over a cluster, and there is none"):
        mgpu.spgemm(A0, B0, parts=2)


def test_a_tiles_error_surfaces_at_the_call(client, monkeypatch):
    """A tile whose task fails (here a GPU's out-of-memory, as the worker would raise it)
    fails the call, and the other tiles are given up."""
    from mgpu.backends.memory import DeviceMemoryError

    def fails(*args, **kwargs):
        raise DeviceMemoryError("the tile's C does not fit")

    monkeypatch.setattr(dist_spgemm, "_tile_task", fails)
    with pytest.raises(DeviceMemoryError, match="does not fit"):
        mgpu.spgemm(A0, B0, parts=2, client=client)


# ---------------------------------------------------------------- GPU workers' side

@pytest.mark.gpu
def test_a_gpu_tile_runs_on_the_device_with_one_copy_of_b():
    """What a GPU worker's task does: the tile and the mask's rows to the device, B copied
    there once per object it holds, the product kept there (scipy with to_host)."""
    import cupyx.scipy.sparse as csp

    from mgpu.distributed.collection import device_copy

    A, B = _operands(seed=10)
    M = sp.random(A.shape[0], B.shape[1], density=0.2, format="csr", random_state=6)
    tile, rows = A[100:300], M[100:300]
    C = dist_spgemm._tile_task(tile, B, rows, True, False)
    assert isinstance(C, csp.csr_matrix)
    ref = _canonical(sp.csr_matrix((tile @ B).multiply(rows != 0)))
    got = C.get()
    np.testing.assert_array_equal(got.indptr, ref.indptr)
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_allclose(got.data, ref.data, rtol=1e-12)
    first = device_copy(B, lambda X: pytest.fail("B copied to the device a second time"))
    assert isinstance(first, csp.csr_matrix)
    host = dist_spgemm._tile_task(tile, B, None, True, True)
    assert type(host) is sp.csr_matrix
    _same_to_rounding(host, _canonical(tile @ B))
    # a dask A's cupyx tile with the host B the cluster holds
    Cd = dist_spgemm._dask_tile([csp.csr_matrix(tile)], [B], np.arange(100, 300),
                                dt=np.dtype(np.float64), to_host=False)
    assert isinstance(Cd, csp.csr_matrix)
    _same_to_rounding(Cd.get(), _canonical(tile @ B))


def _same_to_rounding(C, ref):
    """C has ref's pattern exactly and its values to float64 rounding (the GPU adds the
    products of a column in another order than scipy)."""
    np.testing.assert_array_equal(C.indptr, ref.indptr)
    np.testing.assert_array_equal(C.indices, ref.indices)
    np.testing.assert_allclose(C.data, ref.data, rtol=1e-12)
