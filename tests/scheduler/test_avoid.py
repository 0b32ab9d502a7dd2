"""A request that avoids agents (its trial's `exclude_node` log policies) is placed on the
others, waits while they are busy, and says why it never fits when none are left."""

from __future__ import annotations

from assay.master.scheduler import Agent, Request, Scheduler


def _cluster() -> Scheduler:
    scheduler = Scheduler()
    for name in ("a1", "a2", "a3"):
        scheduler.add_agent(Agent(name, 2, "cpu"))
    return scheduler


def test_the_avoided_agents_are_passed_over() -> None:
    scheduler = _cluster()
    # Best fit would take a1 (ties by id); a1 and a2 are avoided.
    decision = scheduler.schedule([Request("t", 2, "cpu", avoid=frozenset({"a1", "a2"}))])
    [placed] = decision.assignments
    assert placed.placement == (("a3", (0, 1)),)


def test_a_gang_spans_only_the_agents_it_may_use() -> None:
    scheduler = _cluster()
    decision = scheduler.schedule([Request("t", 4, "cpu", avoid=frozenset({"a2"}))])
    [placed] = decision.assignments
    assert [agent for agent, _ in placed.placement] == ["a1", "a3"]


def test_it_waits_while_the_others_are_busy_and_takes_nothing_it_avoids() -> None:
    scheduler = _cluster()
    scheduler.schedule([Request("busy", 2, "cpu")])  # takes a1
    scheduler.schedule([Request("busy2", 2, "cpu")])  # takes a2
    decision = scheduler.schedule([Request("t", 2, "cpu", avoid=frozenset({"a3"}))])
    assert decision.assignments == []
    wait = decision.waiting["t"]
    assert (wait.kind, wait.message) == (
        "no_free_slots",
        "needs 2 CPU slots on agents other than a3 (its log_policies exclude them); none are free",
    )
    # A request that avoids nothing takes a3, and so does this one once a1 is free.
    scheduler.release("busy")
    [placed] = scheduler.schedule([Request("t", 2, "cpu", avoid=frozenset({"a3"}))]).assignments
    assert placed.placement == (("a1", (0, 1)),)


def test_with_every_agent_avoided_it_never_fits_and_says_so() -> None:
    scheduler = _cluster()
    avoid = frozenset({"a1", "a2", "a3"})
    decision = scheduler.schedule([Request("t", 1, "cpu", avoid=avoid)])
    assert decision.unschedulable == [
        (
            "t",
            "needs 1 CPU slot; its log_policies exclude every agent that could run it "
            "(a1, a2, a3): add an agent, or kill the trial",
        )
    ]
    # Too large for what is left: the usual reason, and which agents are left out.
    decision = scheduler.schedule([Request("t", 4, "cpu", avoid=frozenset({"a1", "a2"}))])
    [(_, why)] = decision.unschedulable
    assert why == (
        "needs 4 CPU slots; the cluster has 2 (1 agent) (besides a1, a2, which its "
        "log_policies exclude)"
    )
