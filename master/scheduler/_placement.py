"""Where a gang of slots goes, as arithmetic on (agent id, free slot count) pairs."""

from __future__ import annotations

from collections.abc import Iterable


def choose_agents(slots: int, free: Iterable[tuple[str, int]]) -> list[tuple[str, int]] | None:
    """Pick agents for `slots` slots from `free` (agent id, free count); None if none fit.

    One agent if any can hold them all: the one with the fewest free slots that still
    fits (best fit, so large holes stay open for large requests; ties by id). Otherwise
    the smallest k >= 2 that divides `slots` and has k agents with slots/k free each,
    again preferring the fullest agents; every chosen agent gives the same number of
    slots, so each distributed worker gets an equal share. Returns (agent id, count)
    pairs sorted by agent id.
    """
    ordered = sorted(free, key=lambda pair: (pair[1], pair[0]))
    for k in range(1, min(slots, len(ordered)) + 1):
        if slots % k:
            continue
        share = slots // k
        fitting = [agent for agent, count in ordered if count >= share][:k]
        if len(fitting) == k:
            return sorted((agent, share) for agent in fitting)
    return None


def largest_placement(capacities: Iterable[int]) -> int:
    """The most slots one request can get from agents with these free counts (0 if none).

    With k agents a request gets at most k times the k-th largest count, and exactly that
    many fits, so the answer is the best k.
    """
    descending = sorted(capacities, reverse=True)
    return max((k * count for k, count in enumerate(descending, start=1)), default=0)
