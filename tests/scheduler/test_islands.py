"""Slots of one GPU island (NVLink, else NUMA node) for a multi-slot request: best fit
among the islands that hold it, else the fewest islands; CPU slots (no islands) go lowest
first as before."""

from __future__ import annotations

import json

import pytest

from assay.master.scheduler import Agent, Request, Scheduler
from assay.master.scheduler._placement import choose_slots

TWO_QUADS = (0, 0, 0, 0, 1, 1, 1, 1)


@pytest.mark.parametrize(
    ("count", "free", "islands", "expected"),
    [
        # No islands (CPU slots, or a GPU machine whose topology is unknown): lowest first.
        (2, [0, 1, 2, 3], (), (0, 1)),
        (2, [1, 3, 5], (), (1, 3)),
        (3, [0, 1, 2, 3], (0, 0, 0, 0), (0, 1, 2)),
        # Interleaved islands: a pair stays on one island, not on the two lowest indices.
        (2, [0, 1, 2, 3], (0, 1, 0, 1), (0, 2)),
        # One slot: from the most fragmented island (best fit keeps whole islands whole).
        (1, [0, 1, 2, 3, 4, 5, 6, 7], TWO_QUADS, (0,)),
        (1, [1, 2, 3, 4, 5, 6, 7], TWO_QUADS, (1,)),
        (1, [0, 1, 2, 3, 5, 6, 7], TWO_QUADS, (5,)),
        # A quad after a single: the whole other island.
        (4, [1, 2, 3, 4, 5, 6, 7], TWO_QUADS, (4, 5, 6, 7)),
        # Two free on each island: a pair takes one island whole, not one from each.
        (2, [2, 3, 6, 7], TWO_QUADS, (2, 3)),
        (2, [0, 3, 4, 5, 6], TWO_QUADS, (0, 3)),  # best fit: the island with 2, not 3
        # No island holds them all: the fewest islands, the largest whole first.
        (4, [2, 3, 5, 6, 7], TWO_QUADS, (2, 5, 6, 7)),
        # islands 0: {0, 1}, 1: {4, 5}, 2: {6, 8, 9}, 3: {11}: island 2 whole, then a pair.
        (5, [0, 1, 4, 5, 6, 8, 9, 11], (0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3), (0, 1, 6, 8, 9)),
        (4, [0, 2, 4, 6, 7], (0, 0, 1, 1, 2, 2, 2, 2), (0, 4, 6, 7)),
        (8, list(range(8)), TWO_QUADS, tuple(range(8))),
    ],
)
def test_choose_slots(
    count: int, free: list[int], islands: tuple[int, ...], expected: tuple[int, ...]
) -> None:
    assert choose_slots(count, free, islands) == expected


def test_choose_slots_refuses_more_than_free() -> None:
    with pytest.raises(ValueError, match="3 slots wanted, only 2 free"):
        choose_slots(3, [0, 1], ())


def _place(scheduler: Scheduler, *requests: Request) -> dict[str, object]:
    decision = scheduler.schedule(requests)
    return {a.request_id: a.placement for a in decision.assignments}


def test_a_quad_after_a_single_lands_on_the_other_island() -> None:
    scheduler = Scheduler()
    scheduler.add_agent(Agent("a", 8, "cuda", islands=TWO_QUADS))
    assert _place(scheduler, Request("one", 1, "cuda")) == {"one": (("a", (0,)),)}
    assert _place(scheduler, Request("four", 4, "cuda")) == {"four": (("a", (4, 5, 6, 7)),)}
    # The next pair fills the fragmented island before breaking into a whole one.
    assert _place(scheduler, Request("two", 2, "cuda")) == {"two": (("a", (1, 2)),)}


def test_cpu_agents_keep_lowest_first() -> None:
    scheduler = Scheduler()
    scheduler.add_agent(Agent("c", 4, "cpu"))
    assert _place(scheduler, Request("x", 1, "cpu"), Request("y", 2, "cpu")) == {
        "x": (("c", (0,)),),
        "y": (("c", (1, 2)),),
    }


def test_islands_survive_a_snapshot_and_bad_ones_are_refused() -> None:
    scheduler = Scheduler()
    scheduler.add_agent(Agent("a", 4, "cuda", islands=(0, 1, 0, 1)))
    scheduler.add_agent(Agent("b", 2, "cpu"))
    data = json.loads(json.dumps(scheduler.to_json()))
    assert [a.get("islands") for a in data["agents"]] == [[0, 1, 0, 1], None]
    restored = Scheduler.from_json(data)
    assert restored.to_json() == data
    assert _place(restored, Request("r", 2, "cuda")) == {"r": (("a", (0, 2)),)}
    with pytest.raises(ValueError, match=r"islands must be 4 integers >= 0"):
        Agent("a", 4, "cuda", islands=(0, 1))
    with pytest.raises(ValueError, match="islands must be a list"):
        Scheduler.from_json(
            {"version": 1, "agents": [data["agents"][0] | {"islands": 3}], "allocations": []}
        )
