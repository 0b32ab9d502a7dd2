"""Fair share, max_slots and user quotas: the rule's arithmetic, the order it places in,
the reason every pending request gets, victims for fairness, and a seeded simulation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assay.master.scheduler import (
    Agent,
    Group,
    Limits,
    Request,
    Running,
    Scheduler,
    choose_share_victims,
    targets,
    water_fill,
)
from assay.master.scheduler.simulate import InvariantError, SimGroup, SimPool, simulate


def _cluster(*slots: int) -> Scheduler:
    scheduler = Scheduler()
    for i, n in enumerate(slots):
        scheduler.add_agent(Agent(f"a{i}", n, "cpu"))
    return scheduler


def _queue(group: str, count: int, *, slots: int = 1, start: int = 0) -> list[Request]:
    return [
        Request(f"{group}{i}", slots, "cpu", order=start + i, group=group) for i in range(count)
    ]


def _held(scheduler: Scheduler) -> dict[str, int]:
    return scheduler.held_by_group()


# -- the arithmetic ----------------------------------------------------------------------


def test_water_filling_splits_by_weight() -> None:
    assert water_fill(4, {"a": (1, 10), "b": (3, 10)}) == {"a": 1.0, "b": 3.0}


def test_a_group_wanting_less_than_its_share_gives_the_rest_to_the_others() -> None:
    shares = water_fill(10, {"small": (5, 2), "a": (1, 20), "b": (1, 20)})
    assert shares == {"small": 2.0, "a": 4.0, "b": 4.0}


def test_shares_never_exceed_the_slots_wanted() -> None:
    assert water_fill(10, {"a": (1, 3), "b": (1, 2)}) == {"a": 3.0, "b": 2.0}
    assert water_fill(10, {"a": (1, 0)}) == {"a": 0.0}


def test_extreme_weights_neither_overflow_nor_vanish() -> None:
    # Stored weights outside the configurable range are clamped to it: 1e308 twice once
    # summed to infinity, and the round failed on a NaN share.
    shares = water_fill(4, {"a": (1e308, 4), "b": (1e308, 4), "c": (1e-320, 4)})
    assert targets(shares, {}) == {"a": 2, "b": 2, "c": 0}


def test_targets_round_by_largest_remainder_and_keep_the_sum() -> None:
    shares = water_fill(4, {"a": (1, 9), "b": (1, 9), "c": (1, 9)})
    goal = targets(shares, {"c": 2})
    assert sum(goal.values()) == 4
    assert goal == {"a": 1, "b": 1, "c": 2}  # the tie goes to the group holding more


# -- placing ---------------------------------------------------------------------------


def test_fair_share_places_by_weight_not_by_submission_order() -> None:
    scheduler = _cluster(2, 2)
    first = _queue("a", 4)  # submitted first, weight 1
    later = _queue("b", 4, start=10)  # weight 3
    limits = Limits({"a": Group(1.0), "b": Group(3.0)})
    decision = scheduler.schedule(first + later, policy="fair_share", limits=limits)
    assert _held(scheduler) == {"a": 1, "b": 3}
    assert decision.shares["b"].target == 3
    # Under the priority policy the earlier experiment takes the whole cluster.
    fifo = _cluster(2, 2)
    fifo.schedule(first + later, policy="priority", limits=limits)
    assert _held(fifo) == {"a": 4}


def test_fair_share_never_leaves_slots_idle_for_fairness() -> None:
    scheduler = _cluster(4)
    limits = Limits({"a": Group(1.0), "b": Group(1.0)})
    scheduler.schedule(_queue("a", 6), policy="fair_share", limits=limits)
    assert _held(scheduler) == {"a": 4}  # b wants nothing: a gets it all


def test_freed_slots_go_to_the_group_furthest_below_its_share() -> None:
    scheduler = _cluster(4)
    limits = Limits({"a": Group(1.0), "b": Group(1.0)})
    scheduler.schedule(_queue("a", 4), policy="fair_share", limits=limits)
    scheduler.release("a0")
    pending = _queue("a", 3, start=100)[1:] + _queue("b", 2, start=200)
    pending = [Request(f"x{r.id}", 1, "cpu", order=r.order, group=r.group) for r in pending]
    decision = scheduler.schedule(pending, policy="fair_share", limits=limits)
    assert [scheduler.group_of(a.request_id) for a in decision.assignments] == ["b"]


@pytest.mark.parametrize("policy", ["priority", "fair_share"])
def test_max_slots_caps_an_experiment_under_every_policy(policy: str) -> None:
    scheduler = _cluster(8)
    limits = Limits({"a": Group(max_slots=3)})
    decision = scheduler.schedule(_queue("a", 6), policy=policy, limits=limits)  # type: ignore[arg-type]
    assert _held(scheduler) == {"a": 3}
    assert {w.kind for w in decision.waiting.values()} == {"max_slots"}


def test_max_slots_counts_gang_slots() -> None:
    scheduler = _cluster(8)
    limits = Limits({"a": Group(max_slots=5)})
    scheduler.schedule(_queue("a", 3, slots=2), limits=limits)
    assert _held(scheduler) == {"a": 4}  # a third gang of 2 would make 6


def test_user_quota_counts_every_experiment_of_the_user() -> None:
    scheduler = _cluster(8)
    limits = Limits({"a": Group(user="ann"), "b": Group(user="ann"), "c": Group(user="bo")}, 3)
    pending = _queue("a", 2) + _queue("b", 2, start=10) + _queue("c", 4, start=20)
    decision = scheduler.schedule(pending, limits=limits)
    held = _held(scheduler)
    assert held.get("a", 0) + held.get("b", 0) == 3
    assert held["c"] == 3
    quota = [w for w in decision.waiting.values() if w.kind == "quota"]
    assert len(quota) == 2
    assert "user 'ann' holds 3 slots of the user_slot_quota 3" in quota[0].message


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="weight must be a number > 0"):
        Group(weight=0)
    with pytest.raises(ValueError, match="max_slots must be an integer >= 1"):
        Group(max_slots=0)
    with pytest.raises(ValueError, match="user_slot_quota must be an integer >= 1"):
        Limits(user_slot_quota=0)
    with pytest.raises(ValueError, match="policy must be one of"):
        _cluster(1).schedule([], policy="lottery")  # type: ignore[arg-type]


# -- reasons ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "kind", "fragment"),
    [
        ("too_large", "too_large", "needs 9 CPU slots; the cluster has 4"),
        ("max_slots", "max_slots", "its experiment holds 1 of its max_slots 1"),
        ("quota", "quota", "user 'ann' holds 1 slots of the user_slot_quota 1"),
        ("busy", "no_free_slots", "needs 2 CPU slots; 0 free"),
        ("priority", "priority", "4 were free, but trials considered before it"),
        ("share", "share", "at or above its fair share of 2"),
        ("split", "no_free_slots", "4 are free, but not 3 split equally"),
    ],
)
def test_every_pending_request_says_why_it_waits(case: str, kind: str, fragment: str) -> None:
    scheduler = _cluster(2, 2)
    limits = Limits({"g": Group(max_slots=1, user="ann"), "h": Group(user="ann")})
    policy = "priority"
    if case == "too_large":
        pending = [Request("x", 9, "cpu", group="g")]
    elif case == "max_slots":
        scheduler.schedule([Request("run", 1, "cpu", group="g")], limits=limits)
        pending = [Request("x", 1, "cpu", group="g")]
    elif case == "quota":
        limits = Limits(limits.groups, user_slot_quota=1)
        scheduler.schedule([Request("run", 1, "cpu", group="h")], limits=limits)
        pending = [Request("x", 1, "cpu", group="g")]
    elif case == "busy":
        scheduler.schedule([Request("run", 4, "cpu", group="h")], limits=limits)
        pending = [Request("x", 2, "cpu", group="h")]
    elif case == "priority":
        pending = [Request("first", 4, "cpu", priority=1, group="h")]
        pending.append(Request("x", 1, "cpu", priority=50, group="h"))
    elif case == "share":
        limits = Limits({"g": Group(), "h": Group()})
        pending = _queue("g", 3) + _queue("h", 3, start=10)
        pending.append(Request("x", 1, "cpu", order=99, group="g"))
        policy = "fair_share"
    else:  # 4 free slots, 2 on each agent: 3 cannot be split equally over them
        scheduler = _cluster(3, 2)
        scheduler.adopt("run", "a0", [0], "h")
        pending = [Request("x", 3, "cpu", group="h")]
    decision = scheduler.schedule(pending, policy=policy, limits=limits)  # type: ignore[arg-type]
    wait = decision.waiting["x"]
    assert wait.kind == kind, wait
    assert fragment in wait.message, wait.message
    assert ("x" in dict(decision.unschedulable)) == (kind == "too_large")


def test_waiting_is_in_the_order_the_round_considered() -> None:
    scheduler = _cluster(1)
    pending = [Request(f"r{i}", 1, "cpu", priority=50 - i, order=i) for i in range(4)]
    decision = scheduler.schedule(pending)
    assert [a.request_id for a in decision.assignments] == ["r3"]
    assert list(decision.waiting) == ["r2", "r1", "r0"]


# -- preemption for fairness -----------------------------------------------------------


def test_share_victims_come_from_groups_above_their_target() -> None:
    running = [
        Running(f"a{i}", 42, i, ((f"n{i}", (0,)),), "a")
        for i in range(4)  # a holds all 4 one-slot agents
    ]
    request = Request("b0", 1, "cpu", order=10, group="b")
    free = {f"n{i}": 0 for i in range(4)}
    goal, held = {"a": 2, "b": 2}, {"a": 4}
    assert choose_share_victims(request, running, free, goal, held) == ["a3"]  # the newest
    # A group at its target loses nothing; a group at its own target asks for nothing.
    assert choose_share_victims(request, running, free, {"a": 4, "b": 0}, held) is None
    assert choose_share_victims(request, running, free, goal, {"a": 2, "b": 2}) is None


def test_share_victims_never_push_a_group_below_its_target() -> None:
    running = [Running("a0", 42, 0, (("n0", (0, 1)),), "a")]  # a gang of 2
    request = Request("b0", 1, "cpu", group="b")
    # a's target is 2: stopping its only gang would leave it at 0.
    assert choose_share_victims(request, running, {"n0": 0}, {"a": 2, "b": 1}, {"a": 2}) is None


# -- simulation ------------------------------------------------------------------------

_groups = st.lists(
    st.builds(
        SimGroup,
        id=st.sampled_from("abcdef"),
        slots_per_trial=st.sampled_from([1, 1, 2]),
        weight=st.sampled_from([0.5, 1.0, 2.0, 3.0]),
        max_slots=st.sampled_from([None, None, 2, 3, 6]),
        user=st.sampled_from(["ann", "bo", "cy"]),
        pool=st.sampled_from(["gpu", "cpu"]),
    ),
    min_size=1,
    max_size=5,
    unique_by=lambda g: g.id,
)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    groups=_groups,
    quota=st.sampled_from([None, 2, 4]),
    preemption=st.booleans(),
    policy=st.sampled_from(["fair_share", "priority"]),
)
def test_invariants_hold_in_every_round(
    seed: int, groups: list[SimGroup], quota: int | None, preemption: bool, policy: str
) -> None:
    pools = {"gpu": SimPool((4, 4, 2), policy), "cpu": SimPool((3, 1), "fair_share")}  # type: ignore[arg-type]
    result = simulate(seed, pools, groups, user_slot_quota=quota, preemption=preemption, events=150)
    assert result.rounds == 150
    running = result.placed - result.finished - result.preempted
    assert 0 <= running <= 14  # never more running than slots


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    weights=st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0, 5.0]), min_size=1, max_size=5),
    caps=st.lists(st.sampled_from([None, None, 1, 3]), min_size=5, max_size=5),
    preemption=st.booleans(),
    agents=st.sampled_from([(4,), (2, 2), (4, 4, 2), (8, 8)]),
)
def test_after_convergence_each_group_is_within_one_slot_of_its_share(
    seed: int,
    weights: list[float],
    caps: list[int | None],
    preemption: bool,
    agents: tuple[int, ...],
) -> None:
    groups = [SimGroup(f"g{i}", weight=w, max_slots=caps[i]) for i, w in enumerate(weights)]
    capacity = sum(agents)
    result = simulate(
        seed,
        {"default": SimPool(agents)},
        groups,
        preemption=preemption,
        events=60,
        converge=3 * capacity,
    )
    assert result.gap <= 1.0 + 1e-9, (result.held, result.shares)
    held = result.held["default"]
    assert sum(held.values()) == min(capacity, sum(c or capacity for c in caps[: len(groups)]))


def test_a_breach_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks bite: a scheduler that ignores max_slots is caught."""
    from assay.master.scheduler import simulate as module

    class Careless(Scheduler):
        def schedule(  # type: ignore[no-untyped-def]
            self, pending, *, policy="priority", limits=None
        ):
            return super().schedule(pending, policy=policy, limits=None)

    monkeypatch.setattr(module, "Scheduler", Careless)
    with pytest.raises(InvariantError, match="past its max_slots"):
        simulate(1, {"p": SimPool((4,))}, [SimGroup("a", pool="p", max_slots=1)], events=20)


def test_a_pools_own_user_quota_replaces_the_masters() -> None:
    from assay.master.scheduler import Pools, PoolSpec

    pools = Pools([PoolSpec("cpu"), PoolSpec("gpu", user_slot_quota=1)], "cpu")
    for pool in ("cpu", "gpu"):
        pools.add_agent(Agent(f"{pool}-0", 4, "cpu"), pool)
    limits = Limits({"a": Group(user="ann"), "b": Group(user="ann")}, user_slot_quota=3)
    pending = [
        Request(f"{p}{i}", 1, "cpu", order=i, group=g, pool=p)
        for p, g in (("cpu", "a"), ("gpu", "b"))
        for i in range(4)
    ]
    decision = pools.schedule(pending, limits)
    placed = sorted(a.request_id for a in decision.assignments)
    assert placed == ["cpu0", "cpu1", "cpu2", "gpu0"]  # 3 in cpu (the master's), 1 in gpu
    assert "user_slot_quota 1" in decision.waiting["gpu1"].message
    assert Pools.from_json(pools.to_json()).specs["gpu"].user_slot_quota == 1
    with pytest.raises(ValueError, match="user_slot_quota must be an integer >= 1"):
        PoolSpec("gpu", user_slot_quota=0)


def test_a_share_below_one_slot_says_it_rounds_down() -> None:
    """Five experiments on 4 slots: each's share is 0.8; the one left with none holds 0,
    which is not "at or above" 0.8."""
    scheduler = _cluster(2, 2)
    groups = "abcde"
    limits = Limits({g: Group() for g in groups})
    pending = [
        Request(f"{g}{i}", 1, "cpu", order=10 * k + i, group=g)
        for k, g in enumerate(groups)
        for i in range(2)
    ]
    decision = scheduler.schedule(pending, policy="fair_share", limits=limits)
    assert "its fair share of 0.8 rounds down to 0 whole slots" in decision.waiting["e0"].message
    assert "holds 1, at or above its fair share of 0.8" in decision.waiting["a1"].message
