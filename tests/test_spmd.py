"""mgpu.spmd: one task per worker, collectives between them, checked against one process.

CPU workers run the host communicator (the code path CI sees); the GPU tests run the same
functions through NCCL on two GPU workers.
"""
from __future__ import annotations

import importlib
import os
import time

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp

import mgpu
from mgpu.distributed import connect, from_scipy
from mgpu.distributed.comms import CollectiveError, CollectiveMismatch, CollectiveTimeout
from mgpu.distributed.spmd import WorkerLost, spmd
from mgpu.distributed import workers_now

# the module, not the function mgpu.distributed exports under its name
spmd_module = importlib.import_module("mgpu.distributed.spmd")
RNG = np.random.default_rng(36)
S = sp.random(120, 9, density=0.4, format="csr", random_state=RNG)
# adversarial magnitudes: a sum whose value depends on its order
HUGE = np.array([1e300, -1e300, 1.0, 1e-300, -3.5e15, 7.0])


@pytest.fixture(scope="module")
def client3():
    with connect(gpus=False, n_workers=3) as c:
        yield c


def _collectives(comm, parts, huge):
    xp = comm.xp
    local = xp.asarray(sum(_host(p.data.sum(axis=0)).ravel() for p in parts))
    mine = xp.asarray(huge * (comm.rank + 1) if comm.rank % 2 == 0 else -huge * comm.rank)
    return {
        "rank": comm.rank, "size": comm.size, "tiles": [p.index for p in parts],
        "rows": [(p.rows.start, p.rows.stop) for p in parts],
        "local": np.asarray(local.get() if hasattr(local, "get") else local),
        "sum": _host(comm.allreduce(local)),
        "max": _host(comm.allreduce(local, op="max")),
        "huge": _host(comm.allreduce(mine)),
        "gather": _host(comm.allgather(xp.full((comm.rank + 1, 2), comm.rank, dtype=xp.int64))),
        "bcast": _host(comm.broadcast(xp.arange(5.0) if comm.rank == 0 else xp.zeros(5))),
        "ring": _host(comm.sendrecv(xp.asarray([comm.rank] * 3), (comm.rank + 1) % comm.size,
                                    (comm.rank - 1) % comm.size)),
        "objs": comm.allgather_obj({"r": comm.rank}),
        "osum": comm.allreduce_obj(comm.rank + 1),
    }


def _host(x):
    """A numpy copy of a numpy or cupy array (or matrix)."""
    return np.asarray(x.get() if hasattr(x, "get") else x)


def _check_collectives(out, n_tiles):
    size = out[0]["size"]
    assert [o["rank"] for o in out] == list(range(size))
    assert sorted(t for o in out for t in o["tiles"]) == list(range(n_tiles))
    assert out[0]["tiles"][0] == 0  # rank 0 holds tile 0
    want = np.asarray(S.sum(axis=0)).ravel()
    huge = [HUGE * (r + 1) if r % 2 == 0 else -HUGE * r for r in range(size)]
    in_rank_order = huge[0].copy()
    for h in huge[1:]:
        in_rank_order = in_rank_order + h
    for o in out:
        np.testing.assert_allclose(o["sum"], want, rtol=1e-12)
        np.testing.assert_array_equal(o["max"], np.max([p["local"] for p in out], axis=0))
        assert o["gather"].tolist() == [[r, r] for r in range(size) for _ in range(r + 1)]
        np.testing.assert_array_equal(o["bcast"], np.arange(5.0))
        assert o["ring"].tolist() == [(o["rank"] - 1) % size] * 3
        assert o["objs"] == [{"r": r} for r in range(size)]
        assert o["osum"] == size * (size + 1) // 2
    return in_rank_order


def test_collectives_on_cpu_workers_equal_one_process(client3):
    X = from_scipy(S, 5, client=client3)
    out = spmd(_collectives, X, args=(HUGE,), client=client3)
    assert len(out) == 3
    in_rank_order = _check_collectives(out, 5)
    # the host sums in rank order, so even cancelling magnitudes come out as one process
    # summing the ranks' parts in that order (not NaN, not another rounding)
    for o in out:
        np.testing.assert_array_equal(o["huge"], in_rank_order)
    bounds = np.concatenate([[0], np.cumsum(X.chunks[0])])
    for o in out:
        for i, (a, b) in zip(o["tiles"], o["rows"], strict=True):
            assert (a, b) == (bounds[i], bounds[i + 1])


def test_parts_carry_their_tiles(client3):
    X = from_scipy(S, 4, client=client3)
    D = da.from_array(np.arange(120.0)[:, None] * np.ones((1, 3)), chunks=(X.chunks[0], 3))

    def local(comm, sparse, dense):
        return [(p.index, p.rows.start, p.rows.stop, float(p.data.sum()), float(q.data.sum()),
                 q.index) for p, q in zip(sparse, dense, strict=True)]

    got = sorted(t for r in spmd(local, X, D, client=client3) for t in r)
    assert [g[0] for g in got] == [0, 1, 2, 3] == [g[5] for g in got]
    for i, a, b, s, d in (g[:5] for g in got):
        assert s == pytest.approx(S[a:b].sum())
        assert d == pytest.approx(3 * np.arange(a, b).sum())


def test_progress_records_arrive_in_order(client3):
    X = from_scipy(S, 3, client=client3)

    def loop(comm, parts):
        for it in range(1, 31):
            comm.allreduce(np.ones(2))
            comm.report({"iteration": it, "loss": np.float32(1.0 / it)})
        return comm.rank

    seen = []
    assert spmd(loop, X, client=client3, progress=seen.append) == [0, 1, 2]
    assert [r["iteration"] for r in seen] == list(range(1, 31))
    assert seen[-1]["loss"] == pytest.approx(1 / 30)


def test_the_communicator_is_cached_per_worker_set(client3):
    X3 = from_scipy(S, 3, client=client3)
    before = dict(spmd_module._CACHE.get(client3, {}))
    spmd(_collectives, X3, args=(HUGE,), client=client3)
    spmd(_collectives, X3, args=(HUGE,), client=client3)
    cache = spmd_module._CACHE[client3]
    three = [k for k in cache if len(k[1]) == 3]
    assert len(three) == 1 and len(cache) - len(before) <= 1
    # a collection on two of the workers: another set, another communicator
    two = sorted(workers_now(client3))[:2]
    X2 = from_scipy(S, 2, client=client3)
    X2 = client3.persist(X2, workers=two)
    out = spmd(_collectives, X2, args=(HUGE,), client=client3)
    _check_collectives(out, 2)
    assert any(len(k[1]) == len(out) for k in spmd_module._CACHE[client3])


def test_a_rank_that_raises_ends_the_job_at_once(client3):
    X = from_scipy(S, 3, client=client3)

    def fails(comm, parts):
        if comm.rank == 1:
            raise ValueError("rank one cannot go on")
        comm.allreduce(np.ones(3))

    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="rank one cannot go on"):
        spmd(fails, X, client=client3, timeout=60)
    assert time.perf_counter() - t0 < 30  # the others were told, not left to time out
    # the next job gets a fresh communicator and works
    _check_collectives(spmd(_collectives, X, args=(HUGE,), client=client3), 3)


def test_different_collectives_are_refused(client3):
    X = from_scipy(S, 3, client=client3)

    def mixed(comm, parts):
        if comm.rank == 0:
            return comm.allreduce(np.ones(2))
        return comm.allgather_obj(1)

    with pytest.raises(CollectiveMismatch, match="same collectives in the same order"):
        spmd(mixed, X, client=client3, timeout=20)


def test_a_late_rank_is_named(client3):
    X = from_scipy(S, 3, client=client3)

    def late(comm, parts):
        if comm.rank == 2:
            time.sleep(4)
        comm.allreduce(np.ones(2))

    with pytest.raises(CollectiveTimeout, match=r"rank 2 \(worker tcp://") as e:
        spmd(late, X, client=client3, timeout=1)
    assert e.value.worker in workers_now(client3)


def test_unequal_tiles_are_refused_before_anything_runs(client3):
    X = from_scipy(S, 3, client=client3)
    Y = from_scipy(S, 4, client=client3)
    with pytest.raises(ValueError, match="as many row tiles. Got \\[3, 4\\]"):
        spmd(len, X, Y, client=client3)


def _counting(comm, parts, kill_at):
    """20 steps of an all-reduced update per tile, a checkpoint every 3; rank 1's process
    dies at ``kill_at`` on the first run."""
    start = 0
    states = {p.index: {"x": np.asarray(p.data.sum(axis=0)).ravel()} for p in parts}
    if comm.resumed is not None:
        start, states = comm.resumed
    for it in range(start + 1, 21):
        total = comm.allreduce(sum(s["x"] for s in states.values()))
        states = {t: {"x": s["x"] * 0.5 + total / 100.0} for t, s in states.items()}
        if it % 3 == 0:
            comm.checkpoint(it, states)
        comm.report({"iteration": it})
        if comm.rank == 1 and comm.resumed is None and it == kill_at:
            os._exit(1)
    return {t: s["x"] for t, s in states.items()}


def _merged(out):
    return {t: x for r in out for t, x in r.items()}


def test_a_lost_worker_resumes_from_the_checkpoint():
    with connect(gpus=False, n_workers=3) as c:
        X = from_scipy(S, 6, client=c)
        clean = _merged(spmd(_counting, X, args=(None,), client=c))
        seen = []
        got = _merged(spmd(_counting, X, args=(7,), client=c, progress=seen.append,
                           timeout=30))
    assert sorted(got) == sorted(clean) == list(range(6))
    for t in clean:
        np.testing.assert_allclose(got[t], clean[t], rtol=1e-12)
    its = [r["iteration"] for r in seen]
    assert its[-1] == 20 and set(its) == set(range(1, 21))
    assert its.index(7) < len(its) - its[::-1].index(7) - 1  # 7 ran twice: resumed from 6


@pytest.mark.timeout(180)
def test_a_worker_lost_after_every_rank_finished_resumes_instead_of_hanging():
    """A worker is killed once every rank has returned, before the client fetched the
    results (a progress callback late behind a fast job): its rank's result is gone with it
    and its task, pinned to that worker, is never run again. The job starts again from the
    last checkpoint (18) and ends with the undisturbed run's values; it used to wait for
    that result for ever."""
    import signal

    with connect(gpus=False, n_workers=3) as c:
        X = from_scipy(S, 6, client=c)
        clean = _merged(spmd(_counting, X, args=(None,), client=c))
        pids = c.run(os.getpid)
        seen, killed = [], []

        def kill_when_done(record):
            seen.append(record)
            if record["iteration"] == 20 and not killed:
                deadline = time.monotonic() + 30
                while any(k.startswith("mgpu-spmd-") for keys in c.processing().values()
                          for k in keys) and time.monotonic() < deadline:
                    time.sleep(0.05)
                victim = sorted(pids)[-1]
                os.kill(pids[victim], signal.SIGKILL)
                killed.append(victim)

        got = _merged(spmd(_counting, X, args=(None,), client=c, progress=kill_when_done,
                           timeout=30))
    assert killed
    assert sorted(got) == sorted(clean) == list(range(6))
    for t in clean:
        np.testing.assert_allclose(got[t], clean[t], rtol=1e-12)
    its = [r["iteration"] for r in seen]
    assert its[:20] == list(range(1, 21)) and its[20:] == [19, 20]  # resumed from 18


def test_a_lost_worker_without_restarts_is_named():
    with connect(gpus=False, n_workers=3) as c:
        X = from_scipy(S, 3, client=c)
        workers = set(workers_now(c))
        with pytest.raises(WorkerLost, match="that worker is gone") as e:
            spmd(_counting, X, args=(5,), client=c, restarts=0, timeout=30)
    assert e.value.worker in workers


def test_a_lost_worker_before_any_checkpoint_says_so():
    with connect(gpus=False, n_workers=3) as c:
        X = from_scipy(S, 3, client=c)
        with pytest.raises(WorkerLost, match="no checkpoint survived"):
            spmd(_counting, X, args=(2,), client=c, timeout=30)


# ------------------------------------------------------------------------------- on GPUs


@pytest.mark.gpu
@pytest.mark.multi_gpu(2)
def test_nccl_collectives_equal_one_process():
    with connect(gpus=True) as c:
        n = len(workers_now(c))
        X = from_scipy(S, 2 * n, client=c)
        assert mgpu.backends.is_gpu_array(X._meta)
        out = spmd(_collectives, X, args=(HUGE[2:],), client=c)
        assert len(out) == n
        _check_collectives(out, 2 * n)

        def fails(comm, parts):
            if comm.rank == 1:
                raise ValueError("rank one cannot go on")
            comm.allreduce(comm.xp.ones(3))

        t0 = time.perf_counter()
        with pytest.raises(ValueError, match="rank one cannot go on"):
            spmd(fails, X, client=c, timeout=60)
        assert time.perf_counter() - t0 < 30

        def late(comm, parts):
            if comm.rank == 1:
                time.sleep(6)
            comm.allreduce(comm.xp.ones(2))

        with pytest.raises(CollectiveError, match="rank 1"):
            spmd(late, X, client=c, timeout=2)
        _check_collectives(spmd(_collectives, X, args=(HUGE[2:],), client=c), 2 * n)


def test_a_stranger_on_the_listener_is_closed_unread():
    """Only a dialler with the job's key becomes a link; what a stranger sends is never
    deserialized."""
    import socket
    import threading

    from mgpu.distributed import comms

    key = "mgpu-comm-" + "ab" * 16
    listeners = [comms.listen("127.0.0.1"), comms.listen("127.0.0.1")]
    addresses = [s.getsockname() for s in listeners]
    got = {}
    t = threading.Thread(target=lambda: got.update(
        comms.mesh(key, 0, addresses, listeners[0], 10)))
    t.start()
    stranger = socket.create_connection(addresses[0])
    stranger.sendall(b"cos\nsystem\n(S'echo owned'\ntR." + b"x" * 40)
    wrong = socket.create_connection(addresses[0])
    wrong.sendall(("mgpu-comm-" + "cd" * 16).encode() + (1).to_bytes(4, "little"))
    links = comms.mesh(key, 1, addresses, listeners[1], 10)
    t.join(10)
    assert list(got) == [1] and list(links) == [0]
    comms.send_obj(links[0], {"x": np.arange(3)})
    assert comms.recv_obj(got[1], time.monotonic() + 5)["x"].tolist() == [0, 1, 2]
    for s in [stranger, wrong, *listeners, *got.values(), *links.values()]:
        s.close()


def test_the_host_channel_works_over_ipv6():
    """Workers with IPv6 addresses get IPv6 listeners and links."""
    import socket
    import threading

    from mgpu.distributed import comms

    try:
        listeners = [comms.listen("::1"), comms.listen("::1")]
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    assert all(s.family == socket.AF_INET6 for s in listeners)
    key = "mgpu-comm-" + "ef" * 16
    addresses = [s.getsockname()[:2] for s in listeners]
    got = {}
    t = threading.Thread(target=lambda: got.update(
        comms.mesh(key, 0, addresses, listeners[0], 10)))
    t.start()
    links = comms.mesh(key, 1, addresses, listeners[1], 10)
    t.join(10)
    comms.send_obj(links[0], np.arange(4.0))
    assert comms.recv_obj(got[1], time.monotonic() + 5).tolist() == [0.0, 1.0, 2.0, 3.0]
    for s in [*listeners, *got.values(), *links.values()]:
        s.close()


def test_a_tile_copied_to_another_worker_stays_with_its_own_rank():
    """A tile that some task copied to a second worker (held by two) goes to the holder
    with the fewer tiles, so that each worker keeps its own rank; a lost tile goes to the
    live worker with the fewest."""
    from types import SimpleNamespace

    from mgpu.distributed.spmd import _owners

    blocks = [SimpleNamespace(key=k) for k in ("t0", "t1", "t2", "t3")]
    held = {"t0": ("a",), "t1": ("b", "a"), "t2": ("a", "c"), "t3": ()}
    client = SimpleNamespace(who_has=lambda fs: held)
    assert _owners(blocks, client, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    assert _owners(blocks[:2], client, ["a"]) == ["a", "a"]
