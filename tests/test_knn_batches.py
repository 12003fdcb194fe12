"""How a GPU kNN call cuts its queries into launches (mgpu.backends.knn_batches): pure
arithmetic, checked here without a GPU; the GPU tests run the launches it plans."""
from __future__ import annotations

import numpy as np
import pytest

from mgpu.backends.knn_batches import (
    FUSED_KMAX,
    MAX_GROUPS,
    WARPS_PER_BLOCK,
    KnnBatches,
    fused_kmax,
    lane_slots,
    plan_dense,
    plan_fused,
    row_blocks,
)

H100 = {"sms": 132, "l2_bytes": 50 * 2**20}
MIB = 2**20
BUDGET = 256 * MIB  # mgpu.knn.working-memory's default


def _covers(plan: KnnBatches, n_queries: int) -> None:
    """The launches take every query once, each within the budget's count of queries."""
    starts = list(range(0, n_queries, plan.per_launch))
    assert len(starts) == plan.launches
    assert sum(min(n_queries, s + plan.per_launch) - s for s in starts) == n_queries


def test_a_small_index_answers_every_query_in_one_launch():
    # AP: 2,246 documents × 10,473 words, every document a query, float32, k=10
    plan = plan_fused(2246, 10473, 2246, 10, 4, budget=BUDGET, **H100)
    assert plan.launches == 1 and plan.per_launch == 2246
    # per-warp lists of 10 would keep 10 × 2,248 warps' entries for 2,246 rows: every key
    assert plan.tile and plan.kmax == 0
    assert plan.blocks == 281 and plan.width == 128 and plan.groups == 18
    assert plan.query_bytes == 10473 * 4 + 2246 * 4
    assert "1 launch(es) of up to 2,246 queries (key tile, 128 a group, grid 281×18)" \
        in plan.describe()


def test_the_old_batch_of_128_queries_took_eighteen_launches_for_the_same_work():
    plan = plan_fused(2246, 10473, 2246, 10, 4, budget=BUDGET, **H100)
    assert -(-2246 // 128) == 18 == plan.groups  # the groups the one launch holds


def test_a_large_index_keeps_the_lists_and_the_group_width_of_one_batch_before():
    # the peer-timing corpus: 100,000 × 50,000, 2,000 queries, k=10, float32
    n_rows, n_features, nq, k, item = 100_000, 50_000, 2000, 10, 4
    plan = plan_fused(n_rows, n_features, nq, k, item, budget=BUDGET, **H100)
    assert not plan.tile and plan.kmax == 16 and plan.blocks == 132 * 4
    # the width the old one-group batches had: 32·4 lanes, the query block in half the L2
    per_query = n_features * item + plan.blocks * WARPS_PER_BLOCK * k * (item + 4)
    old = max(1, min(128, nq, (H100["l2_bytes"] // 2) // (n_features * item),
                     BUDGET // per_query))
    old = old - old % 32 if old > 32 else old
    assert plan.width == old == 128 and plan.query_bytes == per_query
    assert plan.per_launch % plan.width == 0 and plan.per_launch * per_query <= BUDGET
    assert plan.launches < -(-nq // old)  # fewer launches than one a group
    _covers(plan, nq)


@pytest.mark.parametrize("k, kmax", [(1, 16), (16, 16), (17, 128), (128, 128)])
def test_list_lengths_and_lanes_follow_k(k, kmax):
    plan = plan_fused(1_000_000, 1000, 5000, k, 8, budget=4 * 2**30, **H100)
    assert fused_kmax(k) == kmax and plan.kmax == kmax and not plan.tile
    assert plan.width == 32 * lane_slots(kmax) == (32 if kmax == 128 else 128)


def test_k_beyond_the_lists_takes_the_key_tile_with_the_sorts_order():
    plan = plan_fused(1_000_000, 1000, 50, 200, 4, budget=BUDGET, **H100)
    assert fused_kmax(200) == 0 and plan.tile and plan.kmax == 0
    assert plan.query_bytes == 1000 * 4 + 1_000_000 * (4 + 8)


def test_a_budget_for_one_query_gives_a_launch_a_query():
    plan = plan_fused(2246, 10473, 300, 10, 8, budget=1, **H100)
    assert plan.per_launch == 1 and plan.width == 1 and plan.launches == 300
    _covers(plan, 300)


def test_a_budget_for_some_queries_cuts_whole_groups():
    per_query = plan_fused(2246, 10473, 1, 10, 4, budget=BUDGET, **H100).query_bytes
    plan = plan_fused(2246, 10473, 2246, 10, 4, budget=700 * per_query, **H100)
    assert plan.width == 128 and plan.per_launch == 640 and plan.launches == 4
    _covers(plan, 2246)


def test_no_queries_no_launch_and_a_grid_within_cuda_limits():
    assert plan_fused(10, 5, 0, 1, 4, budget=BUDGET, **H100).launches == 0
    assert plan_dense(10, 0, 1, 4, budget=BUDGET).launches == 0
    plan = plan_fused(10, 5, 10**9, 1, 4, budget=2**62, **H100)
    assert plan.groups <= MAX_GROUPS and plan.per_launch == MAX_GROUPS * plan.width
    assert row_blocks(0, 132) == 1 and row_blocks(17, 132) == 3


def test_pairwise_keys_count_only_the_query_block():
    plan = plan_fused(2246, 10473, 2246, 1, 4, budget=BUDGET, keys_out=True, **H100)
    assert plan.tile and plan.kmax == 0 and plan.query_bytes == 10473 * 4
    assert plan.launches == 1


def test_wide_queries_keep_a_group_in_half_the_l2_with_those_beside_it():
    # 2,000 rows take 250 blocks: three groups run beside each other on 528 block slots
    plan = plan_fused(2000, 1_000_000, 1000, 10, 4, budget=2**34, **H100)
    assert plan.blocks == 250
    resident = -(-132 * 4 // 250)
    assert resident == 3
    assert plan.width == (H100["l2_bytes"] // 2) // resident // (1_000_000 * 4) == 2


def test_dense_launches_hold_the_whole_query_set_when_it_fits():
    # MNIST t10k: 10,000 rows, float32, k=10: 40 kB of keys a query
    plan = plan_dense(10_000, 2246, 10, 4, budget=BUDGET)
    assert plan.launches == 1 and plan.query_bytes == 40_000 and plan.blocks == 0
    assert plan.describe() == "1 launch(es) of up to 2,246 queries (cuBLAS keys)"
    plan = plan_dense(10_000, 10_000, 10, 4, budget=BUDGET)
    assert plan.per_launch == BUDGET // 40_000 and plan.launches == 2
    assert plan_dense(10_000, 10, 200, 4, budget=BUDGET).query_bytes == 10_000 * 12


def test_random_shapes_keep_every_rule():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        n_rows, n_feat = int(rng.integers(1, 10**6)), int(rng.integers(1, 10**6))
        nq, k = int(rng.integers(1, 10**5)), int(rng.integers(1, 300))
        item = int(rng.choice([4, 8]))
        budget = int(rng.integers(1, 2**31))
        facts = {"sms": int(rng.integers(1, 200)), "l2_bytes": int(rng.integers(2**20, 2**27))}
        plan = plan_fused(n_rows, n_feat, nq, k, item, budget=budget, **facts)
        assert 1 <= plan.width <= 32 * lane_slots(plan.kmax)
        assert plan.kmax in (0, *FUSED_KMAX) and (plan.kmax == 0) == plan.tile
        assert plan.tile or plan.kmax >= k
        assert plan.per_launch * plan.query_bytes <= max(budget, plan.query_bytes)
        assert plan.per_launch <= nq and plan.groups <= MAX_GROUPS
        assert plan.per_launch == nq or plan.per_launch % plan.width == 0
        if plan.width > 32:
            assert plan.width % 32 == 0
        _covers(plan, nq)
