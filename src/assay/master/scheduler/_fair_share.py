"""Fair share: how many slots each group (experiment) should hold, and who goes first.

The rule, each scheduling round, for the slots of one slot type (one pool):

1. Every group with pending requests or held slots has a *demand*: the slots it holds
   plus those its pending requests ask for, capped by its `max_slots` and by the user
   quota.
2. The pool's slots are *water filled* by weight: each group is offered
   weight / (sum of the weights of groups still wanting) x the slots left; a group that
   wants less than that keeps its demand and gives the rest back to the others, and the
   offer is made again until every remaining group wants at least its offer. That offer
   is the group's `share` (Determined's fair-share scheduler, Slurm's fair-share factor
   with equal usage history).
3. Shares are rounded to whole slots, the *targets*, by largest remainder (ties: the
   group holding more, then the group id), so targets add up to the slots handed out.
4. Pending requests are considered group by group, the group furthest below its target
   first (then the lowest held/weight, then the best (priority, order) of its queue);
   within a group, by (priority, order). A group at or above its target still takes
   slots nobody below target could use (the pool is never left idle for fairness).
5. With preemption on, a request of a group that stays within its target once placed,
   and that does not fit, may stop allocations of groups that stay at or above their
   targets without them (`choose_share_victims`): no group is ever pushed below its
   target, so two groups never preempt each other back and forth.

With one-slot trials and every group wanting more than its share, each group converges
to its target, within one slot of its share; with larger trials, within one trial.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Mapping, Sequence

from assay.config import MAX_WEIGHT, MIN_WEIGHT
from assay.master.scheduler._placement import choose_agents
from assay.master.scheduler._preemption import Running, fewest_victims
from assay.master.scheduler._types import Request

_EPSILON = 1e-9


def water_fill(capacity: int, wants: Mapping[str, tuple[float, int]]) -> dict[str, float]:
    """Each group's share of `capacity` slots: `wants` maps group -> (weight, demand)."""
    shares = {group: 0.0 for group in wants}
    # Weights are clamped to [MIN_WEIGHT, MAX_WEIGHT] (as configs are checked): a stored
    # value from elsewhere can neither overflow the sum nor divide by zero.
    wants = {g: (min(max(w, MIN_WEIGHT), MAX_WEIGHT), d) for g, (w, d) in wants.items()}
    active = {group for group, (_, demand) in wants.items() if demand > 0}
    left = float(capacity)
    while active and left > _EPSILON:
        total = sum(wants[g][0] for g in active)
        satisfied = [g for g in active if wants[g][1] <= left * wants[g][0] / total + _EPSILON]
        if not satisfied:
            for group in active:
                shares[group] = left * wants[group][0] / total
            break
        for group in satisfied:
            shares[group] = float(wants[group][1])
            left -= wants[group][1]
            active.discard(group)
    return shares


def targets(shares: Mapping[str, float], held: Mapping[str, int]) -> dict[str, int]:
    """Shares rounded to whole slots by largest remainder; the sum is kept."""
    floors = {g: math.floor(s + _EPSILON) for g, s in shares.items()}
    total = round(sum(shares.values()))
    left = total - sum(floors.values())
    by_remainder = sorted(
        (g for g in shares if shares[g] - floors[g] > _EPSILON),
        key=lambda g: (-(shares[g] - floors[g]), -held.get(g, 0), g),
    )
    for group in by_remainder[: max(left, 0)]:
        floors[group] += 1
    return floors


def fair_order(
    pending: Sequence[Request],
    held: Mapping[str, int],
    goal: Mapping[str, int],
    weight: Callable[[str], float],
) -> Iterator[Request]:
    """Pending requests in fair-share order; reads `held` afresh after each one it
    yields, so the caller updates it as it places them (rule 4 of the module)."""
    queues: dict[str, list[Request]] = {}
    for request in sorted(pending, key=lambda r: r.rank, reverse=True):
        queues.setdefault(request.group, []).append(request)  # best rank last: pop()

    def key(group: str) -> tuple[int, float, tuple[int, int, str], str]:
        have = held.get(group, 0)
        return (have - goal.get(group, 0), have / weight(group), queues[group][-1].rank, group)

    heap = [key(group) for group in queues]
    heapq.heapify(heap)
    while heap:
        group = heapq.heappop(heap)[-1]
        queue = queues[group]
        yield queue.pop()
        if queue:  # only this group's key can have changed
            heapq.heappush(heap, key(group))


def choose_share_victims(
    request: Request,
    running: Sequence[Running],
    free: Mapping[str, int],
    goal: Mapping[str, int],
    held: Mapping[str, int],
) -> list[str] | None:
    """Allocations to stop so that `request` fits, taken only from groups that stay at
    or above their targets without them; None if the request's group would go past its
    own target, or if no such set makes room. [] if it fits already.

    Victims come from the group furthest above its target first, newest first.
    """
    if held.get(request.group, 0) + request.slots > goal.get(request.group, 0):
        return None
    if choose_agents(request.slots, free.items()) is not None:
        return []
    left = dict(held)
    room = dict(free)
    candidates = sorted(
        (r for r in running if r.group != request.group),
        key=lambda r: (goal.get(r.group, 0) - held.get(r.group, 0), -r.order, r.request_id),
    )
    victims: list[str] = []
    for candidate in candidates:
        size = sum(len(slots) for _, slots in candidate.placement)
        if left.get(candidate.group, 0) - size < goal.get(candidate.group, 0):
            continue
        parts = [(a, len(s)) for a, s in candidate.placement if a in room]
        if not parts:
            continue  # its slots are of another type or on a disabled agent
        for agent_id, count in parts:
            room[agent_id] += count
        left[candidate.group] = left.get(candidate.group, 0) - size
        victims.append(candidate.request_id)
        if choose_agents(request.slots, room.items()) is not None:
            return fewest_victims(request, victims, running, free)
    return None
