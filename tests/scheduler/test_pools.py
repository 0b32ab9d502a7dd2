"""`Pools`: one pure scheduler per resource pool; agent labels restrict placement."""

from __future__ import annotations

import json
import random

import pytest

from assay.master.scheduler import Agent, Pools, PoolSpec, Request, Scheduler


def two_pools() -> Pools:
    pools = Pools([PoolSpec("default"), PoolSpec("gpu", "GPU boxes", "fair_share")])
    pools.add_agent(Agent("d1", 2, "cpu"))
    pools.add_agent(Agent("d2", 2, "cpu"), "default")
    pools.add_agent(Agent("g1", 4, "cpu", label="a100"), "gpu")
    pools.add_agent(Agent("g2", 2, "cpu"), "gpu")
    return pools


def test_nothing_configured_is_one_default_pool() -> None:
    pools = Pools()

    assert (pools.names, pools.default, pools.kind("")) == (("default",), "default", "priority")


@pytest.mark.parametrize(
    ("specs", "default", "message"),
    [
        ([PoolSpec("a"), PoolSpec("a")], "a", "resource pool names must be unique: a twice"),
        ([PoolSpec("a")], "b", "the default resource pool 'b' is not declared: pools are a"),
    ],
)
def test_contradicting_pools_are_refused(specs: list[PoolSpec], default: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Pools(specs, default)


def test_a_bad_scheduler_name_is_refused() -> None:
    with pytest.raises(ValueError, match="scheduler must be one of priority, fair_share"):
        PoolSpec("a", scheduler="fifo")  # type: ignore[arg-type]


def test_a_gang_never_spans_pools() -> None:
    pools = two_pools()

    # 4 slots: the default pool has exactly 2 + 2; g1 alone would have been the best fit.
    decision = pools.schedule([Request("1", 4, "cpu")])

    [assignment] = decision.assignments
    assert assignment.placement == (("d1", (0, 1)), ("d2", (0, 1)))
    # 6 slots in gpu: 4 + 2 is no equal split, and 3 + 3 does not fit g2: never.
    decision = pools.schedule([Request("2", 6, "cpu", pool="gpu")])
    assert decision.assignments == []
    [(request_id, why)] = decision.unschedulable
    assert request_id == "2"
    assert why.startswith("pool gpu: needs 6 CPU slots")
    # What the pool has, not the cluster (which has 10).
    assert (
        pools.why_never(9, "cpu", "gpu") == "pool gpu: needs 9 CPU slots; the pool has 6 (2 agents)"
    )


def test_a_label_restricts_to_agents_with_it() -> None:
    pools = two_pools()

    decision = pools.schedule(
        [
            Request("1", 2, "cpu", pool="gpu", label="a100", order=1),
            Request("2", 2, "cpu", pool="gpu", label="a100", order=2),
            Request("3", 2, "cpu", pool="gpu", label="a100", order=3),  # g1 is full now
            Request("4", 1, "cpu", pool="gpu", label="v100", order=4),
            Request("5", 2, "cpu", pool="default", label="a100", order=5),
        ]
    )

    placed = {a.request_id: a.placement for a in decision.assignments}
    assert len(placed) == 2
    assert set(placed) <= {"1", "2", "3"}
    assert sorted(placed.values()) == [(("g1", (0, 1)),), (("g1", (2, 3)),)]
    assert dict(decision.unschedulable) == {
        "4": "pool gpu: needs 1 CPU slot; no CPU agent with label 'v100' is connected",
        "5": "pool default: needs 2 CPU slots; no CPU agent with label 'a100' is connected",
    }
    # The third waits for g1's slots (g2 has two free, but not the label).
    assert pools.free_slots("g2") == (0, 1)


def test_a_label_counts_only_its_agents_capacity() -> None:
    pools = two_pools()

    assert pools.why_never(5, "cpu", "gpu", "a100") == (
        "pool gpu: needs 5 CPU slots; the agents with label 'a100' have 4 (1 agent)"
    )
    assert pools.why_never(4, "cpu", "gpu", "a100") is None
    assert pools.why_never(1, "cpu", "tpu") == (
        "resource pool 'tpu' does not exist: pools are default, gpu"
    )


def test_a_request_for_an_unknown_pool_is_unschedulable_with_the_pools() -> None:
    pools = two_pools()

    decision = pools.schedule([Request("1", 1, "cpu", pool="tpu")])

    assert decision.unschedulable == [
        ("1", "resource pool 'tpu' does not exist: pools are default, gpu")
    ]


def test_an_agent_in_an_unknown_pool_is_refused() -> None:
    with pytest.raises(ValueError, match="resource pool 'tpu' does not exist"):
        two_pools().add_agent(Agent("t1", 1, "cpu"), "tpu")


def test_agents_calls_route_to_their_pool() -> None:
    pools = two_pools()
    [placed] = pools.schedule([Request("1", 2, "cpu", pool="gpu", label="a100")]).assignments

    assert (pools.pool_of("g1"), pools.pool_of("d1"), pools.pool_of("nope")) == (
        "gpu",
        "default",
        None,
    )
    assert pools.pool_of_request("1") == "gpu"
    assert pools.allocations == {"1": placed.placement}
    pools.set_agent_enabled("g1", False)  # drain: the allocation stays
    assert pools.allocation_of("1") == placed.placement
    assert pools.schedule([Request("2", 1, "cpu", pool="gpu", label="a100")]).assignments == []
    assert pools.release("1")
    assert not pools.release("1")
    assert pools.remove_agent("g1") == []
    assert {a.id for a in pools.agents} == {"d1", "d2", "g2"}


def test_restart_adoption_goes_to_the_agents_pool() -> None:
    pools = Pools([PoolSpec("default"), PoolSpec("gpu")])
    pools.add_agent(Agent("g1", 2, "cpu"), "gpu")
    pools.add_agent(Agent("g2", 2, "cpu"), "gpu")
    pools.add_agent(Agent("d1", 2, "cpu"))

    # A gang's parts come back one agent at a time.
    pools.adopt("7", "g1", (0,))
    pools.adopt("7", "g2", (1,))

    assert pools.scheduler("gpu").allocation_of("7") == (("g1", (0,)), ("g2", (1,)))
    assert pools.scheduler("default").allocations == {}
    assert pools.free_slots("g1") == (1,)


def test_snapshot_round_trips_every_pool_exactly() -> None:
    pools = two_pools()
    pools.schedule(
        [Request("1", 2, "cpu", pool="gpu", label="a100"), Request("2", 4, "cpu", order=1)]
    )
    pools.set_agent_enabled("g2", False)

    data = json.loads(json.dumps(pools.to_json()))
    restored = Pools.from_json(data)

    assert restored.to_json() == pools.to_json()
    assert restored.pool_of("g1") == "gpu"
    assert restored.kind("gpu") == "fair_share"
    assert restored.schedule([Request("3", 2, "cpu", pool="gpu", label="a100")]).assignments


def test_a_scheduler_snapshot_without_labels_still_loads() -> None:
    data = {
        "version": 1,
        "agents": [{"id": "a", "slots": 1, "slot_type": "cpu", "enabled": True}],
        "allocations": [],
    }

    assert Scheduler.from_json(data).agents == (Agent("a", 1, "cpu"),)


def test_random_rounds_never_cross_pools_or_labels() -> None:
    """A simulation: random agents and requests; every placement stays in its pool, on
    agents with its label, and no slot is held twice."""
    rng = random.Random(7)
    pools = Pools([PoolSpec("default"), PoolSpec("p1"), PoolSpec("p2", scheduler="fair_share")])
    labels = ["", "x", "y"]
    agents: dict[str, tuple[str, str]] = {}
    for i in range(12):
        pool, label = rng.choice(pools.names), rng.choice(labels)
        pools.add_agent(Agent(f"a{i}", rng.choice([1, 2, 4]), "cpu", label=label), pool)
        agents[f"a{i}"] = (pool, label)
    pending: dict[str, Request] = {}
    for step in range(300):
        for _ in range(rng.randint(0, 3)):
            rid = str(step * 10 + len(pending))
            pending[rid] = Request(
                rid,
                rng.choice([1, 2, 3, 4]),
                "cpu",
                order=step,
                group=str(rng.randint(1, 4)),
                pool=rng.choice(pools.names),
                label=rng.choice(labels),
            )
        decision = pools.schedule(list(pending.values()))
        for assignment in decision.assignments:
            request = pending.pop(assignment.request_id)
            for agent_id, _ in assignment.placement:
                pool, label = agents[agent_id]
                assert pool == pools.resolve(request.pool)
                assert not request.label or label == request.label
        held = [(a, s) for p in pools.allocations.values() for a, slots in p for s in slots]
        assert len(held) == len(set(held))
        for request_id in list(pools.allocations):
            if rng.random() < 0.3:
                pools.release(request_id)
