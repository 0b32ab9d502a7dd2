"""Which running allocations to stop so a higher-priority request fits (pure arithmetic).

Used when the master runs with preemption on: a pending request that would fit an idle
cluster but not the current one may take slots from allocations of strictly lower
priority (a larger number). The victims are asked to checkpoint and stop; they are
requeued and resume from that checkpoint later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from assay.master.scheduler._placement import choose_agents
from assay.master.scheduler._types import Placement, Request


@dataclass(frozen=True)
class Running:
    """An allocation as preemption sees it."""

    request_id: str
    priority: int
    order: int
    placement: Placement
    group: str = ""


def choose_victims(
    request: Request, running: Sequence[Running], free: Mapping[str, int]
) -> list[str] | None:
    """The fewest lowest-priority allocations whose slots would let `request` fit.

    `free` maps each enabled agent of the request's slot type to its free slots. Victims
    are taken lowest priority first, then newest first (the least work lost, and the
    order Kubernetes' scheduler prefers); None if even all of them would not make room.
    Returns [] if the request fits already.
    """
    room = dict(free)
    if choose_agents(request.slots, room.items()) is not None:
        return []
    lower = sorted(
        (r for r in running if r.priority > request.priority),
        key=lambda r: (-r.priority, -r.order, r.request_id),
    )
    victims: list[str] = []
    for candidate in lower:
        gained = False
        for agent_id, slots in candidate.placement:
            if agent_id in room:
                room[agent_id] += len(slots)
                gained = True
        if not gained:
            continue  # its slots are of another type or on a disabled agent
        victims.append(candidate.request_id)
        if choose_agents(request.slots, room.items()) is not None:
            return fewest_victims(request, victims, running, free)
    return None


def fewest_victims(
    request: Request, victims: list[str], running: Sequence[Running], free: Mapping[str, int]
) -> list[str]:
    """Drop victims (earliest picked first) whose slots turn out not to be needed."""
    by_id = {r.request_id: r for r in running}
    kept = list(victims)
    for victim in list(victims):
        trial = [v for v in kept if v != victim]
        room = dict(free)
        for request_id in trial:
            for agent_id, slots in by_id[request_id].placement:
                if agent_id in room:
                    room[agent_id] += len(slots)
        if choose_agents(request.slots, room.items()) is not None:
            kept = trial
    return kept
