"""choose_victims: the fewest lowest-priority allocations that make room."""

from __future__ import annotations

from assay.master.scheduler import Request, Running, choose_victims


def _req(slots: int, priority: int) -> Request:
    return Request(id="new", slots=slots, slot_type="cpu", priority=priority, order=99)


def test_nothing_is_preempted_when_the_request_fits() -> None:
    running = [Running("a", 50, 1, (("n1", (0,)),))]
    assert choose_victims(_req(1, 10), running, {"n1": 1}) == []


def test_lowest_priority_then_newest_goes_first() -> None:
    running = [
        Running("old-low", 60, 1, (("n1", (0,)),)),
        Running("new-low", 60, 2, (("n1", (1,)),)),
        Running("mid", 50, 3, (("n2", (0,)),)),
    ]
    assert choose_victims(_req(1, 10), running, {"n1": 0, "n2": 0}) == ["new-low"]


def test_equal_or_higher_priority_is_never_preempted() -> None:
    running = [Running("same", 10, 1, (("n1", (0,)),)), Running("high", 5, 2, (("n1", (1,)),))]
    assert choose_victims(_req(1, 10), running, {"n1": 0}) is None


def test_a_gang_takes_what_it_needs_and_no_more() -> None:
    running = [
        Running("x", 70, 1, (("n1", (0, 1)),)),
        Running("y", 60, 2, (("n2", (0, 1)),)),
        Running("z", 80, 3, (("n3", (0,)),)),  # the lowest: with n3's free slot, 2 there
        Running("w", 90, 4, (("n4", (0,)),)),  # lower still, but it frees 1 of the 2 needed
    ]
    # 4 slots as 2 x 2: n3 (z's slot + its free one) and n1 (x's two); w and y stay.
    free = {"n1": 0, "n2": 0, "n3": 1, "n4": 0}
    assert sorted(choose_victims(_req(4, 10), running, free) or []) == ["x", "z"]


def test_slots_on_agents_the_request_cannot_use_do_not_count() -> None:
    running = [Running("gpu-job", 90, 1, (("gpu-node", (0,)),))]
    assert choose_victims(_req(1, 10), running, {"cpu-node": 0}) is None
