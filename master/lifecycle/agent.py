"""An agent's transitions: reconnecting with what it still runs, and being given up on."""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass

from assay.master.lifecycle._effects import (
    Adopt,
    DropAgent,
    Effect,
    Kill,
    KillUnknown,
    PartLost,
)
from assay.master.lifecycle._model import Run


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
                effects.append(Kill(run.allocation_id, graceful=run.stopping != "kill"))
        else:
            # The agent lost it (or it exited while nobody listened): not the user's doing.
            effects.append(PartLost(run.allocation_id, agent_id))
    effects += [KillUnknown(agent_id, a) for a in sorted(running - known)]
    return effects


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
