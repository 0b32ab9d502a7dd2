"""FreeIndex keeps, incrementally, the order `choose_agents` computes by sorting."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from assay.master.scheduler import choose_agents, largest_placement
from assay.master.scheduler._index import FreeIndex

capacities = st.lists(st.integers(min_value=1, max_value=8), min_size=0, max_size=12)
moves = st.lists(
    st.tuples(st.integers(min_value=0, max_value=11), st.integers(min_value=-8, max_value=8)),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(capacities, moves, st.integers(min_value=1, max_value=24))
def test_choose_matches_choose_agents_after_any_holds_and_releases(
    caps: list[int], changes: list[tuple[int, int]], slots: int
) -> None:
    index = FreeIndex()
    free = {f"a{i:02d}": cap for i, cap in enumerate(caps)}
    for agent_id, cap in free.items():
        index.add(agent_id, cap, cap)
    for which, delta in changes:
        if not caps:
            break
        agent_id = f"a{which % len(caps):02d}"
        new = free[agent_id] + delta
        if 0 <= new <= caps[which % len(caps)]:
            free[agent_id] = new
            index.change(agent_id, delta)
    assert index.total_free == sum(free.values())
    assert index.choose(slots) == choose_agents(slots, free.items())
    assert index.largest() == largest_placement(caps)
    idle = choose_agents(slots, ((a, caps[i]) for i, a in enumerate(free)))
    assert index.fits_idle(slots) == (idle is not None)


def test_removed_agents_are_not_chosen_and_caches_follow_capacities() -> None:
    index = FreeIndex()
    index.add("a", 4, 4)
    index.add("b", 2, 2)
    assert index.choose(4) == [("a", 4)]
    assert index.fits_idle(6) is False  # 6 = 3 x 2 needs three agents
    index.add("c", 2, 2)
    assert index.fits_idle(6) is True
    index.remove("a")
    assert index.choose(4) == [("b", 2), ("c", 2)]
    assert index.largest() == 4
    index.change("b", -2)
    assert index.choose(2) == [("c", 2)]
    assert index.choose(4) is None


def test_adopted_parts_merge_into_one_allocation_and_are_not_given_away() -> None:
    from assay.master.scheduler import Agent, Request, Scheduler

    scheduler = Scheduler()
    scheduler.add_agent(Agent("a", 2, "cpu"))
    scheduler.adopt("7", "a", [1])
    scheduler.add_agent(Agent("b", 2, "cpu"))
    scheduler.adopt("7", "b", [0])
    scheduler.adopt("7", "b", [0])  # a repeated adoption changes nothing
    assert scheduler.allocation_of("7") == (("a", (1,)), ("b", (0,)))
    decision = scheduler.schedule([Request(id="8", slots=2, slot_type="cpu", priority=42, order=1)])
    [assignment] = decision.assignments  # the free slot of each agent, never an adopted one
    assert assignment.placement == (("a", (0,)), ("b", (1,)))
    decision = scheduler.schedule([Request(id="9", slots=1, slot_type="cpu", priority=42, order=2)])
    assert decision.assignments == []
    assert scheduler.release("7")
    assert scheduler.free_slots("a") == (1,)


def test_removing_an_agent_can_keep_a_gangs_other_parts_held() -> None:
    from assay.master.scheduler import Agent, Request, Scheduler

    scheduler = Scheduler()
    for name in ("a", "b"):
        scheduler.add_agent(Agent(name, 1, "cpu"))
    [gang] = scheduler.schedule([Request(id="g", slots=2, slot_type="cpu", order=1)]).assignments
    assert scheduler.remove_agent("a", keep_other_parts=True) == ["g"]
    assert scheduler.allocation_of("g") == (("b", (0,)),)
    waiting = Request(id="w", slots=1, slot_type="cpu", order=2)
    assert scheduler.schedule([waiting]).assignments == []  # b's slot is still in use
    assert scheduler.release("g")
    assert [a.request_id for a in scheduler.schedule([waiting]).assignments] == ["w"]
    del gang
