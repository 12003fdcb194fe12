"""The block scheduler on a CPU cluster: conflicts, counts, stealing and determinism; its
decisions (pick, steal) as pure functions, and a block's story, without one."""
from __future__ import annotations

import time
from concurrent.futures import Future

import pytest

from mgpu.sched import Block, BlockScheduler, Event, Slot
from mgpu.sched.blocks import story
from mgpu.sched.steal import Victim, choose_steal, is_free, pick, remaining_time, time_saved
from mgpu.distributed import workers_now


def _sleep(seconds: float, block_id: int) -> int:
    time.sleep(seconds)
    return block_id


def _grid(n: int, owners: int) -> list[Block]:
    """n×n blocks; block (i, j) owned by slot (i + j) % owners (a diagonal static plan)."""
    return [Block(id=i * n + j, row=i, col=j, size=1.0, owner=(i + j) % owners)
            for i in range(n) for j in range(n)]


def _slots(client) -> list[Slot]:
    workers = sorted(workers_now(client))
    return [Slot(f"w{k}", w) for k, w in enumerate(workers)]


def _runner(client, unit: float, slow: dict[str, float]):
    def run(blocks: tuple[Block, ...], slot: Slot):
        return client.submit(_sleep, unit * sum(b.size for b in blocks) * slow.get(slot.name, 1.0),
                             blocks[0].id, workers=[slot.worker], allow_other_workers=False,
                             pure=False)
    return run


def _check_no_shared_strata(events, blocks):
    """Replay start/finish events: blocks of two tasks running at once never share a row or
    a column (the blocks of one task run one after the other: they share their column, never
    a row)."""
    by_id = {b.id: b for b in blocks}
    running: dict[int, int] = {}  # block -> task
    for ev in events:
        b = by_id[ev.block]
        if ev.kind in ("assign", "steal"):
            for r, task in running.items():
                o = by_id[r]
                assert o.row != b.row, (ev, o)
                assert o.col != b.col or task == ev.task, (ev, o)
            running[b.id] = ev.task
        elif ev.kind == "finish":
            assert running.pop(b.id) == ev.task
    assert not running


def test_every_block_once_per_epoch_and_no_shared_strata(client):
    blocks = _grid(4, 2)
    sched = BlockScheduler(blocks, _slots(client), _runner(client, 0.02, {}), client=client)
    for epoch in (1, 2):
        events = sched.run_epoch()
        started = sorted(e.block for e in events if e.kind in ("assign", "steal"))
        assert started == sorted(b.id for b in blocks)
        assert set(sched.updates.values()) == {epoch}
        _check_no_shared_strata(events, blocks)
        assert all(e.epoch == epoch for e in events)


def test_a_slow_slot_loses_blocks_to_the_fast_one(client):
    blocks = _grid(6, 2)
    slots = _slots(client)
    slow = {slots[1].name: 4.0}
    fixed = BlockScheduler(blocks, slots, _runner(client, 0.03, slow), deterministic=True,
                           client=client)
    fixed.run_epoch()
    stealing = BlockScheduler(blocks, slots, _runner(client, 0.03, slow), client=client)
    events = stealing.run_epoch()
    steals = [e for e in events if e.kind == "steal"]
    assert steals and all(e.slot == slots[0].name for e in steals)
    assert all(e.reason.startswith(f"from {slots[1].name}: moving and running it here takes")
               for e in steals)
    assert not [e for e in fixed.events if e.kind == "steal"]
    _check_no_shared_strata(events, blocks)
    # a stolen block's story: stolen by the fast slot, finished there, in the same task
    for e in steals:
        assert [(x.kind, x.slot, x.task) for x in stealing.story(e.block)] == [
            ("steal", e.slot, e.task), ("finish", e.slot, e.task)]
    # the fast slot ran more than its planned half
    ran_fast = sum(1 for e in events if e.kind in ("assign", "steal") and e.slot == slots[0].name)
    assert ran_fast > len(blocks) // 2
    # the epoch's steals went to the Dask scheduler's log in one message
    _, last = client.get_events("mgpu-steal")[-1]
    assert last["epoch"] == 1
    assert [(e["block"], e["slot"]) for e in last["events"]] == [(e.block, e.slot) for e in steals]


def test_a_batch_runs_own_blocks_of_one_column_in_one_task(client):
    slots = _slots(client)
    # slot 0 owns a 4-row × 3-column region, slot 1 a 2 × 3 one beside it in other columns
    blocks = [Block(id=r * 6 + c, row=r, col=c, size=1.0, owner=0 if r < 4 else 1)
              for r in range(6) for c in range(3 if r < 4 else 6) if r < 4 or c >= 3]
    calls = []

    def run(group, slot):
        calls.append((slot.name, [b.id for b in group]))
        return _runner(client, 0.005, {})(group, slot)

    sched = BlockScheduler(blocks, slots, run, deterministic=True, client=client,
                           batch=lambda s: 3 if s.name == slots[0].name else 1)
    events = sched.run_epoch()
    by_id = {b.id: b for b in blocks}
    assert sorted(i for _, ids in calls for i in ids) == sorted(b.id for b in blocks)
    for name, ids in calls:
        group = [by_id[i] for i in ids]
        assert len(group) <= (3 if name == slots[0].name else 1)
        assert len({b.col for b in group}) == 1 and len({b.row for b in group}) == len(group)
    assert any(len(ids) == 3 for _, ids in calls)
    assert set(sched.updates.values()) == {1}
    _check_no_shared_strata(events, blocks)
    # one task per call: its blocks share the task id in the events
    tasks = {}
    for ev in events:
        if ev.kind == "assign":
            tasks.setdefault(ev.task, []).append(ev.block)
    assert sorted(map(sorted, tasks.values())) == sorted(sorted(ids) for _, ids in calls)


def _timed(seconds: float, block_ids: list[int], *after) -> tuple[float, float]:
    """Sleeps; ``after``: the futures of the tasks that last used the block's row and
    column (the segments of a real job), which Dask hands over once they are done."""
    start = time.time()
    time.sleep(seconds)
    return start, time.time()


def test_ahead_queues_a_slots_next_task_and_dask_orders_shared_strata(client):
    """With ``ahead`` a slot's next task is submitted while its last one runs; tasks that
    share a row or column never run at the same time, since each takes the futures of the
    tasks that last used its strata, and every block still runs once an epoch."""
    blocks = _grid(5, 2)
    slots = _slots(client)
    last: dict[tuple[str, int], object] = {}
    futs = {}

    def run(group, slot):
        b = group[0]
        fut = client.submit(_timed, 0.02, [o.id for o in group], last.get(("row", b.row)),
                            last.get(("col", b.col)), workers=[slot.worker],
                            allow_other_workers=False, pure=False)
        last[("row", b.row)] = last[("col", b.col)] = fut
        futs[b.id] = fut
        return fut

    sched = BlockScheduler(blocks, slots, run, client=client,
                           ahead=lambda s: 1 if s.name == slots[0].name else 0)
    for epoch in (1, 2):
        futs.clear()
        events = sched.run_epoch()
        assert sorted(e.block for e in events if e.kind != "finish") == sorted(b.id
                                                                            for b in blocks)
        assert set(sched.updates.values()) == {epoch}
        ran = dict(zip(futs, client.gather(list(futs.values()))))
        by_id = {b.id: b for b in blocks}
        for x, (s0, e0) in ran.items():
            for y, (s1, e1) in ran.items():
                bx, by = by_id[x], by_id[y]
                if x < y and (bx.row == by.row or bx.col == by.col):
                    assert e0 <= s1 + 1e-3 or e1 <= s0 + 1e-3, (bx, by)
        # in flight together (submitted, not yet heard of), only one slot's tasks share
        running: dict[int, str] = {}
        for ev in events:
            b = by_id[ev.block]
            if ev.kind == "finish":
                running.pop(b.id)
                continue
            for o, slot in running.items():
                if by_id[o].row == b.row or by_id[o].col == b.col:
                    assert slot == ev.slot, (ev, by_id[o], slot)
            running[b.id] = ev.slot
        queued = [e for e in events if "behind 1 task(s) of this slot" in e.reason]
        assert queued and all(e.slot == slots[0].name for e in queued)


def _fail_on(block_id: int, bad: int) -> int:
    if block_id == bad:
        raise ValueError(f"block {bad} could not run")
    return block_id


def test_a_failed_block_stops_the_epoch_with_its_own_error(client):
    blocks = _grid(3, 2)
    slots = _slots(client)

    def run(group, slot):
        return client.submit(_fail_on, group[0].id, 4, workers=[slot.worker],
                             allow_other_workers=False, pure=False)

    with pytest.raises(ValueError, match="block 4 could not run"):
        BlockScheduler(blocks, slots, run, client=client).run_epoch()


def test_no_steal_when_moving_costs_more_than_it_saves(client):
    blocks = _grid(4, 2)
    slots = _slots(client)
    sched = BlockScheduler(blocks, slots, _runner(client, 0.01, {slots[1].name: 3.0}),
                           transfer=lambda b, s: 100.0, client=client)
    events = sched.run_epoch()
    assert not [e for e in events if e.kind == "steal"]
    assert sorted(e.block for e in events if e.kind == "assign") == sorted(b.id for b in blocks)


def test_deterministic_order_is_the_plan(client):
    blocks = _grid(4, 2)
    slots = _slots(client)
    orders = []
    for _ in range(2):
        sched = BlockScheduler(blocks, slots, _runner(client, 0.005, {}), deterministic=True,
                               client=client)
        events = sched.run_epoch()
        orders.append([(e.slot, e.block) for e in events if e.kind == "assign"])
        per_slot = {s.name: [e.block for e in events if e.kind == "assign" and e.slot == s.name]
                    for s in slots}
        for k, s in enumerate(slots):
            assert sorted(per_slot[s.name]) == sorted(b.id for b in sched.plan[k])
            assert all(b.owner == k for b in sched.plan[k])
    assert [sorted(o) for o in orders][0] == [sorted(o) for o in orders][1]


def test_static_plan_for_unowned_blocks_balances_expected_time():
    slots = [Slot("gpu", "tcp://a", "gpu"), Slot("cpu", "tcp://b")]
    blocks = [Block(id=i, row=i, col=i, size=float(1 + i % 3)) for i in range(12)]
    # the GPU runs a block 3× faster: it should get about 3/4 of the work
    sched = BlockScheduler(blocks, slots, run=lambda b, s: None,
                           cost=lambda b, s: b.size / (3.0 if s.kind == "gpu" else 1.0))
    work = [sum(b.size for b in q) for q in sched.plan]
    assert sum(len(q) for q in sched.plan) == 12
    assert 0.65 < work[0] / sum(work) < 0.85


def test_bad_blocks_and_slots_are_refused():
    with pytest.raises(ValueError, match="at least one slot"):
        BlockScheduler([Block(0, 0, 0)], [], run=lambda b, s: None)
    with pytest.raises(ValueError, match="repeated block ids"):
        BlockScheduler([Block(0, 0, 0), Block(0, 1, 1)], [Slot("a", "x")], run=lambda b, s: None)
    with pytest.raises(ValueError, match="owned by slot 3, but there are 1 slots"):
        BlockScheduler([Block(0, 0, 0, owner=3)], [Slot("a", "x")], run=lambda b, s: None)


# ---------------------------------------------------------------------- the pure decisions
# No futures, no cluster: the steal decision and the pick from plain queues and strata.

def _victim(slot: int, remaining: float, *blocks: Block) -> Victim:
    return Victim(slot, f"v{slot}", remaining, list(blocks))


def _const(seconds: float):
    return lambda b: seconds


def test_pick_takes_the_least_updated_free_block_first_in_queue_order_on_ties():
    q = [Block(0, 0, 0), Block(1, 1, 1), Block(2, 2, 2), Block(3, 3, 3)]
    updates = {0: 2, 1: 1, 2: 1, 3: 0}
    assert pick(q, 0, {}, {}, updates).id == 3
    assert pick(q, 0, {3: 1}, {}, updates).id == 1  # row 3 held by slot 1; 1 and 2 tie
    assert pick(q, 0, {}, {}, None).id == 0  # deterministic: plan order
    assert pick(q, 0, {0: 1}, {1: 1}, None).id == 2
    # strata held by the picking slot itself are no conflict
    assert pick(q, 1, {3: 1}, {}, updates).id == 3
    assert pick(q, 0, {0: 1, 1: 1}, {2: 1, 3: 2}, updates) is None
    assert pick([], 0, {}, {}, updates) is None


def test_is_free_only_when_no_other_slot_holds_the_row_or_the_column():
    b = Block(7, row=2, col=5)
    assert is_free(b, 0, {}, {})
    assert is_free(b, 0, {2: 0}, {5: 0})
    assert not is_free(b, 0, {2: 1}, {})
    assert not is_free(b, 0, {}, {5: 1})


def test_remaining_time_counts_the_queue_at_the_slots_speed_and_whats_left_in_flight():
    assert remaining_time(4.0, 0.5, [], now=0.0) == 2.0
    # running for 1 s of its 3; a queued task behind it counts whole
    assert remaining_time(4.0, 0.5, [(3.0, 10.0), (1.0, None)], now=11.0) == 5.0
    assert remaining_time(0.0, 1.0, [(1.0, 10.0)], now=15.0) == 0.0  # overdue: none left


def test_time_saved_is_what_the_victim_has_left_less_moving_and_running():
    assert time_saved(0.5, 1.0, 4.0) == 2.5
    assert time_saved(3.0, 1.0, 4.0) == 0.0
    assert time_saved(3.0, 2.0, 4.0) < 0


def test_steal_the_least_updated_free_block_of_the_slot_with_most_time_left():
    a = _victim(1, 3.0, Block(10, 0, 0), Block(11, 1, 1))
    b = _victim(2, 8.0, Block(20, 2, 2), Block(21, 3, 3), Block(22, 4, 4))
    updates = {10: 0, 11: 0, 20: 3, 21: 1, 22: 1}
    got = choose_steal(0, [a, b], {}, {}, updates, _const(0.5), _const(1.0))
    assert got.block == Block(21, 3, 3) and got.victim == b and got.need == 1.5
    assert got.reason == "from v2: moving and running it here takes 1.5 s, v2 has 8 s left"


def test_nothing_to_steal_when_no_other_slot_has_blocks_queued():
    for victims in ([], [_victim(1, 5.0)], [_victim(0, 9.0, Block(1, 1, 1)), _victim(1, 2.0)]):
        got = choose_steal(0, victims, {}, {}, {1: 0}, _const(0.0), _const(1.0))
        assert got.block is None and got.victim is None
        assert got.reason == "no other slot has blocks queued"


def test_no_steal_when_moving_costs_as_much_as_it_saves_or_more():
    v = _victim(1, 4.0, Block(1, 1, 1))
    for transfer in (3.0, 3.5, 100.0):  # 3 + 1 == 4: saves nothing
        got = choose_steal(0, [v], {}, {}, {1: 0}, _const(transfer), _const(1.0))
        assert got.block is None and got.victim == v
        assert got.reason.startswith("not block 1 from v1: moving and running it here takes")
    assert choose_steal(0, [v], {}, {}, {1: 0}, _const(2.9), _const(1.0)).block == Block(1, 1, 1)


def test_only_the_slot_with_most_time_left_decides():
    """Its block not worth moving, nothing moves, though a slot with less left has a block
    that would be: the others end sooner anyway."""
    big, cheap = Block(1, 1, 1, size=9.0), Block(2, 2, 2, size=1.0)
    got = choose_steal(0, [_victim(1, 5.0, big), _victim(2, 4.0, cheap)], {}, {}, {1: 0, 2: 0},
                       _const(0.0), lambda b: b.size)
    assert got.block is None and got.victim.slot == 1


def test_blocks_sharing_a_stratum_with_another_slots_task_are_passed_over():
    v1 = _victim(1, 9.0, Block(1, 1, 1), Block(2, 2, 1))
    v2 = _victim(2, 5.0, Block(3, 3, 3))
    updates = {1: 0, 2: 0, 3: 0}
    # slot 1's blocks are all in column 1, held by slot 3's task in flight: slot 2 decides
    got = choose_steal(0, [v1, v2], {}, {1: 3}, updates, _const(0.0), _const(1.0))
    assert got.block == Block(3, 3, 3) and got.victim == v2
    # a row held rules out one block of slot 1, not the other
    got = choose_steal(0, [v1, v2], {1: 3}, {}, updates, _const(0.0), _const(1.0))
    assert got.block == Block(2, 2, 1) and got.victim == v1
    got = choose_steal(0, [v1, v2], {3: 1}, {1: 2}, updates, _const(0.0), _const(1.0))
    assert got.block is None and got.victim is None
    assert got.reason.startswith("every queued block shares a row or a column")


def test_victims_with_equal_time_left_go_by_slot_index():
    v2, v1 = _victim(2, 5.0, Block(2, 2, 2)), _victim(1, 5.0, Block(1, 1, 1))
    got = choose_steal(0, [v2, v1], {}, {}, {1: 0, 2: 0}, _const(0.0), _const(1.0))
    assert got.victim == v1 and got.block == Block(1, 1, 1)


def test_the_cost_model_is_asked_only_for_the_block_weighed_transfer_first():
    asked = []

    def transfer(b):
        asked.append(("transfer", b.id))
        return 0.25

    def cost(b):
        asked.append(("cost", b.id))
        return 1.0

    v = _victim(1, 6.0, Block(1, 1, 1), Block(2, 2, 2))
    got = choose_steal(0, [v], {}, {}, {1: 1, 2: 0}, transfer, cost)
    assert got.block.id == 2 and asked == [("transfer", 2), ("cost", 2)]
    assert got.reason == "from v1: moving and running it here takes 1.25 s, v1 has 6 s left"


# ---------------------------------------------------------------------- story
def test_story_picks_a_blocks_events_in_order():
    events = [Event(0.0, "assign", 1, "a", "own queue", 1, 1),
              Event(0.1, "steal", 2, "b", "from a: ...", 1, 2),
              Event(0.4, "finish", 1, "a", "took 0.4 s", 1, 1),
              Event(0.5, "finish", 2, "b", "took 0.4 s", 1, 2),
              Event(0.6, "assign", 1, "a", "own queue", 2, 3)]
    assert story(events, 1) == [events[0], events[2], events[4]]
    assert story(events, Block(2, 0, 0)) == [events[1], events[3]]
    assert story(events, 2, Block(1, 0, 0)) == events
    assert story(events, 9) == [] and story(events) == []


class _Done:
    """A client that only keeps what is logged."""

    def __init__(self) -> None:
        self.logged: list[tuple[str, dict]] = []

    def log_event(self, topic: str, msg: dict) -> None:
        self.logged.append((topic, msg))


def _done_now(group, slot) -> Future:
    fut: Future = Future()
    fut.set_result(None)
    return fut


def test_scheduler_story_follows_a_block_over_epochs_without_a_cluster():
    slots = [Slot("a", "x"), Slot("b", "y")]
    blocks = _grid(3, 2)
    client = _Done()
    sched = BlockScheduler(blocks, slots, _done_now, deterministic=True, client=client)
    sched.run_epoch()
    sched.run_epoch()
    for b in blocks:
        got = sched.story(b)
        assert [(e.kind, e.epoch) for e in got] == [("assign", 1), ("finish", 1),
                                                    ("assign", 2), ("finish", 2)]
        assert {e.slot for e in got} == {slots[b.owner].name}
        assert got == sched.story(b.id) == story(sched.events, b)
    both = sched.story(blocks[0], blocks[4].id)
    assert both == [e for e in sched.events if e.block in (blocks[0].id, blocks[4].id)]
    assert [t for t, _ in client.logged] == ["mgpu-assign", "mgpu-assign"]
