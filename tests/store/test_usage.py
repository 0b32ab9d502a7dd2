"""Slot usage: records written through WriteBatch, closed once, and counted over a window
with rows clipped to it, on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt

import pytest

from assay.master.store import Store, UsagePart, UsageRow, WriteBatch, pool_usage
from tests.store import _seed as seed

T0 = dt.datetime(2026, 11, 30, 22, 0, tzinfo=dt.UTC)
H = dt.timedelta(hours=1)


def _start(
    store: Store,
    trial_id: int,
    experiment_id: int,
    allocation_id: str,
    parts: list[UsagePart],
    at: dt.datetime,
) -> None:
    batch = WriteBatch()
    batch.add_allocation(
        allocation_id,
        trial_id=trial_id,
        run_id=1,
        placement=[{"agent_id": p.agent_id, "slots": list(range(p.slots))} for p in parts],
        now=at,
    )
    batch.usage_started(
        allocation_id,
        experiment_id=experiment_id,
        trial_id=trial_id,
        run_id=1,
        parts=parts,
        now=at,
    )
    store.apply(batch)


def _end(store: Store, allocation_id: str, at: dt.datetime, agent_id: str | None = None) -> None:
    batch = WriteBatch()
    if agent_id is None:
        batch.set_allocation(allocation_id, state="TERMINATED", ended_at=at)
    batch.usage_ended(allocation_id, at, agent_id=agent_id)
    store.apply(batch)


def _cpu(agent: str, slots: int, pool: str = "default") -> UsagePart:
    return UsagePart(agent, slots, "cpu", pool)


@pytest.fixture
def cluster(store: Store) -> Store:
    """alice: a 2-agent gang (2 + 1 slots) from T0 to T0+3h, crossing midnight;
    bob: 4 slots on agent b in pool "big" from T0+1h, still running."""
    alice = seed.experiment(store, name="alice-exp", owner="alice")
    bob = seed.experiment(store, name="bob-exp", owner="bob")
    ta = seed.trial(store, alice, request_id="a")
    tb = seed.trial(store, bob, request_id="b")
    _start(store, ta, alice, "a.1", [_cpu("a", 2), _cpu("b", 1)], T0)
    _start(store, tb, bob, "b.1", [_cpu("b", 4, "big")], T0 + H)
    _end(store, "a.1", T0 + 3 * H)
    return store


def _by(rows: list[UsageRow]) -> dict[str, float]:
    return {r.key: r.slot_seconds for r in rows}


def test_usage_is_grouped_and_clipped_to_the_window(cluster: Store) -> None:
    now = T0 + 5 * H
    whole = (T0 - H, T0 + 10 * H)
    assert _by(cluster.slot_usage(*whole, "user", at=now)) == {
        "alice": 3 * 3 * 3600.0,
        "bob": 4 * 4 * 3600.0,  # open: counted up to now
    }
    assert _by(cluster.slot_usage(*whole, "agent", at=now)) == {
        "a": 2 * 3 * 3600.0,
        "b": (1 * 3 + 4 * 4) * 3600.0,
    }
    assert _by(cluster.slot_usage(*whole, "pool", at=now)) == {
        "default": 9 * 3600.0,
        "big": 16 * 3600.0,
    }
    experiments = cluster.slot_usage(*whole, "experiment", at=now)
    assert [(r.name, r.slot_seconds) for r in experiments] == [
        ("bob-exp", 16 * 3600.0),  # largest first
        ("alice-exp", 9 * 3600.0),
    ]
    # A window that cuts both: [T0+2h, T0+4h) holds 1 h of alice's and 2 h of bob's.
    part = cluster.slot_usage(T0 + 2 * H, T0 + 4 * H, "user", at=now)
    assert _by(part) == {"alice": 3 * 3600.0, "bob": 8 * 3600.0}
    # Before anything started, and after alice's ended with bob's filtered out: nothing.
    assert cluster.slot_usage(T0 - 2 * H, T0, "user", at=now) == []
    alice = cluster.user_id("alice")
    late = cluster.slot_usage(T0 + 3 * H, T0 + 4 * H, "user", user_id=alice, at=now)
    assert late == []


def test_usage_by_day_splits_rows_at_utc_midnight(cluster: Store) -> None:
    now = T0 + 5 * H  # 03:00 on Dec 1
    days = cluster.slot_usage(T0 - H, T0 + 10 * H, "day", at=now)
    # Nov 30 22:00-24:00: alice 3 slots x 2 h, bob 4 slots x 1 h; Dec 1 the rest.
    assert [(r.key, r.slot_seconds) for r in days] == [
        ("2026-11-30", (3 * 2 + 4 * 1) * 3600.0),
        ("2026-12-01", (3 * 1 + 4 * 3) * 3600.0),
    ]
    per_day = cluster.slot_usage(T0 - H, T0 + 10 * H, "user", per_day=True, at=now)
    assert [(r.day, r.key, r.slot_seconds) for r in per_day] == [
        ("2026-11-30", "alice", 6 * 3600.0),
        ("2026-11-30", "bob", 4 * 3600.0),
        ("2026-12-01", "alice", 3 * 3600.0),
        ("2026-12-01", "bob", 12 * 3600.0),
    ]


def test_a_user_sees_only_their_own_usage(cluster: Store) -> None:
    bob = cluster.user_id("bob")
    rows = cluster.slot_usage(T0 - H, T0 + 10 * H, "agent", user_id=bob, at=T0 + 5 * H)
    assert _by(rows) == {"b": 16 * 3600.0}


def test_closing_is_once_and_per_part(store: Store) -> None:
    eid = seed.experiment(store, owner="carol")
    tid = seed.trial(store, eid, request_id="c")
    _start(store, tid, eid, "c.1", [_cpu("x", 1), _cpu("y", 2)], T0)
    assert store.open_usage() == [("c.1", "x"), ("c.1", "y")]
    _end(store, "c.1", T0 + H, agent_id="x")  # x was lost: its part ends first
    assert store.open_usage() == [("c.1", "y")]
    _end(store, "c.1", T0 + 2 * H)
    _end(store, "c.1", T0 + 9 * H)  # again, later: the first end stands
    assert store.open_usage() == []
    rows = store.slot_usage(T0, T0 + 10 * H, "agent", at=T0 + 10 * H)
    assert _by(rows) == {"x": 3600.0, "y": 2 * 2 * 3600.0}
    assert store.experiment_slot_seconds([eid], at=T0 + 10 * H) == {eid: 5 * 3600.0}


def test_orphans_close_at_their_allocations_end_or_when_found(store: Store) -> None:
    eid = seed.experiment(store, owner="dave")
    t1 = seed.trial(store, eid, request_id="1")
    t2 = seed.trial(store, eid, request_id="2")
    t3 = seed.trial(store, eid, request_id="3")
    _start(store, t1, eid, "ended", [_cpu("a", 1)], T0)
    _start(store, t2, eid, "live", [_cpu("a", 1)], T0)
    _start(store, t3, eid, "gone", [_cpu("a", 1)], T0)
    batch = WriteBatch()  # the allocation ended but its usage row was left open
    batch.set_allocation("ended", state="TERMINATED", ended_at=T0 + H)
    store.apply(batch)
    with store.write() as s:  # an allocation whose row is gone altogether
        from sqlalchemy import delete

        from assay.master.store._models import Allocation

        s.execute(delete(Allocation).where(Allocation.id == "gone"))
    batch = WriteBatch()
    batch.usage_orphans_closed(T0 + 5 * H)
    store.apply(batch)
    assert store.open_usage() == [("live", "a")]
    rows = store.slot_usage(T0, T0 + 10 * H, "experiment", at=T0 + 6 * H)
    assert _by(rows) == {str(eid): (1 + 6 + 5) * 3600.0}


def test_pool_usage_gives_used_and_idle_shares() -> None:
    used = [UsageRow("default", "default", "", 6 * 3600.0)]
    capacity: dict[str, list[tuple[int, dt.datetime | None]]] = {
        "default": [(3, None), (1, T0 - H)],  # joined before the window: all of it counts
        "empty": [(2, T0)],
        "late": [(4, T0 + 2 * H)],  # joined an hour before now: one hour of it counts
    }
    pools = pool_usage(used, capacity, T0, T0 + 10 * H, at=T0 + 3 * H)
    assert [(p.pool, p.used_slot_seconds, p.capacity_slot_seconds) for p in pools] == [
        ("default", 6 * 3600.0, 4 * 3 * 3600.0),  # the window counts up to now
        ("empty", 0.0, 2 * 3 * 3600.0),
        ("late", 0.0, 4 * 1 * 3600.0),
    ]
    assert pools[0].used_ratio == pytest.approx(0.5)
    assert pools[0].idle_ratio == pytest.approx(0.5)
    assert pools[1].idle_ratio == 1.0


def test_a_bad_grouping_or_window_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="cannot group usage by 'team'"):
        store.slot_usage(T0, T0 + H, "team")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="the window is empty"):
        store.slot_usage(T0, T0, "user")
