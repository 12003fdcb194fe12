"""HSGD*'s pieces that need no GPU: the divisions, the plan (CPU slots and α) on the division, the side
times read off the scheduler's events, and the CPU half of a calibration on a CPU cluster."""
from __future__ import annotations

import dataclasses
import json
import os

import dask.config
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mgpu.mf.calibration import Calibration, cached, calibrate, prefix_sizes, store
from mgpu.mf.division import hsgd_star, move_rows, uniform
from mgpu.mf.planning import alone_block_time, epoch_time, plan, side_times
from mgpu.mf.sgd import sgd_block
from mgpu.sched import Event
from mgpu.distributed import workers_now


def _ratings(n_users: int, n_items: int, n: int, seed: int):
    """Ratings with skewed user and item degrees (every user and item at least once)."""
    rng = np.random.default_rng(seed)
    wu = 1.0 / np.arange(1, n_users + 1) ** 0.7
    wi = 1.0 / np.arange(1, n_items + 1) ** 0.9
    u = np.concatenate([np.arange(n_users), rng.choice(n_users, n, p=wu / wu.sum())])
    i = np.concatenate([rng.integers(0, n_items, n_users), rng.choice(n_items, n, p=wi / wi.sum())])
    return u, i


def _cover_once(d, u, i):
    """Every rating falls in exactly one listed block, and the sizes count them."""
    bid = d.block_of(u, i)
    counts = np.bincount(bid, minlength=d.n_rows * d.n_cols)
    listed = {b.id: b.size for b in d.blocks}
    assert set(np.flatnonzero(counts)) == set(listed)
    assert all(counts[b] == s for b, s in listed.items())
    assert all(b.id == b.row * d.n_cols + b.col for b in d.blocks)


def test_uniform_grid_covers_every_rating_once_with_balanced_strata():
    u, i = _ratings(500, 300, 20_000, 0)
    d = uniform(u, i, 500, 300, 3, np.random.default_rng(1))
    assert (d.n_rows, d.n_cols) == (4, 4)
    _cover_once(d, u, i)
    assert all(b.owner == (b.row + b.col) % 3 for b in d.blocks)
    per_row = np.bincount(d.user_stratum[u], minlength=4)
    heaviest = np.bincount(u).max()
    assert per_row.max() - per_row.min() <= heaviest  # cut at prefix sums of the counts


@settings(max_examples=40, deadline=None)
@given(n_g=st.integers(1, 4), n_c=st.integers(0, 12), alpha=st.floats(0.05, 0.95),
       seed=st.integers(0, 1000))
def test_hsgd_star_division_follows_rule_1(n_g, n_c, alpha, seed):
    u, i = _ratings(400, 250, 15_000, seed)
    d = hsgd_star(u, i, 400, 250, alpha, n_g, n_c, np.random.default_rng(seed))
    sub = -(-(n_g + n_c) // n_g)
    n_cpu_rows = n_c + n_g if n_c else 0
    assert d.n_rows == n_g * sub + n_cpu_rows
    assert d.n_cols == n_c + 2 * n_g + 1
    assert d.n_rows * d.n_cols >= (n_c + n_g + 1) * (n_c + n_g)  # Rule 1
    assert d.row_kind == ("gpu",) * (n_g * sub) + ("cpu",) * n_cpu_rows
    _cover_once(d, u, i)
    for b in d.blocks:
        if b.row < n_g * sub:  # GPU j owns every block of its group of sub-rows
            assert b.owner == b.row // sub
        else:
            assert n_g <= b.owner < n_g + n_c
    # the GPUs get the shortest prefix of shuffled users holding α of the ratings
    want = 1.0 if n_c == 0 else alpha
    assert want <= d.alpha + 1e-12
    assert d.alpha - want <= np.bincount(u).max() / u.size + 1e-12
    # each GPU group holds about α/n_g of the ratings
    groups = np.bincount([b.row // sub for b in d.blocks if b.row < n_g * sub],
                         weights=[b.size for b in d.blocks if b.row < n_g * sub], minlength=n_g)
    assert groups.max() - groups.min() <= np.bincount(u).max() + 1e-9


@settings(max_examples=40, deadline=None)
@given(n_g=st.integers(1, 3), n_c=st.integers(1, 12), alpha=st.floats(0.1, 0.9),
       goal=st.floats(0.0, 1.0), seed=st.integers(0, 1000))
# GPU 1 hands back its row 5 and takes row 2, which GPU 0 had just handed back: it ends
# over its part by less than half of row 2, more than half of its last row
@example(n_g=2, n_c=3, alpha=0.1875, goal=0.171875, seed=0)
def test_move_rows_hands_whole_rows_toward_the_share(n_g, n_c, alpha, goal, seed):
    u, i = _ratings(400, 250, 15_000, seed)
    d = hsgd_star(u, i, 400, 250, alpha, n_g, n_c, np.random.default_rng(seed))
    kinds = ["gpu"] * n_g + ["cpu"] * n_c
    moved = move_rows(d.blocks, kinds, goal)
    assert [(b.id, b.row, b.col, b.size) for b in moved] == [(b.id, b.row, b.col, b.size)
                                                            for b in d.blocks]
    owners: dict[int, set[int]] = {}
    for b in moved:
        owners.setdefault(b.row, set()).add(b.owner)
    gpu_rows = {r: min(o) for r, o in owners.items() if min(o) < n_g}
    # a GPU's rows are its own whole, and every GPU keeps one, the CPU slots one together
    assert all(len(owners[r]) == 1 for r in gpu_rows)
    assert set(gpu_rows.values()) == set(range(n_g)) and len(owners) > len(gpu_rows)
    # a CPU row that stayed a CPU row kept its owners
    for r, o in owners.items():
        if r not in gpu_rows and d.row_kind[r] == "cpu":
            assert o == {b.owner for b in d.blocks if b.row == r}
    total = sum(b.size for b in d.blocks)

    def gpu_share(blocks):
        return [sum(b.size for b in blocks if b.owner == g) / total for g in range(n_g)]

    before, after = gpu_share(d.blocks), gpu_share(moved)
    row_size = np.bincount([b.row for b in d.blocks], weights=[b.size for b in d.blocks]) / total
    for g in range(n_g):  # each GPU no farther from its part, and as near as a row allows
        part = goal / n_g
        assert abs(after[g] - part) <= abs(before[g] - part) + 1e-12
        mine = [r for r, o in gpu_rows.items() if o == g]
        if after[g] > part + 1e-12 and len(mine) > 1:
            # over its part by at most half of one of its rows: its last row, which it kept
            # because handing it back would not bring it closer, or the row it took last
            # (taken because it brought it closer), which need not be its last by index
            assert any(after[g] - part <= row_size[r] / 2 + 1e-12 for r in mine), (
                after[g] - part, {r: row_size[r] for r in mine})
    if abs(sum(before) - goal) < 1e-9:
        assert moved == d.blocks


def test_move_rows_refuses_a_row_shared_by_a_gpu():
    from mgpu.sched import Block

    with pytest.raises(ValueError, match="Row 0 has blocks of more than one GPU or of both"):
        move_rows([Block(0, 0, 0, 1.0, 0), Block(1, 0, 1, 1.0, 1)], ["gpu", "cpu"], 0.5)


def test_hsgd_star_refuses_what_it_cannot_divide():
    u, i = _ratings(50, 40, 500, 0)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="at least one slot"):
        hsgd_star(u, i, 50, 40, 0.5, 0, 0, rng)
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\]"):
        hsgd_star(u, i, 50, 40, 1.5, 1, 1, rng)
    with pytest.raises(ValueError, match=r"users must lie in \[0, 10\)"):
        hsgd_star(u, i, 10, 40, 0.5, 1, 1, rng)


def test_plan_balances_the_two_sides_of_the_division():
    # linear costs without a round trip: a GPU 3× as fast as a CPU thread, 1 GPU, 4 threads
    # → every thread is worth using and the GPU side takes 3 / (3 + 4) of the ratings
    gpu, cpu = 3e6, 1e6  # ratings per second
    predict = {"gpu": lambda n, per_task=1, load=1.0: n / gpu,
               "cpu": lambda n, per_task=1, load=1.0: n / cpu}
    used, alpha = plan(7_000_000, predict, 1, 4)
    assert used == 4 and alpha == pytest.approx(3 / 7, abs=1e-5)
    assert plan(7_000_000, predict, 2, 4) == (4, pytest.approx(6 / 10, abs=1e-5))
    assert plan(1000, predict, 1, 0) == (0, 1.0)
    # both sides of the chosen plan end together
    t = epoch_time(7_000_000, predict, 1, 4, alpha)
    assert t == pytest.approx(7_000_000 * alpha / gpu, rel=1e-4)


def test_plan_leaves_cpu_slots_out_when_their_blocks_cost_more_than_they_save():
    # 10 ms per task and 90,000 ratings: CPU blocks are mostly round trip, and more slots
    # mean more tasks for the GPU too; the GPU alone finishes an epoch first
    predict = {"gpu": lambda n, per_task=1, load=1.0: n / 5e8 + 0.01 / per_task,
               "cpu": lambda n, per_task=1, load=1.0: n / 1e6 + 0.01 / per_task}
    used, alpha = plan(90_000, predict, 1, 15)
    assert (used, alpha) == (0, 1.0)
    assert epoch_time(90_000, predict, 1, 0, 1.0) < epoch_time(90_000, predict, 1, 15, 0.5)
    # with Netflix-sized data, a GPU only 10× a thread and 1 ms per task, the threads pay
    fast = {"gpu": lambda n, per_task=1, load=1.0: n / 1e7 + 0.001 / per_task,
            "cpu": lambda n, per_task=1, load=1.0: n / 1e6 + 0.001 / per_task}
    used, alpha = plan(100_000_000, fast, 1, 15)
    assert used >= 8 and 0 < alpha < 1
    assert epoch_time(100_000_000, fast, 1, used, alpha) < 0.5 * epoch_time(
        100_000_000, fast, 1, 0, 1.0)


def test_bench_row_keeps_the_calibration_a_cost_mode_planned_from():
    import types

    from mgpu.bench.mf import summary

    n = [float(2 ** e) for e in range(10, 14)]
    cal = Calibration("made-up", n, [x / 1e6 for x in n], [x / 1e8 for x in n],
                      [x / 1e8 for x in n], 1e-3, 2e-3, "test", cpu_load=1.2)
    history = [{"epoch": e, "seconds": 0.5 * e, "test_rmse": 1.0 / e} for e in (1, 2, 3)]
    star = types.SimpleNamespace(mode="hsgd*", history_=history, calibration_=cal)
    row = summary(star, 0.4)
    assert row["calibration"] == cal.to_json()
    assert Calibration.from_json(json.loads(json.dumps(row["calibration"]))) == cal
    assert row["epochs_to_target"] == 3 and row["seconds_to_target"] == 1.5
    assert "calibration" not in summary(types.SimpleNamespace(mode="cpu", history_=history),
                                        0.4)


def test_side_times_add_up_each_kind_of_slot():
    # blocks 1 and 4 run in one GPU task (task 1): its time counts once, their ratings both
    ev = [Event(0.0, "assign", 1, "g#gpu", "", 1, 1), Event(0.0, "assign", 4, "g#gpu", "", 1, 1),
          Event(0.1, "assign", 2, "w#0", "", 1, 2),
          Event(0.5, "finish", 1, "g#gpu", "", 1, 1), Event(0.5, "finish", 4, "g#gpu", "", 1, 1),
          Event(0.6, "steal", 3, "g#gpu", "", 1, 3),
          Event(0.9, "finish", 2, "w#0", "", 1, 2), Event(1.0, "finish", 3, "g#gpu", "", 1, 3)]
    kinds = {"g#gpu": "gpu", "w#0": "cpu"}
    sizes = {1: 100.0, 2: 50.0, 3: 10.0, 4: 40.0}
    # a round trip of 0.1 s per task, shared by the blocks of a task: the two of GPU task 1,
    # the stolen block 3 alone in its task
    predict = {"gpu": lambda n, per_task=1, load=1.0: n / 200 + 0.1 / per_task,
               "cpu": lambda n, per_task=1, load=1.0: n / 100 + 0.1 / per_task}
    got = side_times(ev, kinds, sizes, predict)
    assert got["gpu_busy_s"] == pytest.approx(0.9) and got["gpu_ratings"] == 150
    assert got["cpu_busy_s"] == pytest.approx(0.8) and got["cpu_ratings"] == 50
    assert got["gpu_predicted_s"] == pytest.approx(150 / 200 + 2 * 0.1)
    assert got["cpu_predicted_s"] == pytest.approx(0.6)
    assert "gpu_predicted_s" not in side_times(ev, kinds, sizes, {})


def test_prefix_sizes_double_up_to_the_sample():
    assert prefix_sizes(10_000) == [1024, 2048, 4096, 8192, 10_000]
    assert prefix_sizes(3) == [1, 2, 3]
    with pytest.raises(ValueError, match="at least 2 ratings"):
        prefix_sizes(1)


def test_cpu_calibration_on_a_cluster_fits_and_is_cached(client, tmp_path):
    u, i = _ratings(2000, 800, 60_000, 3)
    r = np.random.default_rng(0).uniform(1, 5, u.size)
    worker = sorted(workers_now(client))[0]
    cal = calibrate(client, u, i, r, 32, cpu_worker=worker, gpu_worker=None, max_ratings=40_000,
                    repeats=2)
    assert cal.sizes == [float(s) for s in prefix_sizes(40_000)]
    assert len(cal.cpu_s) == len(cal.sizes) and not cal.kernel_s and not cal.transfer_s
    assert all(t > 0 for t in cal.cpu_s) and cal.cpu_s[-1] > cal.cpu_s[0]
    # a task's overhead with the slot busy: blocks of the middle prefix size, back to back
    assert 0 < cal.overhead_cpu_s < 1.0 and cal.overhead_gpu_s == 0.0
    assert cal.probe == prefix_sizes(40_000)[3] == 8192
    assert "gpu=-|" in cal.key and cal.key.endswith("|k=32|float64|items~724.1|per-user~32")
    assert cal.block == [800, 31.0]  # one stratum of every item: 62,000 ratings, 2,000 users
    curve = cal.curves("hsgd*")["cpu"]
    assert curve.form == "piecewise" and len(curve.knots) == len(cal.sizes)
    assert [curve(n) for n in cal.sizes] == pytest.approx(np.maximum.accumulate(cal.cpu_s))
    line = cal.curves("linear")["cpu"]
    assert line.form == "linear" and line.a > 0
    # the CPU's runs with every slot busy, against the curve's at the probe's size: recorded,
    # and the prediction is the curve and the overhead whatever it reads
    assert 0.2 < cal.cpu_load < 5.0
    cpu = cal.predictor("cpu")
    assert cpu(0) == 0.0 and cpu(1e6) > cpu(1e5) > cal.overhead_cpu_s
    assert cpu(1e5) == pytest.approx(curve(1e5) + cal.overhead_cpu_s)
    assert dataclasses.replace(cal, cpu_load=3.0).predictor("cpu")(1e5) == cpu(1e5)
    with pytest.raises(ValueError, match="no GPU measurements"):
        cal.predictor("gpu")
    assert "40,000 |" in cal.describe()
    # one host, nothing to share segments with: the probe's columns stayed on its worker
    assert cal.segments == "separate" and "segments not shared between hosts" in cal.describe()
    with dask.config.set({"mgpu.mf.calibration-cache": str(tmp_path / "c" / "cal.json")}):
        assert cached(cal.key) is None
        path = store(cal)
        assert json.loads(path.read_text())[cal.key]["cpu_s"] == cal.cpu_s
        assert cached(cal.key) == cal


def test_calibration_prefixes_are_blocks_as_the_division_cuts_them():
    """A prefix of the calibration sample has the ratings per user of the division's blocks
    (one column stratum, whole users in a random order, every user up to the last one's in
    its segment), whatever the GPUs' share."""
    from mgpu.mf.calibration import _prefix_block, block_window
    from mgpu.mf.division import columns

    u, i = _ratings(6000, 900, 150_000, 7)
    r = np.ones(u.size)
    cols = columns(1, 3)
    w = block_window(u, i, (6000, 900), cols, want=1 << 12, seed=3)
    assert cols == 6 and w.per_user == w.take.size / 6000
    assert w.take.size == pytest.approx(u.size / 6, rel=0.05)  # a sixth of the ratings
    assert np.all(np.diff(w.users) >= 0) and np.all(w.items < w.n_items)
    assert np.unique(i[w.take]).size <= w.n_items < 900
    for alpha in (0.3, 0.7):
        div = hsgd_star(u, i, 6000, 900, alpha, 1, 3, np.random.default_rng(1))
        rows = np.bincount(div.user_stratum, minlength=div.n_rows)
        density = [b.size / rows[b.row] for b in div.blocks]
        assert np.median(density) == pytest.approx(w.per_user, rel=0.3)
    for n in (2048, 8192, w.take.size):
        (bu, bi, _), P, Q = _prefix_block(w.users, w.items, r[w.take], n, 4, np.float64,
                                          w.n_items)
        assert P.shape == (w.segment_rows(n), 4) and Q.shape == (w.n_items, 4)
        assert bu.max() < P.shape[0] and bi.max() < w.n_items
        assert w.per_user / 2 < n / P.shape[0] < 2 * w.per_user  # skewed users vary


def test_gpu_curves_of_a_calibration_follow_the_thesis_forms():
    n = np.array([2.0 ** e for e in range(10, 24)])
    # transfers saturate as n/(a sqrt(ln n)+b) up to 2^20, kernels as n/(a ln n+b) up to 2^18
    tr = np.where(n < 2 ** 20, n / (3e6 * np.sqrt(np.log(n)) + 1e6), n / 9e6 + 1e-4)
    ke = np.where(n < 2 ** 18, n / (2e7 * np.log(n) + 1e7), n / 2.5e8)
    cal = Calibration("k", list(n), [], list(tr), list(ke), 0.0, 0.002, "now")
    c = cal.curves("hsgd*")
    assert c["transfer"].form == "sqrtlog" and c["kernel"].form == "log"
    assert np.isfinite(c["kernel"].tau) and c["kernel"].tau <= 2 ** 19
    gpu = cal.predictor("gpu")
    for m, t in zip(n, tr + ke):
        assert gpu(m) == pytest.approx(t + 0.002, rel=0.15)
    lin = cal.predictor("gpu", "linear")
    assert cal.curves("linear")["gpu"].form == "linear"
    assert lin(n[-1]) == pytest.approx(tr[-1] + ke[-1] + 0.002, rel=0.15)
    with pytest.raises(ValueError, match="model must be one of"):
        cal.curves("qilin")


def test_a_gpu_tasks_overhead_goes_with_the_cpu_slots_at_work():
    """Measured alone and with every slot busy; a plan with some CPU slots sits between, and
    the plan compares its options each at its own load."""
    n = [1024.0, 4096.0]
    cal = Calibration("k", n, [1e-3, 4e-3], [1e-4, 4e-4], [2e-4, 8e-4], 0.03, 0.02, "now",
                      probe=1024, overhead_gpu_alone_s=0.002)
    gpu = cal.predictor("gpu")
    run = 4e-4 + 8e-4
    assert gpu(4096, 2, load=0.0) == pytest.approx(run + 0.001)
    assert gpu(4096, 2, load=0.5) == pytest.approx(run + 0.0055)
    assert gpu(4096, 2) == gpu(4096, 2, load=1.0) == pytest.approx(run + 0.01)
    assert cal.predictor("cpu")(4096, load=0.0) == pytest.approx(4e-3 + 0.03)
    assert "alone 2.00 ms" in cal.describe()
    # the GPU alone at its idle overhead beats adding CPU slots that each pay 30 ms a task
    predict = {k: cal.predictor(k) for k in ("gpu", "cpu")}
    assert plan(200_000, predict, 1, 4) == (0, 1.0)
    assert epoch_time(200_000, predict, 1, 0, 1.0, load=0.0) < \
        epoch_time(200_000, predict, 1, 0, 1.0, load=1.0)


def test_plan_prices_the_gpus_alone_as_measured_when_told():
    # curves by which the GPU alone (0.312 s) just beats two CPU slots beside it (0.318 s)
    predict = {"gpu": lambda n, per_task=1, load=1.0: n / 3e7 + 0.004 / per_task,
               "cpu": lambda n, per_task=1, load=1.0: n / 1.5e6 + 0.04 / per_task}
    n = 9_000_000
    assert plan(n, predict, 1, 12) == (0, 1.0)
    by_curves = epoch_time(n, predict, 1, 0, 1.0, 0.0)
    # measured half again as slow (its blocks of the gpu mode's division are larger than the
    # calibration's): CPU slots are used
    used, alpha = plan(n, predict, 1, 12, alone=1.5 * by_curves)
    assert used > 0 and 0 < alpha < 1
    assert epoch_time(n, predict, 1, used, alpha, used / 12) < 1.5 * by_curves
    # measured faster: the GPUs alone still
    assert plan(n, predict, 1, 12, alone=0.5 * by_curves) == (0, 1.0)
    # without CPU slots the measurement is the plan's only option
    assert plan(n, predict, 1, 0, alone=5.0) == (0, 1.0)
    # a block's predicted time from the measurement: its ratings at the measured rate, its
    # share of a call's copies and overhead
    got = {"per_rating_s": 1e-7, "copy_s": 0.002, "overhead_s": 0.004, "epoch_s": 1.0}
    assert alone_block_time(got, 1e6, 2) == pytest.approx(0.1 + 0.003)
    assert alone_block_time(got, 0) == 0.0


def test_gpu_blocks_are_priced_no_faster_than_the_rate_measured_on_a_real_block():
    """Curves fitted on small prefixes can extrapolate a GPU faster than it runs a real block
    (on an H100 its kernel ran no faster on the division's small blocks than on the gpu
    mode's large one, BENCHMARKS.md history); priced by them, a plan with the GPU taking most of the
    ratings beside a few CPU slots looks far faster than it is."""
    n = [float(1024 << j) for j in range(9)]
    cal = Calibration("k", n, [x / 2.7e6 for x in n], [1e-4 + x * 1e-10 for x in n],
                      [x / 3e7 for x in n], 0.018, 0.006, "now", probe=16384,
                      overhead_gpu_alone_s=0.0015)
    ratings, rate = 9_000_000, 1 / 1.5e7  # the GPU measured at half the curves' speed
    alone = ratings * rate + 2 * (0.002 + 0.0015)
    curves = {"gpu": cal.predictor("gpu"), "cpu": cal.predictor("cpu")}
    used, alpha = plan(ratings, curves, 1, 12, alone)
    assert 0 < used < 6 and alpha > 0.8
    assert epoch_time(ratings, curves, 1, used, alpha, used / 12) < alpha * ratings * rate
    floored = {"gpu": cal.predictor("gpu", floor=rate), "cpu": curves["cpu"]}
    used_f, alpha_f = plan(ratings, floored, 1, 12, alone)
    assert used_f > used and alpha_f < alpha
    assert epoch_time(ratings, floored, 1, used_f, alpha_f, used_f / 12) >= \
        alpha_f * ratings * rate
    # the floor only slows what the curves price faster than it; one below them changes nothing
    for m in (2e3, 2e5, 2e6):
        assert floored["gpu"](m) >= m * rate
        assert cal.predictor("gpu", floor=1e-12)(m) == curves["gpu"](m)
        assert cal.predictor("gpu", "linear", floor=rate)(m) >= m * rate
    assert floored["gpu"](0) == 0.0


def _block(rng, n_users, n_items=20, n=300):
    return (rng.integers(0, n_users, n), rng.integers(0, n_items, n), rng.uniform(1, 5, n))


def _passes(blocks, P, Q, lr=0.01, reg=0.05):
    """The reference: numba passes one after the other, each over its block's ratings in
    the order given, as a host keeps and visits them."""
    for (users, items, ratings), P_ in zip(blocks, P):
        sgd_block(users, items, ratings, P_, Q, lr, reg, reg)


@pytest.mark.parametrize("shared", [False, True])
def test_block_hosts_wait_for_versions_and_hand_segments_over(client, shared):
    """Two hosts on two workers: a call queued before the one that makes its input waits for
    it, takes the item segment from the other host (which gives it up; or, where the two
    share the node's segments, reads it from the shared file, where its maker keeps it),
    and a call of two blocks runs them one after the other: every segment equals the
    sequential passes."""
    from mgpu.mf.hosts import call, share_segments, start_hosts
    from mgpu.mf.segments import SegmentMap

    a, b = sorted(workers_now(client))
    hosts = start_hosts(client, {a: ("cpu", 1), b: ("cpu", 1)})
    if shared:
        layout = [(("p", 0), 30), (("p", 1), 40), (("p", 2), 25), (("q", 0), 20)]
        assert share_segments(client, hosts, layout, 8, "float64") == {"127.0.0.1": [a, b]}
    rng = np.random.default_rng(0)
    b1, b3, b2 = _block(rng, 30), _block(rng, 25), _block(rng, 40)
    P1, P3, P2, Q = (rng.random((30, 8)), rng.random((25, 8)), rng.random((40, 8)),
                     rng.random((20, 8)))
    want = [x.copy() for x in (P1, P3, P2, Q)]
    _passes([b1, b3], want[:2], want[3])
    _passes([b2], want[2:3], want[3])
    for f in [call(client, hosts[a], "put", {1: b1, 3: b3}, {("p", 0): P1, ("p", 2): P3,
                                                             ("q", 0): Q}),
              call(client, hosts[b], "put", {2: b2}, {("p", 1): P2})]:
        f.result()
    segs = SegmentMap({("p", 0): a, ("p", 2): a, ("q", 0): a, ("p", 1): b})
    first = [segs.use(("p", 0), a), segs.use(("p", 2), a)], segs.use(("q", 0), a)
    second = [segs.use(("p", 1), b)], segs.use(("q", 0), b)
    assert second[1][0] == (("q", 0), 1, a, False)  # taken from a, at the version a makes
    late = call(client, hosts[b], "run", [2], [x[0] for x in second[0]], second[1][0],
                [x[1] for x in second[0]], second[1][1], 0.01, 0.05, 9)
    assert not late.done()
    early = call(client, hosts[a], "run", [1, 3], [x[0] for x in first[0]], first[1][0],
                 [x[1] for x in first[0]], first[1][1], 0.01, 0.05, 7)
    assert early.result(timeout=30) >= 0 and late.result(timeout=30) >= 0
    # each host tells where its call's time went, once; the late one waited for its input
    times = {w: call(client, hosts[w], "call_times").result() for w in (a, b)}
    assert [sorted(t) for t in times[a] + times[b]] == [["inputs", "queued", "run"]] * 2
    assert times[b][0]["inputs"] > 0 and times[a][0]["run"] == early.result()
    assert call(client, hosts[a], "call_times").result() == []
    got = {}
    for w, wanted in segs.latest().items():
        got.update(call(client, hosts[w], "collect", wanted).result(timeout=30))
    assert segs.latest() == {a: {("p", 0): 1, ("p", 2): 1}, b: {("q", 0): 2, ("p", 1): 1}}
    for key, ref in zip((("p", 0), ("p", 2), ("p", 1), ("q", 0)), want):
        np.testing.assert_array_equal(got[key], ref)
    # q given up, or kept where it was read from the shared file
    assert call(client, hosts[a], "held").result() == {("p", 0): 1, ("p", 2): 1,
                                                       **({("q", 0): 1} if shared else {})}
    with pytest.raises(KeyError):  # a block no host has: the call fails, with the error
        call(client, hosts[a], "run", [99], [(("p", 0), 1, None, False)],
             (("p", 2), 1, None, False), [(("p", 0), 2)], (("p", 2), 2), 0.01, 0.05, 1
             ).result(timeout=30)


def test_shared_segments_need_room_and_a_file_every_host_can_open(client, tmp_path):
    """A node whose shared memory is too small gets no store (a reason, not an error), and
    a host that cannot open the file goes on without it, its segments sent as before."""
    from mgpu.mf.hosts import call, start_hosts
    from mgpu.mf.segments import store_supported

    assert "free" in store_supported(1 << 62)
    a, b = sorted(workers_now(client))
    hosts = start_hosts(client, {a: ("cpu", 1), b: ("cpu", 1)})
    layout = [(("q", 0), 4)]
    assert call(client, hosts[b], "share", str(tmp_path / "missing" / "segs"), layout, 2,
                "float64").result() is None
    path = call(client, hosts[a], "share", None, layout, 2, "float64").result()
    call(client, hosts[a], "shared_with", [a], True).result()  # no other host: let go
    assert not os.path.exists(path)


def test_block_scheduler_runs_over_host_calls_and_stops_at_a_failed_one(client):
    """The scheduler takes calls (concurrent futures) as it takes Dask futures: every block
    once, and a call's error stops the epoch with that error."""
    from concurrent.futures import Future

    from mgpu.sched import Block, BlockScheduler, Slot

    blocks = [Block(r * 3 + c, r, c, owner=r % 2) for r in range(3) for c in range(3)]
    slots = [Slot("one", "w"), Slot("two", "w")]

    def run(group, slot, fail=None):
        f = Future()
        if fail is not None and group[0].id == fail:
            f.set_exception(RuntimeError("block 4 broke"))
        else:
            f.set_result(0.0)
        return f

    events = BlockScheduler(blocks, slots, run, client=client).run_epoch()
    assert sorted(e.block for e in events if e.kind == "finish") == list(range(9))
    with pytest.raises(RuntimeError, match="block 4 broke"):
        BlockScheduler(blocks, slots, lambda g, s: run(g, s, 4), client=client).run_epoch()


def test_the_block_scheduler_runs_beside_the_most_slots():
    """Its host is the worker with the most slots; a tie goes to a CPU worker."""
    from mgpu.mf.placement import driving_worker
    from mgpu.sched import Slot

    gpu = [Slot("g#gpu", "g", "gpu")]
    cpu = [Slot(f"c#{t}", "c", "cpu") for t in range(3)]
    assert driving_worker(gpu + cpu) == "c"
    assert driving_worker(gpu) == "g"
    assert driving_worker(gpu + cpu[:1]) == "c"
    assert driving_worker([Slot("a#0", "a"), Slot("b#0", "b"), Slot("b#1", "b")]) == "b"


def _held_everywhere(driver, workers):
    return [driver.call(w, "held").result(timeout=30) for w in workers]


def _fails(driver):
    raise ValueError("the driven function broke")


def _call_spec(v, seed):
    """A call on ("p", 0) and ("q", 0) from version v to v + 1."""
    return ([(("p", 0), v, None, False)], (("q", 0), v, None, False), [(("p", 0), v + 1)],
            (("q", 0), v + 1), 0.01, 0.05, seed)


def _runs_here(driver):
    host = driver.host
    assert host.run_here([1], *_call_spec(1, 8)) is None  # its input not made yet
    later = driver.call(host.address, "run", [1], *_call_spec(1, 8))  # waits on the loop
    first = host.run_here([1], *_call_spec(0, 7))
    assert first is not None and first.result(timeout=30) >= 0
    assert later.result(timeout=30) >= 0
    assert host.run_here([2], *_call_spec(2, 9)) is None  # a block not here
    return driver.call(host.address, "collect", {("p", 0): 2, ("q", 0): 2}).result(timeout=30)


def test_a_driving_hosts_own_calls_skip_its_event_loop(client):
    """On the driving host, a call whose inputs are there goes straight to the host's
    threads; one whose input is not made yet goes through the event loop and is woken by
    the thread that makes it: the segments equal the sequential passes."""
    from mgpu.mf.hosts import call, start_hosts

    a = sorted(workers_now(client))[0]
    host = start_hosts(client, {a: ("cpu", 2)})[a]
    rng = np.random.default_rng(3)
    # a block long enough (some milliseconds) that the later call is waiting when it ends
    b1, P, Q = _block(rng, 30, n=200_000), rng.random((30, 32)), 0.1 * rng.random((20, 32))
    want = [P.copy(), Q.copy()]
    _passes([b1, b1], [want[0], want[0]], want[1])
    call(client, host, "put", {1: b1}, {("p", 0): P, ("q", 0): Q}).result()
    got = call(client, host, "drive", _runs_here).result(timeout=60)
    assert np.isfinite(want[0]).all() and not np.allclose(want[1], Q)
    np.testing.assert_array_equal(got[("p", 0)], want[0])
    np.testing.assert_array_equal(got[("q", 0)], want[1])
    times = call(client, host, "call_times").result()
    assert len(times) == 2 and min(t["run"] for t in times) > 0


def test_a_driven_function_calls_its_own_host_and_the_others(client):
    """A function run on a host's driver thread reaches that host (on its event loop) and
    another worker's host (a Dask actor call from there); its error reaches the client."""
    from mgpu.mf.hosts import call, start_hosts

    a, b = sorted(workers_now(client))
    hosts = start_hosts(client, {a: ("cpu", 1), b: ("cpu", 1)})
    for f in [call(client, hosts[a], "put", {}, {("p", 0): np.ones((2, 2))}),
              call(client, hosts[b], "put", {}, {("q", 1): np.ones((3, 2))})]:
        f.result()
    got = call(client, hosts[a], "drive", _held_everywhere, [a, b]).result(timeout=30)
    assert got == [{("p", 0): 0}, {("q", 1): 0}]
    with pytest.raises(ValueError, match="the driven function broke"):
        call(client, hosts[b], "drive", _fails).result(timeout=30)
