"""A running trial's per-rank utilisation: from its agents' heartbeats, kept in the
master's memory, shown by the trial's describe route (GET /api/v1/trials/{id}) while it
runs; an agent speaks only for its own part of an allocation."""

from __future__ import annotations

from typing import Any

from assay.proto import agent_pb2, api_pb2, common_pb2
from tests.http.conftest import Site, site
from tests.master.conftest import ScriptedAgent, eventually

__all__ = ["site"]  # the fixture: a fresh master for one test


def _beat(agent: ScriptedAgent, *samples: common_pb2.RankUsage) -> None:
    agent.send(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(ranks=samples)))


def _ranks(site: Site, trial_id: int) -> list[dict[str, Any]]:
    reply = site.get(f"/api/v1/trials/{trial_id}")
    assert reply.status == 200, reply.body
    ranks: list[dict[str, Any]] = reply.json()["ranks"]
    return ranks


def test_the_trial_shows_each_ranks_latest_sample_while_it_runs(site: Site) -> None:
    port = site.master.port
    here = ScriptedAgent(port, "here", slots=2)
    other = ScriptedAgent(port, "other", slots=2)
    for agent in (here, other):
        agent.closed.set()  # no empty heartbeats: the test sends its own
    experiment = site.create(resources={"slots_per_trial": 2})
    [trial] = site.api.GetExperiment(api_pb2.GetExperimentRequest(id=experiment)).trials
    start = None
    for agent in (here, other):
        try:
            start = agent.next("start", timeout=2).start
            runner, idle = agent, ({here, other} - {agent}).pop()
            break
        except Exception:
            continue
    assert start is not None
    allocation = start.allocation_id
    assert _ranks(site, trial.id) == []  # running, but no heartbeat has said anything yet

    def sample(rank: int, cpu: float, allocation_id: str = allocation) -> common_pb2.RankUsage:
        return common_pb2.RankUsage(
            allocation_id=allocation_id,
            rank=rank,
            slot=rank,
            cpu_utilization=cpu,
            memory_rss_bytes=(rank + 1) * 2**20,
            agent_id="forged",
        )

    _beat(runner, sample(1, 0.9), sample(0, 1.5), sample(0, 7.0, "someone-elses"))
    _beat(idle, sample(0, 99.0))  # not its allocation: dropped
    eventually(lambda: len(_ranks(site, trial.id)) == 2)
    ranks = _ranks(site, trial.id)
    assert [(r["rank"], r["cpu_utilization"], r["agent_id"]) for r in ranks] == [
        (0, 1.5, runner.id),
        (1, 0.9, runner.id),
    ]
    assert ranks[1]["memory_rss_bytes"] == 2 * 2**20

    _beat(runner, sample(0, 0.5))  # a heartbeat replaces what the agent said before
    eventually(lambda: [r["cpu_utilization"] for r in _ranks(site, trial.id)] == [0.5])

    runner.exited(allocation, [0, 0])
    eventually(lambda: _ranks(site, trial.id) == [])  # over: nothing shown
    for agent in (here, other):
        agent.close()
