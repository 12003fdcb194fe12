"""Loops of SDDMM calls on a resident S: a call on a placed S is one submission with no round
trip and does not wait, so a loop of calls pipelines; its numbers equal a waited loop's and
one device's."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from distributed import Event, futures_of, wait
from distributed.diagnostics.plugin import SchedulerPlugin

import mgpu
from mgpu.distributed import from_scipy, gather
from mgpu.synthetic import powerlaw_csr
from mgpu.distributed import workers_now


class _Graphs(SchedulerPlugin):
    """Counts the graphs each client sends to the scheduler."""

    name = "test-count-graphs"
    idempotent = True  # registered once per cluster, by the first test that needs it

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def update_graph(self, scheduler, *, client, **kwargs) -> None:
        self.counts[client] = self.counts.get(client, 0) + 1


def _count(dask_scheduler, client_id: str) -> int:
    return dask_scheduler.plugins[_Graphs.name].counts.get(client_id, 0)


def _graphs_sent(client) -> int:
    return client.run_on_scheduler(_count, client_id=client.id)


class _Calls:
    """Stands in for ``client.scheduler`` and records every call to the scheduler that waits
    for its answer (a round trip)."""

    def __init__(self, rpc) -> None:
        self._rpc, self.names = rpc, []

    def __getattr__(self, name):
        attr = getattr(self._rpc, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.names.append(name)
            return attr(*args, **kwargs)

        return call


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(3)
    S = powerlaw_csr(3000, 800, 40_000, seed=3)
    A = rng.standard_normal((3000, 12)).astype(np.float32)
    B = rng.standard_normal((800, 12)).astype(np.float32)
    return S, A, B


@pytest.mark.parametrize("axis", [0, 1])
def test_a_call_is_one_graph_and_no_round_trip(client, problem, monkeypatch, axis):
    S, A, B = problem
    Sd = from_scipy(S, 4, axis=axis, client=client)
    client.register_plugin(_Graphs())
    wait(mgpu.sddmm(Sd, A, B))  # the first call asks where the tiles are
    before = _graphs_sent(client)
    spy = _Calls(client.scheduler)
    monkeypatch.setattr(client, "scheduler", spy)
    P = mgpu.sddmm(Sd, A, B)
    monkeypatch.undo()
    assert spy.names == []
    wait(P)  # the graph went in a batched message: counted once it has arrived
    assert _graphs_sent(client) - before == 1  # factor pieces and every tile: one graph
    assert len(futures_of(P)) == 4
    np.testing.assert_allclose(gather(P).data, mgpu.sddmm(S, A, B).data, rtol=1e-6)


def test_a_call_returns_before_its_tiles_run(client, problem):
    """With both single-thread workers held by a task that waits on an event, a call still
    returns (its result a dask array of futures, as ``client.persist`` gives) and its tiles
    run once the workers are free."""
    S, A, B = problem
    Sd = from_scipy(S, 4, axis=0, client=client)
    wait(mgpu.sddmm(Sd, A, B))
    go = Event()
    workers = sorted(workers_now(client))
    holds = [client.submit(lambda: Event(go.name).wait(60), key=f"hold-{w}", workers=[w],
                           pure=False) for w in workers]
    try:
        P = mgpu.sddmm(Sd, A, B)
        assert all(f.status == "pending" for f in futures_of(P))
    finally:
        go.set()
    wait(holds)
    np.testing.assert_allclose(gather(P).data, mgpu.sddmm(S, A, B).data, rtol=1e-6)


def _loop(S, A, B, steps, sddmm, spmm, wait_each):
    """A power-iteration-like loop: P = S ∘ (A Bᵀ), A ← (P B) / 4, for ``steps`` steps; the
    last P. ``wait_each`` brings A back to the client between calls."""
    for _ in range(steps):
        P = sddmm(S, A, B)
        A = spmm(P, B) / 4
        if wait_each:
            A = A.compute() if hasattr(A, "compute") else A
    return P


@pytest.mark.parametrize("axis", [0, 1])
def test_pipelined_loop_equals_the_waited_loop_and_one_device(client, problem, axis):
    """The pipelined loop hands the next call the previous step's lazy product (nothing is
    waited for until the end); the waited loop brings every step's factor back. Same tiles,
    same kernels: the same numbers to the bit, and one device's within float32 rounding."""
    S, A, B = problem
    Sd = from_scipy(S, 3, axis=axis, client=client)
    # spmm needs row tiles of P: from column tiles, mgpu.spmm re-cuts them
    one = _loop(S, A, B, 6, mgpu.sddmm, mgpu.spmm, False)
    piped = _loop(Sd, A, B, 6, mgpu.sddmm, mgpu.spmm, False)
    waited = _loop(Sd, A, B, 6, mgpu.sddmm, mgpu.spmm, True)
    got_piped, got_waited = gather(piped).tocsr(), gather(waited).tocsr()
    assert np.array_equal(got_piped.indices, S.indices)
    np.testing.assert_array_equal(got_piped.data, got_waited.data)
    np.testing.assert_allclose(got_piped.data, one.data, rtol=1e-4,
                               atol=1e-4 * np.abs(one.data).max())


@pytest.mark.parametrize("home", ["the other worker", "a worker that is gone"])
def test_a_stale_remembered_home_costs_a_transfer_not_a_value(client, problem, monkeypatch,
                                                             home):
    """Where the tiles are is remembered between calls; when it is wrong (a tile made again
    elsewhere, its worker lost), each tile's task still runs (its restriction is loose) and
    gives the same numbers."""
    import importlib

    dist = importlib.import_module("mgpu.distributed.sddmm")  # the module, not the function
    S, A, B = problem
    Sd = from_scipy(S, 2, axis=0, client=client)
    ref = gather(mgpu.sddmm(Sd, A, B)).data
    workers = sorted(workers_now(client))
    who = client.who_has(futures_of(Sd))
    stale = {}
    for f in futures_of(Sd):
        other = [w for w in workers if w not in who[f.key]][0]
        wrong = other if home == "the other worker" else "tcp://127.0.0.1:9"
        stale[(client.id, f.key)] = ((wrong,), dist._HOMES[(client.id, f.key)][1])
    monkeypatch.setattr(dist, "_HOMES", dist.OrderedDict(stale))
    P = mgpu.sddmm(Sd, A, B)
    wait(P, timeout=60)
    np.testing.assert_array_equal(gather(P).data, ref)


def test_a_user_array_stays_lazy_with_host_factors(client, problem):
    """An S that is not placed gives a lazy graph: nothing is sent until it is computed,
    host factors included (they travel in the graph)."""
    import dask.array as da

    S, A, B = problem
    client.register_plugin(_Graphs())
    Sl = da.from_array(sp.csr_matrix(S), chunks=(1000, 800), asarray=False)
    before = _graphs_sent(client)
    P = mgpu.sddmm(Sl, A, B)
    assert _graphs_sent(client) == before and futures_of(P) == []
    np.testing.assert_allclose(sp.csr_matrix(P.compute()).data, mgpu.sddmm(S, A, B).data,
                               rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.multi_gpu(2)
def test_gpu_pipelined_loop_equals_the_waited_loop_and_one_gpu(problem):
    """On GPU workers (cupyx tiles, factors copied to the devices): the pipelined and the
    waited loop give the same numbers, and one GPU's within float32 rounding."""
    import cupy
    import cupyx.scipy.sparse as csp

    S, A, B = problem
    with mgpu.connect(gpus=True, n_workers=2) as c:
        Sd = from_scipy(S, 4, axis=0, client=c)
        assert "cupy" in type(Sd._meta).__module__
        piped = gather(_loop(Sd, A, B, 5, mgpu.sddmm, mgpu.spmm, False)).tocsr()
        waited = gather(_loop(Sd, A, B, 5, mgpu.sddmm, mgpu.spmm, True)).tocsr()
    one = _loop(csp.csr_matrix(S), cupy.asarray(A), cupy.asarray(B), 5, mgpu.sddmm,
                mgpu.spmm, False).get()
    np.testing.assert_array_equal(piped.data, waited.data)
    np.testing.assert_allclose(piped.data, one.data, rtol=1e-4,
                               atol=1e-4 * np.abs(one.data).max())


@pytest.mark.gpu
@pytest.mark.multi_gpu(2)
def test_gpu_spmd_loop_matches_one_gpu():
    """The benchmark's SPMD loop on 1 and 2 GPU workers (NCCL all-reduce of B's update)
    gives one GPU's factors and error record."""
    from mgpu.bench.sddmm_loop import bench_loop

    S = powerlaw_csr(20_000, 6000, 300_000, seed=5)
    rows = bench_loop(S, 32, (1, 2), steps=8, gpus=True)
    assert [(r["workers"], r["kind"]) for r in rows] == [("one device", "GPU"), (1, "GPU"),
                                                         (2, "GPU")]
    for r in rows:
        assert r["max_rel_err"] <= 1e-4 and r["margin_error"][1] < r["margin_error"][0]
