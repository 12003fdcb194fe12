"""The wavefront schedule of GPU SGD (mgpu.mf.schedule): every rating once a pass, no two
warps of a step on one user or item, any shape; on a GPU, the kernel equal to the
sequential pass the schedule defines, and fits that reach the MovieLens target."""
from __future__ import annotations

import dask
import numpy as np
import pytest

from mgpu.mf import sgd_block
from mgpu.mf.schedule import (AUTO_GROUPS, WaveSchedule, build_schedule, check_scheme,
                              pass_order, wave_groups)


def _power_law(n: int, n_users: int, n_items: int, seed: int, a_u: float = 0.35,
               a_i: float = 0.9):
    """Distinct (user, item) pairs with power-law degrees (Netflix's exponents for users;
    a steeper one for items, so one item has a large share)."""
    rng = np.random.default_rng(seed)
    wu = 1.0 / np.arange(1, n_users + 1) ** a_u
    wi = 1.0 / np.arange(1, n_items + 1) ** a_i
    u = rng.choice(n_users, 3 * n, p=wu / wu.sum())
    i = rng.choice(n_items, 3 * n, p=wi / wi.sum())
    key = np.unique(u * n_items + i)[:n]
    key = key[rng.permutation(key.size)]
    return key // n_items, key % n_items


def _check(users: np.ndarray, items: np.ndarray, n_users: int, n_items: int, seed: int,
           groups: int | None = None, passes: int = 3) -> WaveSchedule:
    """Build a schedule and assert every property a pass relies on."""
    order, s = build_schedule(users, items, n_users, n_items, seed=seed, groups=groups)
    n, G = users.size, s.groups
    assert s.size == n and s.offsets.shape == (G * G + 1,)
    assert s.offsets[0] == 0 and s.offsets[-1] == n and (np.diff(s.offsets) >= 0).all()
    assert np.array_equal(np.sort(order), np.arange(n))  # the sort is a permutation
    su, si = users[order], items[order]
    cell = np.repeat(np.arange(G * G), np.diff(s.offsets))
    row, col = cell // G, cell % G
    # a user lives in one row group, an item in one column group: two cells of a step (other
    # rows, other columns) never share either
    for ids, group in ((su, row), (si, col)):
        first = np.full(max(ids.max(initial=-1) + 1, 1), -1)
        first[ids] = group
        assert (first[ids] == group).all()
    # within a cell: by item, then user
    key = si * (n_users + 1) + su
    same = cell[1:] == cell[:-1]
    assert (key[1:][same] > key[:-1][same]).all()
    for epoch in range(passes):
        d = s.diagonals(epoch)
        assert np.array_equal(np.sort(d), np.arange(G))  # each step a different diagonal
        po = pass_order(s, epoch)
        assert np.array_equal(np.sort(po), np.arange(n))  # every rating exactly once a pass
        # steps in turn: step j's ratings sit in cells (a, (a + d_j) mod G), each column
        # once per step
        step_of_cell = np.empty(G * G, dtype=np.int64)
        a = np.arange(G)
        for j, dj in enumerate(d):
            step_of_cell[a * G + (a + dj) % G] = j
        steps = step_of_cell[cell[po]]
        assert (np.diff(steps) >= 0).all()
        for j in np.unique(steps):
            cols = col[po][steps == j]
            rows = row[po][steps == j]
            pairs = np.unique(rows * G + cols)
            assert np.unique(pairs // G).size == pairs.size == np.unique(pairs % G).size
            assert not np.intersect1d(su[po][(steps == j) & (row[po] == rows[0])],
                                      su[po][(steps == j) & (row[po] != rows[0])]).size
    return s


def test_schedule_on_power_law_ratings_balances_groups_and_never_shares_a_row():
    u, i = _power_law(20_000, 900, 300, seed=1)
    s = _check(u, i, 900, 300, seed=5)
    assert s.groups == wave_groups(u.size, np.unique(u).size, np.unique(i).size) == 35
    # each row group holds about n / G ratings, off by at most its busiest user
    order, _ = build_schedule(u, i, 900, 300, seed=5)
    per_row = np.diff(s.offsets)[: s.groups ** 2].reshape(s.groups, s.groups)
    busiest = np.bincount(u).max()
    assert np.abs(per_row.sum(axis=1) - u.size / s.groups).max() <= busiest + 1
    busiest_item = np.bincount(i).max()
    assert np.abs(per_row.sum(axis=0) - u.size / s.groups).max() <= busiest_item + 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_busy_id_has_a_group_of_its_own(seed):
    """An item (or user) of at least n / G ratings is alone in its column (row) group, so
    the busiest group's chain is the busiest id's ratings and no more (the 0.9 exponent
    gives items of several times n / G; two users rate every item)."""
    u, i = _power_law(20_000, 900, 300, seed=seed)
    u = np.concatenate([u, np.repeat([7, 8], 300)])  # two users who rate every item
    i = np.concatenate([i, np.tile(np.arange(300), 2)])
    key = np.unique(u * 300 + i)
    u, i, G = key // 300, key % 300, 100
    s = _check(u, i, 900, 300, seed=seed, groups=G, passes=1)
    order, _ = build_schedule(u, i, 900, 300, seed=seed, groups=G)
    cells = np.diff(s.offsets).reshape(G, G)
    cell = np.repeat(np.arange(G * G), np.diff(s.offsets))
    for ids, group, sums in ((u[order], cell // G, cells.sum(axis=1)),
                             (i[order], cell % G, cells.sum(axis=0))):
        degree = np.bincount(ids)
        busy = np.flatnonzero(degree * G >= ids.size)
        assert busy.size >= 2  # the case is made
        for b in busy:
            g = group[ids == b][0]
            assert np.unique(ids[group == g]).tolist() == [b]  # alone
            assert sums[g] == degree[b]
        # the others are cut at multiples of n / G as before: a group holds at most n / G
        # plus its last id's ratings
        rest = np.setdiff1d(np.arange(G), [group[ids == b][0] for b in busy])
        assert sums[rest].max() <= ids.size / G + degree[np.setdiff1d(ids, busy)].max()


@pytest.mark.parametrize("n_users, n_items, groups", [
    (3, 50, 8),     # fewer users than groups: empty row groups
    (50, 3, 8),     # fewer items than groups
    (1, 40, None),  # one user: one group, the sequential pass
    (40, 1, 5),     # one item, groups asked for: every cell but a column empty
    (1, 1, 1),
])
def test_schedule_of_narrow_shapes(n_users, n_items, groups):
    rng = np.random.default_rng(n_users * 7 + n_items)
    key = rng.permutation(n_users * n_items)[: max(1, n_users * n_items // 2)]
    s = _check(key // n_items, key % n_items, n_users, n_items, seed=2, groups=groups)
    assert s.groups == (groups or 1)


def test_schedule_of_no_ratings_and_of_unrated_ids():
    empty = np.empty(0, dtype=np.int64)
    order, s = build_schedule(empty, empty, 10, 10, seed=0)
    assert s.groups == 1 and order.size == 0 and pass_order(s, 0).size == 0
    # ids far above the ones rated (segments with rows no rating names)
    u = np.array([0, 5000, 5000, 9])
    i = np.array([7, 7, 2, 2])
    _check(u, i, 6000, 8, seed=1, groups=2)


def test_schedule_sorted_on_the_host_where_one_key_would_overflow(monkeypatch):
    import mgpu.mf.schedule as schedule

    u, i = _power_law(4000, 300, 120, seed=8)
    one_key, _ = build_schedule(u, i, 300, 120, seed=4)
    monkeypatch.setattr(schedule, "_ONE_KEY", 0)
    lexsorted, s = build_schedule(u, i, 300, 120, seed=4)
    np.testing.assert_array_equal(lexsorted, one_key)
    _check(u, i, 300, 120, seed=4)


def test_schedule_is_a_function_of_the_seed():
    u, i = _power_law(3000, 200, 100, seed=3)
    o1, s1 = build_schedule(u, i, 200, 100, seed=11)
    o2, s2 = build_schedule(u, i, 200, 100, seed=11)
    o3, s3 = build_schedule(u, i, 200, 100, seed=12)
    assert np.array_equal(o1, o2) and np.array_equal(s1.offsets, s2.offsets)
    assert np.array_equal(pass_order(s1, 4), pass_order(s2, 4))
    assert not np.array_equal(s1.diagonals(0), s1.diagonals(1))  # shuffled every pass
    assert not np.array_equal(o1, o3)


def test_wave_groups_follows_the_shape():
    assert wave_groups(100_000_000, 480_189, 17_770) == AUTO_GROUPS == 2048
    assert wave_groups(200_000, 10 ** 5, 10 ** 5) == 111  # about 16 ratings a cell
    assert wave_groups(10 ** 12, 10 ** 7, 10 ** 7) == AUTO_GROUPS
    assert wave_groups(10 ** 6, 3, 10 ** 5) == 3
    assert wave_groups(0, 0, 0) == 1
    # the busiest id bounds G: n / G at most half its ratings
    assert wave_groups(100_000_000, 480_189, 17_770, busiest=253_793) == 789
    assert wave_groups(200_000, 10 ** 5, 10 ** 5, busiest=4000) == 100
    assert wave_groups(200_000, 10 ** 5, 10 ** 5, busiest=100) == 111  # small: no bound
    assert wave_groups(10 ** 6, 10, 10, busiest=10 ** 6) == 2  # one id has them all
    with pytest.raises(ValueError, match=r"The 'groups' parameter of build_schedule must be in "
                                         r"\[1, 4096\]. Got 0 instead"):
        build_schedule(np.array([0]), np.array([0]), 1, 1, seed=0, groups=0)


def test_cpu_pass_on_a_schedule_is_its_sequential_order_and_any_order_within_a_step():
    """The CPU runs a scheduled block in pass_order; running the cells of each step in
    another order (as warps would) gives the same factors to the bit: the cells of a step
    share no row of P or Q."""
    u, i = _power_law(6000, 400, 150, seed=4)
    r = np.random.default_rng(0).uniform(1, 5, u.size)
    order, s = build_schedule(u, i, 400, 150, seed=9)
    su, si, sr = u[order], i[order], r[order]
    rng = np.random.default_rng(1)
    P0, Q0 = rng.random((400, 8)), rng.random((150, 8))
    P, Q = P0.copy(), Q0.copy()
    for _ in range(2):
        sgd_block(su, si, sr, P, Q, 0.02, 0.05, 0.03, schedule=s)
    assert s.passes == 2
    ref_P, ref_Q = P0.copy(), Q0.copy()
    G = s.groups
    for epoch in range(2):
        ref = WaveSchedule(G, s.offsets, s.seed, s.size)
        d = ref.diagonals(epoch)
        parts = []
        for dj in d:
            for a in reversed(range(G)):  # rows of a step backwards
                c = (a + dj) % G
                parts.append(np.arange(s.offsets[a * G + c], s.offsets[a * G + c + 1]))
        sgd_block(su, si, sr, ref_P, ref_Q, 0.02, 0.05, 0.03, np.concatenate(parts))
    np.testing.assert_array_equal(P, ref_P)
    np.testing.assert_array_equal(Q, ref_Q)
    # the same pass through pass_order as an explicit order
    P2, Q2 = P0.copy(), Q0.copy()
    sgd_block(su, si, sr, P2, Q2, 0.02, 0.05, 0.03, pass_order(s, 0))
    P3, Q3 = P0.copy(), Q0.copy()
    sgd_block(su, si, sr, P3, Q3, 0.02, 0.05, 0.03,
              schedule=WaveSchedule(G, s.offsets, s.seed, s.size))
    np.testing.assert_array_equal(P2, P3)


def test_sgd_block_refuses_a_schedule_with_an_order_or_of_other_ratings():
    u, i = _power_law(500, 40, 30, seed=6)
    r = np.ones(u.size)
    order, s = build_schedule(u, i, 40, 30, seed=0)
    P, Q = np.ones((40, 4)), np.ones((30, 4))
    with pytest.raises(ValueError, match="The 'schedule' parameter of sgd_block fixes the order"
                                         r".*order=given, conflicts=None"):
        sgd_block(u, i, r, P, Q, 0.1, 0.0, 0.0, np.arange(u.size), schedule=s)
    with pytest.raises(ValueError, match=r"conflicts=4"):
        sgd_block(u, i, r, P, Q, 0.1, 0.0, 0.0, conflicts=4, schedule=s)
    with pytest.raises(ValueError, match=f"The schedule covers {u.size} ratings; this pass was "
                                         f"given {u.size - 1}"):
        sgd_block(u[1:], i[1:], r[1:], P, Q, 0.1, 0.0, 0.0, schedule=s)
    with pytest.raises(TypeError, match="The 'schedule' parameter of sgd_block must be a "
                                        "mgpu.mf.schedule.WaveSchedule or None. Got dict"):
        sgd_block(u, i, r, P, Q, 0.1, 0.0, 0.0, schedule={"groups": 2})
    assert s.passes == 0  # nothing ran


def test_gpu_scheme_setting_is_checked_on_the_client():
    from mgpu.mf.model import gpu_options

    assert check_scheme("hogwild") == "hogwild"
    assert gpu_options()["scheme"] == "wavefront"  # the default
    with dask.config.set({"mgpu.mf.gpu-scheme": "diagonal"}):
        with pytest.raises(ValueError, match=r"The 'mgpu.mf.gpu-scheme' setting must be one of "
                                             r"\{'hogwild', 'wavefront'\}. Got 'diagonal'"):
            gpu_options()


def test_wave_depths_bound_the_ring_of_a_warp():
    from mgpu.backends.instances import INSTANCES, WAVE_DEPTHS, wave_depths, wave_kernel

    assert WAVE_DEPTHS == (2, 4, 8)
    assert wave_depths("float", 4) == (2, 4, 8) and wave_depths("double", 4) == (2, 4)
    assert wave_depths("float", 8) == (2, 4) and wave_depths("double", 8) == (2,)
    assert wave_kernel("float", 4) == "mgpu_sgd_wave<float, 4, 8>"  # k = 128: 8 in flight
    assert wave_kernel("float", 8) == "mgpu_sgd_wave<float, 8, 4>"  # k = 256: 8 not there
    assert wave_kernel("double", 4) == "mgpu_sgd_wave<double, 4, 4>"
    assert wave_kernel("double", 8) == "mgpu_sgd_wave<double, 8, 2>"  # 4 not instantiated
    assert wave_kernel("double", 2, 2) in INSTANCES["sgd.cu"]
    with pytest.raises(ValueError, match=r"The 'depth' parameter of the wavefront SGD kernel "
                                         r"must be one of \[2, 4\] for float factors of 8 per "
                                         r"lane. Got 8 instead"):
        wave_kernel("float", 8, 8)


def test_resident_launch_holds_the_warps_the_registers_allow():
    """The residency arithmetic of the wavefront launch: blocks of two warps an SM from the
    registers as the CUDA occupancy calculator counts them (each of 4 sub-partitions gives a
    warp whole units of 256), then warps = min(G, SMs · blocks · 2, max_warps)."""
    from mgpu.backends.occupancy import blocks_by_registers, blocks_by_shared, resident_launch

    # shared memory: 228 KiB an SM over (a block's bytes + the 1 KiB the device reserves)
    assert blocks_by_shared(9728) == 21 and blocks_by_shared(17920) == 12  # rings of 4 and 8
    assert blocks_by_shared(0) == 32 and blocks_by_shared(0, max_blocks_per_sm=16) == 16
    assert blocks_by_shared(17920, shared_per_sm=167936) == 8  # an A100's 164 KiB
    assert blocks_by_shared(300_000) == 0
    with pytest.raises(ValueError, match=r"blocks_by_shared needs shared >= 0. Got shared=-1"):
        blocks_by_shared(-1)
    # ptxas of mgpu_sgd_wave<float, 4, D> (k = 128) for D = 8, 4, 2: 12, 16, 28 warps an SM
    assert [blocks_by_registers(r, 64) for r in (164, 108, 72)] == [6, 8, 14]
    assert blocks_by_registers(128, 64) == 8  # 4096 a warp: exactly 4 per sub-partition
    assert blocks_by_registers(129, 64) == 6  # 4352 a warp: 3 per sub-partition
    assert blocks_by_registers(16, 64) == 32 and blocks_by_registers(16, 32) == 32  # caps
    assert blocks_by_registers(32, 1024, max_warps_per_sm=48) == 1
    assert blocks_by_registers(255, 1024) == 0 and blocks_by_registers(256, 32) == 0
    # a 132-SM H100
    assert resident_launch(1024, 132, 6, 2) == (1024, 2, 512)  # every row group its warp
    assert resident_launch(2048, 132, 6, 2) == (1584, 2, 792)  # some warps take two
    assert resident_launch(2048, 132, 8, 2)[0] == 2048
    assert resident_launch(4096, 132, 14, 2) == (3696, 2, 1848)
    assert resident_launch(1024, 132, 1, 2)[0] == 264  # one block an SM: what a failed query gave
    assert resident_launch(37, 132, 6, 2, max_warps=7) == (7, 2, 4)
    assert resident_launch(5, 132, 6, 2, max_warps=0) == (5, 2, 3)  # 0: no cap
    assert resident_launch(1, 132, 6, 2) == (1, 1, 1)
    with pytest.raises(ValueError, match=r"resident_launch needs groups, sms, blocks_per_sm "
                                         r"and warps_per_block >= 1. Got 8, 132, 0, 2"):
        resident_launch(8, 132, 0, 2)
    with pytest.raises(ValueError, match=r"blocks_by_registers needs regs > 0 and threads > 0. "
                                         r"Got regs=0, threads=64"):
        blocks_by_registers(0, 64)


@pytest.mark.parametrize("depths", ["3", "4,x", ""])
def test_bench_sgd_refuses_a_depth_the_kernel_lacks(depths):
    from click.testing import CliRunner

    from mgpu.cli import main

    r = CliRunner().invoke(main, ["bench", "sgd", "--depths", depths])
    assert r.exit_code == 2
    assert f"Invalid value for --depths: expected some of 2, 4, 8 or 'auto', " \
           f"comma-separated, got {depths!r}" in " ".join(r.output.split())


# ----------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype, rtol", [(np.float32, 3e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("k, groups, warps", [(7, 4, None), (64, 23, None), (128, 60, 7),
                                              (200, 1, None), (256, 40, 1)])
def test_gpu_wavefront_pass_equals_the_sequential_float64_pass(dtype, rtol, k, groups, warps):
    """Power-law ratings, every user and item in many updates: the wavefront kernel's
    passes equal the float64 sequential passes in pass_order (the schedule leaves the order
    within a cell as the only order), with fewer warps than row groups too."""
    import cupy

    u, i = _power_law(20_000, 700, 250, seed=k)
    r = np.random.default_rng(k).uniform(1, 5, u.size)
    order, s = build_schedule(u, i, 700, 250, seed=k, groups=groups)
    su, si, sr = u[order], i[order], r[order]
    rng = np.random.default_rng(1)
    P0, Q0 = (rng.random((700, k)) / np.sqrt(k)), (rng.random((250, k)) / np.sqrt(k))
    P, Q = P0.astype(dtype).astype(np.float64), Q0.astype(dtype).astype(np.float64)
    Pg, Qg = cupy.asarray(P0.astype(dtype)), cupy.asarray(Q0.astype(dtype))
    gs = WaveSchedule(s.groups, cupy.asarray(s.offsets), s.seed, s.size)
    dev = [cupy.asarray(su.astype(np.int32)), cupy.asarray(si.astype(np.int32)),
           cupy.asarray(sr.astype(dtype))]
    for epoch in range(3):
        sgd_block(su, si, sr, P, Q, 0.01, 0.05, 0.02, pass_order(s, epoch))
        sgd_block(*dev, Pg, Qg, 0.01, 0.05, 0.02, max_warps=warps, schedule=gs)
    assert gs.passes == 3
    np.testing.assert_allclose(Pg.get(), P, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(Qg.get(), Q, rtol=rtol, atol=rtol)
    # deterministic: the same passes again give the same bits
    Pg2, Qg2 = cupy.asarray(P0.astype(dtype)), cupy.asarray(Q0.astype(dtype))
    gs2 = WaveSchedule(s.groups, cupy.asarray(s.offsets), s.seed, s.size)
    for _ in range(3):
        sgd_block(*dev, Pg2, Qg2, 0.01, 0.05, 0.02, schedule=gs2)
    assert cupy.array_equal(Pg2, Pg) and cupy.array_equal(Qg2, Qg)


def _repeating_users(seed: int):
    """Ratings whose sub-blocks make every case of the kernel's ring: user 3 alone rates items
    0..19 (runs of one rating, so one user in consecutive ratings across items), six users
    rate items 20..39 (a user again within a few ratings, its fetched row stale), and
    power-law ratings beside them."""
    u, i = _power_law(3000, 60, 40, seed=seed)
    u, i = u + 6, i + 40
    u = np.concatenate([np.full(20, 3), np.tile(np.arange(6), 20), u])
    i = np.concatenate([np.arange(20), np.repeat(np.arange(20, 40), 6), i])
    return u, i, 66, 80


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, rtol", [(np.float32, 3e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("k", [32, 128, 256])
@pytest.mark.parametrize("groups", [1, 3])
def test_gpu_wavefront_every_ring_depth_equals_the_sequential_float64_pass(dtype, rtol, k,
                                                                          groups):
    """Each number of ratings in flight a warp that the kernel has for (dtype, k) gives the
    float64 sequential pass in pass_order (rows fetched ahead are taken only where still
    current), one sub-block (groups 1: the whole block, users repeating across item runs)
    or several; and a depth it lacks is refused by name."""
    import cupy

    from mgpu.backends.cupy_sgd import sgd_wave_gpu
    from mgpu.backends.instances import SGD_KPL, wave_depths
    from mgpu.backends.loader import c_type

    u, i, n_users, n_items = _repeating_users(seed=k + groups)
    r = np.random.default_rng(k).uniform(1, 5, u.size)
    order, s = build_schedule(u, i, n_users, n_items, seed=k, groups=groups)
    su, si, sr = u[order], i[order], r[order]
    rng = np.random.default_rng(2)
    P0 = rng.random((n_users, k)) / np.sqrt(k)
    Q0 = rng.random((n_items, k)) / np.sqrt(k)
    P, Q = P0.astype(dtype).astype(np.float64), Q0.astype(dtype).astype(np.float64)
    for epoch in range(2):
        sgd_block(su, si, sr, P, Q, 0.02, 0.05, 0.02, pass_order(s, epoch))
    dev = [cupy.asarray(su.astype(np.int32)), cupy.asarray(si.astype(np.int32)),
           cupy.asarray(sr.astype(dtype))]
    kpl = next(w for w in SGD_KPL if k <= 32 * w)
    depths = wave_depths(c_type(np.dtype(dtype)), kpl)
    assert depths[0] == 2
    for depth in depths:
        Pg, Qg = cupy.asarray(P0.astype(dtype)), cupy.asarray(Q0.astype(dtype))
        gs = WaveSchedule(s.groups, cupy.asarray(s.offsets), s.seed, s.size)
        for _ in range(2):
            sgd_wave_gpu(*dev, Pg, Qg, 0.02, 0.05, 0.02, gs, depth=depth)
        np.testing.assert_allclose(Pg.get(), P, rtol=rtol, atol=rtol, err_msg=f"depth {depth}")
        np.testing.assert_allclose(Qg.get(), Q, rtol=rtol, atol=rtol, err_msg=f"depth {depth}")
    with pytest.raises(ValueError, match=r"The 'depth' parameter of the wavefront SGD kernel "
                                         r"must be one of \[.*\] .* Got 3 instead"):
        sgd_wave_gpu(*dev, Pg, Qg, 0.02, 0.05, 0.02, gs, depth=3)
    assert gs.passes == 2  # the refused pass did not count


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, rtol", [(np.float32, 3e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("k", [124, 128])
def test_gpu_wavefront_rows_not_16_byte_aligned_take_plain_loads_to_the_same_bits(dtype, rtol,
                                                                                  k):
    """Factors that start off a 16-byte boundary (views one element into their buffer) are
    fetched by plain loads instead of 16-byte cp.async copies: the same updates in the same
    order, so the same bits as aligned factors, and the float64 sequential pass."""
    import cupy

    from mgpu.backends.cupy_sgd import sgd_wave_gpu

    u, i = _power_law(6000, 300, 120, seed=k)
    r = np.random.default_rng(k).uniform(1, 5, u.size)
    order, s = build_schedule(u, i, 300, 120, seed=k, groups=5)
    su, si, sr = u[order], i[order], r[order]
    rng = np.random.default_rng(3)
    P0, Q0 = rng.random((300, k)) / np.sqrt(k), rng.random((120, k)) / np.sqrt(k)
    P, Q = P0.astype(dtype).astype(np.float64), Q0.astype(dtype).astype(np.float64)
    for epoch in range(2):
        sgd_block(su, si, sr, P, Q, 0.02, 0.05, 0.02, pass_order(s, epoch))
    dev = [cupy.asarray(su.astype(np.int32)), cupy.asarray(si.astype(np.int32)),
           cupy.asarray(sr.astype(dtype))]
    out = []
    for shift in (0, 1):
        Pb, Qb = cupy.empty(300 * k + 1, dtype=dtype), cupy.empty(120 * k + 1, dtype=dtype)
        Pg = Pb[shift:shift + 300 * k].reshape(300, k)
        Qg = Qb[shift:shift + 120 * k].reshape(120, k)
        Pg[...], Qg[...] = cupy.asarray(P0.astype(dtype)), cupy.asarray(Q0.astype(dtype))
        assert (Pg.data.ptr % 16 == 0) == (shift == 0) and Pg.flags.c_contiguous
        gs = WaveSchedule(s.groups, cupy.asarray(s.offsets), s.seed, s.size)
        for _ in range(2):
            sgd_wave_gpu(*dev, Pg, Qg, 0.02, 0.05, 0.02, gs)
        np.testing.assert_allclose(Pg.get(), P, rtol=rtol, atol=rtol, err_msg=f"shift {shift}")
        np.testing.assert_allclose(Qg.get(), Q, rtol=rtol, atol=rtol, err_msg=f"shift {shift}")
        out.append((Pg.get(), Qg.get()))
    assert np.array_equal(out[0][0], out[1][0]) and np.array_equal(out[0][1], out[1][1])


@pytest.mark.gpu
@pytest.mark.parametrize("t, kpl", [("float", 4), ("double", 4), ("float", 8)])
def test_gpu_wave_launch_holds_every_warp_the_registers_allow(t, kpl):
    """The driver's occupancy calculator is asked about the compiled wavefront kernel (its
    CUfunction, not a wrapper: a query that fails must not fall back to one block an SM) and
    agrees with the arithmetic of its registers and its shared memory (its ring of rows),
    the smaller of the two; the launch takes every resident warp up to G."""
    import cupy

    from mgpu.backends.cupy import current_facts
    from mgpu.backends.cupy_sgd import wave_occupancy, wave_warps
    from mgpu.backends.instances import wave_depths, wave_kernel
    from mgpu.backends.occupancy import blocks_by_registers, blocks_by_shared

    sms = current_facts().sms
    attrs = cupy.cuda.Device().attributes
    for depth in wave_depths(t, kpl):
        expr = wave_kernel(t, kpl, depth)
        occ = wave_occupancy(expr)
        assert occ.source == "driver" and occ.sms == sms, (expr, occ)
        assert occ.by_registers == blocks_by_registers(occ.regs, 64), (expr, occ)
        assert occ.shared >= 2 * 2 * depth * 32 * kpl * (4 if t == "float" else 8), (expr, occ)
        assert occ.by_shared == blocks_by_shared(
            occ.shared, shared_per_sm=attrs["MaxSharedMemoryPerMultiprocessor"]), (expr, occ)
        assert occ.blocks_per_sm == occ.by_resources == min(occ.by_registers, occ.by_shared) \
            >= 2, (expr, occ)
        resident = sms * occ.blocks_per_sm * 2
        for groups in (37, 1024, 4096):
            assert wave_warps(expr, groups) == (min(groups, resident), 2), (expr, groups, occ)
        assert wave_warps(expr, 1024, max_warps=7) == (7, 2)


@pytest.mark.gpu
def test_gpu_schedule_built_on_the_device_equals_the_host_one():
    import cupy

    u, i = _power_law(30_000, 2000, 400, seed=2)
    o_h, s_h = build_schedule(u, i, 2000, 400, seed=3)
    o_d, s_d = build_schedule(cupy.asarray(u), cupy.asarray(i), 2000, 400, seed=3)
    assert s_d.groups == s_h.groups and isinstance(s_d.offsets, cupy.ndarray)
    np.testing.assert_array_equal(s_d.offsets.get(), s_h.offsets)
    np.testing.assert_array_equal(o_d.get(), o_h)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["wavefront", "hogwild"])
def test_gpu_staged_block_runs_by_its_scheme(scheme):
    """stage_block orders a block for its scheme (the wavefront's order built on the device
    equals the host's) and run_staged runs it: on ratings that share no user or item every
    scheme must equal the sequential pass."""
    import cupy

    from mgpu.mf.staging import run_staged, stage_block

    rng = np.random.default_rng(5)
    n = 4000
    u, i = rng.permutation(n), rng.permutation(n)
    r = rng.uniform(1, 5, n)
    staged = stage_block((u, i, r), np.dtype(np.float64), 7, scheme)
    if scheme == "wavefront":
        order, s = build_schedule(u, i, n, n, seed=7)
        assert staged[3].groups == s.groups
        np.testing.assert_array_equal(staged[0].get(), u[order])
        np.testing.assert_array_equal(staged[3].offsets.get(), s.offsets)
    else:
        assert staged[3] is None
    P0, Q0 = rng.random((n, 32)), rng.random((n, 32))
    P, Q = P0.copy(), Q0.copy()
    sgd_block(u, i, r, P, Q, 0.01, 0.05, 0.05)
    Pg, Qg = cupy.asarray(P0), cupy.asarray(Q0)
    run_staged(staged, Pg, Qg, 0.01, 0.05, 0.05,
               {"scheme": scheme, "conflicts": 1.0, "max_warps": None})
    np.testing.assert_allclose(Pg.get(), P, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(Qg.get(), Q, rtol=1e-12, atol=1e-12)


def _movielens(data_dir):
    from mgpu.io import load_ratings
    from test_mf import _split

    R = load_ratings(data_dir / "ratings" / "ml-latest-small-2016_ratings.csv.gz").matrix
    return _split(R.tocoo())


@pytest.mark.gpu
def test_gpu_mode_at_the_default_reaches_the_movielens_target(data_dir):
    """The gpu mode at its default settings (the wavefront scheme) reaches the tests'
    MovieLens target (0.91, stricter than the issue's 0.98) within the sequential pass's
    epochs, for several seeds."""
    import mgpu
    from mgpu.distributed import connect
    from test_mf import MOVIELENS_TARGET

    train, test = _movielens(data_dir)
    with connect(gpus=True, n_workers=1):
        for seed in (0, 1, 2):
            mf = mgpu.MatrixFactorization(k=128, lr=0.005, reg=0.05, epochs=80,
                                          target_rmse=MOVIELENS_TARGET, mode="gpu", seed=seed)
            mf.fit(train, test)
            h = mf.history_
            assert h[-1]["test_rmse"] <= MOVIELENS_TARGET and len(h) < 80, (seed, h[-1])


@pytest.mark.gpu
def test_gpu_mode_at_the_default_is_deterministic_for_a_seed(data_dir):
    """The wavefront scheme fixes the order of every update: two fits with one seed give
    the same factors to the bit (the lock-free scheme cannot promise this)."""
    import mgpu
    from mgpu.distributed import connect

    train, test = _movielens(data_dir)
    with connect(gpus=True, n_workers=1):
        a, b = (mgpu.MatrixFactorization(k=128, epochs=3, mode="gpu", seed=4).fit(train, test)
                for _ in range(2))
    np.testing.assert_array_equal(a.P_, b.P_)
    np.testing.assert_array_equal(a.Q_, b.Q_)
