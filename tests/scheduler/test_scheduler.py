"""The scheduler: placement rules, bookkeeping, snapshots, and a simulation of a busy cluster.

The simulation checks every decision against an independent model of the rules (free slot
sets per agent), so a bug must fool two implementations to pass.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assay.master.scheduler import Agent, Decision, Request, Scheduler, SlotType, Wait


def _cluster(*agents: tuple[str, int], slot_type: SlotType = "cuda") -> Scheduler:
    scheduler = Scheduler()
    for agent_id, slots in agents:
        scheduler.add_agent(Agent(agent_id, slots, slot_type))
    return scheduler


def _req(rid: str, slots: int, priority: int = 42, order: int = 0) -> Request:
    return Request(rid, slots, "cuda", priority=priority, order=order)


def _place(scheduler: Scheduler, *requests: Request) -> dict[str, Any]:
    decision = scheduler.schedule(requests)
    return {a.request_id: a.placement for a in decision.assignments}


# -- placement -------------------------------------------------------------------------------


def test_best_fit_picks_the_fullest_agent_that_fits_and_its_lowest_slots() -> None:
    scheduler = _cluster(("big", 8), ("mid", 4), ("small", 2))
    assert _place(scheduler, _req("r1", 2)) == {"r1": (("small", (0, 1)),)}
    assert _place(scheduler, _req("r2", 3)) == {"r2": (("mid", (0, 1, 2)),)}
    assert _place(scheduler, _req("r3", 1)) == {"r3": (("mid", (3,)),)}
    assert _place(scheduler, _req("r4", 5)) == {"r4": (("big", (0, 1, 2, 3, 4)),)}


def test_best_fit_ties_go_to_the_lowest_agent_id() -> None:
    scheduler = _cluster(("b", 4), ("a", 4), ("c", 4))
    assert _place(scheduler, _req("r", 4)) == {"r": (("a", (0, 1, 2, 3)),)}


def test_released_slots_are_reused_lowest_first() -> None:
    scheduler = _cluster(("a", 4))
    _place(scheduler, _req("r1", 1), _req("r2", 2, order=1))
    assert scheduler.release("r1") is True
    assert scheduler.release("r1") is False
    assert scheduler.free_slots("a") == (0, 3)
    assert _place(scheduler, _req("r3", 2)) == {"r3": (("a", (0, 3)),)}


def test_spanning_splits_equally_over_the_fewest_agents() -> None:
    scheduler = _cluster(("a", 4), ("b", 4), ("c", 4))
    assert _place(scheduler, _req("r8", 8)) == {"r8": (("a", (0, 1, 2, 3)), ("b", (0, 1, 2, 3)))}
    scheduler = _cluster(("a", 4), ("b", 4), ("c", 4))
    assert _place(scheduler, _req("r12", 12))["r12"] == tuple(
        (agent, (0, 1, 2, 3)) for agent in "abc"
    )
    scheduler = _cluster(("a", 4), ("b", 4), ("c", 4))
    assert _place(scheduler, _req("r6", 6)) == {"r6": (("a", (0, 1, 2)), ("b", (0, 1, 2)))}


def test_spanning_prefers_the_fullest_agents_that_can_give_an_equal_share() -> None:
    scheduler = _cluster(("a", 2), ("b", 3), ("c", 4), ("d", 4))
    # 6 slots: no single agent; k=2 needs 3 each: b (3 free), then c (4 free, id before d).
    assert _place(scheduler, _req("r6", 6)) == {"r6": (("b", (0, 1, 2)), ("c", (0, 1, 2)))}


def test_priority_first_then_submission_order() -> None:
    scheduler = _cluster(("a", 1))
    low, high = _req("low", 1, priority=50, order=0), _req("high", 1, priority=10, order=1)
    assert list(_place(scheduler, low, high)) == ["high"]
    scheduler = _cluster(("a", 2))
    late, early, third = _req("late", 1, order=5), _req("early", 1, order=2), _req("x", 1, order=9)
    decision = scheduler.schedule([late, third, early])
    assert [a.request_id for a in decision.assignments] == ["early", "late"]


def test_greedy_backfill_places_later_requests_that_fit() -> None:
    scheduler = _cluster(("a", 4))
    _place(scheduler, _req("running", 2))
    decision = scheduler.schedule([_req("big", 4, priority=1), _req("small", 2, priority=90)])
    assert [a.request_id for a in decision.assignments] == ["small"]
    assert decision.unschedulable == []


def test_requests_the_cluster_can_never_hold_are_reported_and_stay_pending() -> None:
    scheduler = _cluster(("a", 8))
    huge = _req("huge", 16)
    decision = scheduler.schedule([huge, _req("ok", 8, priority=99)])
    why = "needs 16 GPU slots; the cluster has 8 (1 agent)"
    assert decision == Decision(
        assignments=decision.assignments,
        unschedulable=[("huge", why)],
        waiting={"huge": Wait("too_large", why)},
    )
    assert [a.request_id for a in decision.assignments] == ["ok"]
    scheduler.release("ok")
    scheduler.add_agent(Agent("b", 8, "cuda"))
    assert _place(scheduler, huge) == {"huge": (("a", tuple(range(8))), ("b", tuple(range(8))))}


def test_unschedulable_reasons_name_missing_agents_and_unequal_splits() -> None:
    scheduler = _cluster(("a", 4), ("b", 4), slot_type="cpu")
    decision = scheduler.schedule([_req("gpu", 1), Request("odd", 5, "cpu")])
    assert decision.assignments == []
    assert dict(decision.unschedulable) == {
        "gpu": "needs 1 GPU slot; no GPU agent is connected",
        "odd": "needs 5 CPU slots; the cluster has 8 (2 agents), but a trial's slots are split "
        "equally over its agents, which 5 cannot be here (4 could)",
    }
    scheduler.set_agent_enabled("b", False)
    assert (
        scheduler.why_never(6, "cpu")
        == "needs 6 CPU slots; the cluster has 4 (1 agent, 1 more disabled)"
    )
    assert scheduler.why_never(4, "cpu") is None  # it fits: it only waits for free slots
    scheduler.set_agent_enabled("a", False)
    assert scheduler.why_never(1, "cpu") == "needs 1 CPU slot; every CPU agent is disabled (2)"


# -- agents ----------------------------------------------------------------------------------


def test_removing_an_agent_returns_its_requests_and_frees_their_slots_everywhere() -> None:
    scheduler = _cluster(("a", 4), ("b", 4), ("c", 4))
    _place(scheduler, _req("span", 8), _req("other", 2, order=1))
    assert scheduler.allocation_of("span") == (("a", (0, 1, 2, 3)), ("b", (0, 1, 2, 3)))
    assert scheduler.remove_agent("a") == ["span"]
    assert scheduler.free_slots("b") == (0, 1, 2, 3)
    assert scheduler.allocation_of("span") is None
    assert scheduler.allocation_of("other") == (("c", (0, 1)),)
    assert [a.id for a in scheduler.agents] == ["b", "c"]
    with pytest.raises(ValueError, match="unknown agent 'a'"):
        scheduler.remove_agent("a")
    assert scheduler.has_agents
    scheduler.remove_agent("b")
    scheduler.remove_agent("c")
    assert not scheduler.has_agents
    assert not Scheduler().has_agents


def test_disabled_agents_keep_running_allocations_but_get_no_new_ones() -> None:
    scheduler = _cluster(("a", 4), ("b", 2))
    _place(scheduler, _req("r1", 2))
    assert scheduler.set_agent_enabled("b", False) == []
    assert scheduler.allocation_of("r1") == (("b", (0, 1)),)
    scheduler.release("r1")
    assert _place(scheduler, _req("r2", 2)) == {"r2": (("a", (0, 1)),)}
    assert _place(scheduler, _req("r3", 4)) == {}
    assert scheduler.set_agent_enabled("b", True) == []
    assert _place(scheduler, _req("r3", 4)) == {"r3": (("a", (2, 3)), ("b", (0, 1)))}


def test_disabling_without_drain_evicts_like_removal() -> None:
    scheduler = _cluster(("a", 2), ("b", 2))
    _place(scheduler, _req("span", 4))
    assert scheduler.set_agent_enabled("a", False, drain=False) == ["span"]
    assert scheduler.free_slots("a") == (0, 1)
    assert scheduler.free_slots("b") == (0, 1)
    assert scheduler.agents[0] == Agent("a", 2, "cuda", enabled=False)


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"slots": 0}, r"slots must be an integer >= 1, got 0"),
        ({"priority": 0}, r"priority must be an integer in 1\.\.99, got 0"),
        ({"priority": 100}, r"priority must be an integer in 1\.\.99, got 100"),
        ({"slot_type": "tpu"}, r"slot_type must be one of \('cpu', 'cuda'\), got 'tpu'"),
        ({"order": -1}, r"order must be an integer >= 0, got -1"),
        ({"id": ""}, r"request id must be a non-empty string, got ''"),
    ],
)
def test_bad_requests_are_refused_with_the_rule(kwargs: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = {"id": "r", "slots": 1, "slot_type": "cuda"} | kwargs
    with pytest.raises(ValueError, match=message):
        Request(**fields)


def test_bad_agents_and_calls_are_refused() -> None:
    with pytest.raises(ValueError, match=r"agent 'a' slots must be an integer >= 1, got 0"):
        Agent("a", 0, "cuda")
    scheduler = _cluster(("a", 2))
    with pytest.raises(ValueError, match="duplicate agent id 'a'"):
        scheduler.add_agent(Agent("a", 4, "cpu"))
    with pytest.raises(ValueError, match="unknown agent 'zz'"):
        scheduler.set_agent_enabled("zz", False)
    with pytest.raises(ValueError, match="unknown agent 'zz'"):
        scheduler.free_slots("zz")
    with pytest.raises(ValueError, match="request 'r' is pending twice"):
        scheduler.schedule([_req("r", 1), _req("r", 1)])
    _place(scheduler, _req("r", 1))
    with pytest.raises(ValueError, match="request 'r' is pending but already holds"):
        scheduler.schedule([_req("r", 1)])


# -- snapshots -------------------------------------------------------------------------------


def test_json_round_trip_is_exact() -> None:
    scheduler = _cluster(("b", 4), ("a", 4), ("c", 8))
    scheduler.set_agent_enabled("c", False)
    _place(scheduler, _req("span", 6), _req("one", 1, order=1))
    data = scheduler.to_json()
    restored = Scheduler.from_json(json.loads(json.dumps(data)))
    assert restored.to_json() == data
    assert restored.allocations == scheduler.allocations
    assert restored.agents == scheduler.agents
    pending = [_req("x", 2), _req("y", 8, order=1)]
    assert restored.schedule(pending) == scheduler.schedule(pending)


def test_corrupt_snapshots_are_refused() -> None:
    data = _cluster(("a", 2)).to_json()
    with pytest.raises(ValueError, match="version must be 1, got 7"):
        Scheduler.from_json(data | {"version": 7})
    booked = [{"request_id": r, "placement": [["a", [1]]]} for r in ("r1", "r2")]
    with pytest.raises(ValueError, match="slot 1 of agent 'a' is already held by 'r1'"):
        Scheduler.from_json(data | {"allocations": booked})
    outside = [{"request_id": "r", "placement": [["a", [2]]]}]
    with pytest.raises(ValueError, match=r"slot 2 of agent 'a' is outside 0\.\.1"):
        Scheduler.from_json(data | {"allocations": outside})


# -- simulation ------------------------------------------------------------------------------

SIZES = (1, 1, 1, 2, 2, 3, 4, 4, 6, 8, 8, 12, 16, 24, 32)
PRIORITIES = (1, 10, 42, 42, 42, 50, 99)
ADD, REMOVE, TOGGLE, SUBMIT, FINISH, CANCEL, SNAPSHOT = range(7)
WEIGHTS = (8, 3, 3, 30, 20, 8, 2)


def _fits(slots: int, free: list[int]) -> bool:
    """The placement rule, restated: some k | slots with k agents of >= slots/k free."""
    return any(
        slots % k == 0 and sum(f >= slots // k for f in free) >= k for k in range(1, slots + 1)
    )


class World:
    """A cluster driven by events; every call checks the scheduler against a model."""

    def __init__(self) -> None:
        self.scheduler = Scheduler()
        self.twin = Scheduler()  # fed the same events; sometimes replaced by a restored copy
        self.pending: dict[str, Request] = {}
        self.running: dict[str, Request] = {}
        self.count = 0
        self.unschedulable: list[str] = []

    def step(self, kind: int, arg: int) -> None:
        self.count += 1
        agents = sorted(a.id for a in self.scheduler.agents)
        if kind == ADD and len(agents) < 12:
            slot_type: SlotType = "cpu" if arg % 5 == 0 else "cuda"
            agent = Agent(f"a{self.count}", (1, 2, 4, 8, 8)[(arg >> 3) % 5], slot_type)
            self.scheduler.add_agent(agent)
            self.twin.add_agent(agent)
        elif kind in (REMOVE, TOGGLE) and agents:
            self._evict(agents[arg % len(agents)], kind, drain=bool(arg >> 8 & 1))
        elif kind == SUBMIT and len(self.pending) < 25:
            rid = f"r{self.count}"
            slot_type = "cpu" if arg % 7 == 0 else "cuda"
            slots, priority = SIZES[(arg >> 3) % len(SIZES)], PRIORITIES[(arg >> 7) % 7]
            self.pending[rid] = Request(rid, slots, slot_type, priority, order=self.count)
        elif kind == FINISH and self.running:
            rid = sorted(self.running)[arg % len(self.running)]
            assert self.scheduler.release(rid) is True
            assert self.twin.release(rid) is True
            del self.running[rid]
        elif kind == CANCEL and self.pending:
            # Users give up on what can never run first.
            choices = self.unschedulable or sorted(self.pending)
            del self.pending[choices[arg % len(choices)]]
        elif kind == SNAPSHOT:
            data = json.loads(json.dumps(self.scheduler.to_json()))
            self.twin = Scheduler.from_json(data)
        self._schedule()

    def _evict(self, agent_id: str, kind: int, drain: bool) -> None:
        holders = sorted(
            rid
            for rid, placement in self.scheduler.allocations.items()
            if agent_id in dict(placement)
        )
        if kind == REMOVE:
            evicted = self.scheduler.remove_agent(agent_id)
            assert self.twin.remove_agent(agent_id) == evicted
            assert evicted == holders
        else:
            enabled = not next(a for a in self.scheduler.agents if a.id == agent_id).enabled
            evicted = self.scheduler.set_agent_enabled(agent_id, enabled, drain=drain)
            assert self.twin.set_agent_enabled(agent_id, enabled, drain=drain) == evicted
            assert evicted == ([] if enabled or drain else holders)
        for rid in evicted:
            self.pending[rid] = self.running.pop(rid)

    def _schedule(self) -> None:
        scheduler = self.scheduler
        agents = {a.id: a for a in scheduler.agents}
        free = {agent_id: set(scheduler.free_slots(agent_id)) for agent_id in agents}
        decision = scheduler.schedule(list(self.pending.values()))
        # The twin sees the queue in reverse: order of the input must not matter.
        assert self.twin.schedule(list(reversed(self.pending.values()))) == decision

        def frees(slot_type: str, model: dict[str, set[int]]) -> list[int]:
            return [
                len(model[a.id]) for a in agents.values() if a.enabled and a.slot_type == slot_type
            ]

        ranks = [self.pending[a.request_id].rank for a in decision.assignments]
        assert ranks == sorted(ranks)
        for assignment in decision.assignments:
            request = self.pending.pop(assignment.request_id)
            self.running[request.id] = request
            placement = assignment.placement
            shares = {len(slots) for _, slots in placement}
            assert len(shares) == 1, "split equally"
            assert shares.pop() * len(placement) == request.slots
            assert [a for a, _ in placement] == sorted({a for a, _ in placement})
            single = [f for f in frees(request.slot_type, free) if f >= request.slots]
            if single:
                assert len(placement) == 1, "fits one agent, so uses one"
                assert len(free[placement[0][0]]) == min(single), "best fit"
            for agent_id, slots in placement:
                agent = agents[agent_id]
                assert agent.enabled
                assert agent.slot_type == request.slot_type
                assert list(slots) == sorted(free[agent_id])[: len(slots)], "lowest, unbooked"
                free[agent_id] -= set(slots)
            assert scheduler.allocation_of(request.id) == placement
        for request in self.pending.values():
            assert not _fits(request.slots, frees(request.slot_type, free)), "greedy complete"
        never = {
            r.id
            for r in self.pending.values()
            if not _fits(
                r.slots,
                [a.slots for a in agents.values() if a.enabled and a.slot_type == r.slot_type],
            )
        }
        self.unschedulable = [rid for rid, _ in decision.unschedulable]
        assert set(self.unschedulable) == never
        self._check_books(free)

    def _check_books(self, free: dict[str, set[int]]) -> None:
        booked: set[tuple[str, int]] = set()
        allocations = self.scheduler.allocations
        assert set(allocations) == set(self.running)
        for rid, placement in allocations.items():
            spots = {(agent_id, slot) for agent_id, slots in placement for slot in slots}
            assert len(spots) == self.running[rid].slots
            assert not spots & booked, "double-booked"
            booked |= spots
        for agent in self.scheduler.agents:
            assert set(self.scheduler.free_slots(agent.id)) == free[agent.id]
            held = {slot for agent_id, slot in booked if agent_id == agent.id}
            assert held | free[agent.id] == set(range(agent.slots))
            assert not held & free[agent.id]
        assert self.twin.to_json() == self.scheduler.to_json()


def test_simulation_of_thousands_of_events_keeps_every_invariant() -> None:
    rng = random.Random(20240611)
    world = World()
    events = 6000
    start = time.perf_counter()
    for _ in range(events):
        world.step(rng.choices(range(7), WEIGHTS)[0], rng.getrandbits(16))
    rate = events / (time.perf_counter() - start)
    print(f"scheduler simulation: {events} events, {rate:,.0f} events/s (invariants included)")
    assert world.running, "the simulation should keep the cluster busy"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 2**16 - 1)), max_size=40))
def test_short_random_event_sequences_keep_every_invariant(events: list[tuple[int, int]]) -> None:
    world = World()
    for kind, arg in events:
        world.step(kind, arg)
