"""An agent's transitions: reconnecting with what it still runs, its part of a run ending
or being lost, being disabled, and the agent being given up on."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass

from assay.master.lifecycle._effects import (
    Adopt,
    DropAgent,
    Effect,
    FinishRun,
    Kill,
    KillUnknown,
    PartEnded,
    PartLost,
)
from assay.master.lifecycle._model import Run
from assay.master.lifecycle.run import stop_to_requeue


def part_on(runs: Mapping[str, Run], allocation_id: str, agent_id: str) -> Run | None:
    """The run of the allocation if a part of it runs on the agent (an agent speaks for
    its own parts only), else None."""
    run = runs.get(allocation_id)
    return run if run is not None and agent_id in run.agents else None


def disabled(agent_id: str, runs: Iterable[Run]) -> list[Effect]:
    """An admin disabled the agent without draining it: every run with a part there that
    is not stopping already stops at a checkpoint and requeues (as for a preemption), so
    its trial goes on elsewhere. A drain (`disable --drain`) lets them finish instead."""
    effects: list[Effect] = []
    for run in runs:
        if agent_id not in run.agents or agent_id in run.exit_codes or run.stopping is not None:
            continue
        effects += stop_to_requeue(run, f"stopped: agent {agent_id} was disabled")
    return effects


def reconcile(agent_id: str, running: Set[str], runs: Iterable[Run]) -> list[Effect]:
    """Match what a (re)registering agent runs with the runs the master expects of it."""
    effects: list[Effect] = []
    known: set[str] = set()
    for run in runs:
        known.add(run.allocation_id)
        if agent_id not in run.agents:
            continue
        if agent_id in run.exit_codes:
            if run.allocation_id in running:
                # Given up on while it was away, yet still running: it must not hold the
                # slots the master counts as free.
                effects.append(KillUnknown(agent_id, run.allocation_id))
            continue
        if run.allocation_id in running:
            if agent_id in run.awaiting:
                effects.append(Adopt(run.allocation_id, agent_id))
            if run.stopping is not None:
                effects.append(
                    Kill(run.allocation_id, graceful=run.stopping not in ("kill", "kill_trial"))
                )
        else:
            # The agent lost it (or it exited while nobody listened): not the user's doing.
            effects.append(PartLost(run.allocation_id, agent_id))
    effects += [KillUnknown(agent_id, a) for a in sorted(running - known)]
    return effects


def part_exited(
    run: Run, agent_id: str, exit_codes: Sequence[int], message: str = "", failure: str = ""
) -> list[Effect]:
    """An agent's part of `run` ended with these exit codes, one per rank (none: its
    processes could not start); the run ends when it was the last part. A report from an
    agent the run was not placed on, or about a part already gone, changes nothing: any
    holder of the join token could otherwise kill another agent's run."""
    if agent_id not in run.agents or agent_id in run.exit_codes:
        return []
    ended = PartEnded(run.allocation_id, agent_id, tuple(exit_codes), message, failure=failure)
    effects: list[Effect] = [ended]
    if (not exit_codes or any(c != 0 for c in exit_codes)) and run.stopping is None:
        # One part of the gang is gone: the other ranks cannot go on without it.
        effects.append(Kill(run.allocation_id, graceful=False))
    return effects + _finish_when_last(run, agent_id)


def part_lost(run: Run, agent_id: str) -> list[Effect]:
    """An agent lost its part of `run` (not the user's doing): the other parts are killed.

    Their agents keep the slots until they report the processes gone, so no new run is
    placed onto slots still in use."""
    effects: list[Effect] = [
        PartEnded(run.allocation_id, agent_id, lost=True),
        Kill(run.allocation_id, graceful=False),
    ]
    return effects + _finish_when_last(run, agent_id)


def _finish_when_last(run: Run, agent_id: str) -> list[Effect]:
    """`FinishRun` once `agent_id`'s part is recorded gone, if every other part is too."""
    over = all(a == agent_id or a in run.exit_codes for a in run.agents)
    return [FinishRun(run.allocation_id)] if over else []


@dataclass(frozen=True)
class AgentClock:
    """When the master last heard of an agent."""

    id: str
    connected: bool
    last_heartbeat: float  # wall clock, seconds
    disconnected_at: float | None  # monotonic


def reap(
    agents: Iterable[AgentClock],
    runs: Iterable[Run],
    *,
    now: float,
    wall: float,
    wait_s: float,
    heartbeat_s: float,
) -> list[Effect]:
    """Agents gone or silent for longer than the window, and runs a restarted master
    waited for in vain, are given up on."""
    # Silence: no message for the window, and for at least three heartbeats.
    silence = max(wait_s, 3 * heartbeat_s)
    effects: list[Effect] = []
    for agent in agents:
        if agent.connected and wall - agent.last_heartbeat > silence:
            why = f"sent nothing for {wall - agent.last_heartbeat:.0f} s: treating it as lost"
            effects.append(DropAgent(agent.id, why))
        elif agent.disconnected_at is not None and now - agent.disconnected_at > wait_s:
            effects.append(DropAgent(agent.id, f"did not come back in {wait_s:g} s"))
    for run in runs:
        if run.awaiting and now > run.deadline:
            why = "did not confirm it; requeued"
            effects += [PartLost(run.allocation_id, a, why) for a in sorted(run.awaiting)]
    return effects
